"""The parts of long runs that need no training run: the step record's bounded format and what a crash
leaves of it, the request file every rank follows, the slowdown watch, the plan of windows, and the
run-level measures on synthetic records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis, nearby_median
from gpuadvise.analyzer.read.steprecord import load_step_record
from gpuadvise.harness.windows.requests import REQUESTS, Requests, append
from gpuadvise.harness.windows.slowwatch import SlowWatch
from gpuadvise.harness.steps.record import StepRecord, bucket_width
from gpuadvise.harness.windows.plan import Plan


# -- the step record ---------------------------------------------------------------------------------------

def _record(path, steps: int, ms=lambda n: 2.0 + (n % 7) * 0.01, exact: int = 1000) -> StepRecord:
    rec = StepRecord(path, exact_steps=exact, flush_s=1e9)
    for n in range(1, steps + 1):
        rec.add(n, "active" if 4 <= n <= 6 else "after", ms(n), None)
        if rec.wants_memory(n):
            rec.sample(n, 1000 + n, None, None)
    rec.close()
    return rec


def test_the_step_record_stays_bounded_on_a_long_run(tmp_path):
    # 300 000 steps: exact up to 1 000, then buckets 10, 100, 1 000 steps wide (900 lines per tenfold)
    path = tmp_path / "steps.jsonl"
    _record(path, 300_000, ms=lambda n: 5.0 if n % 997 == 0 else 2.0)
    lines = path.read_text().splitlines()
    assert len(lines) < 2_200 and path.stat().st_size < 400_000
    r = load_step_record(path)
    assert r.steps == 300_000 and r.last_step == 300_000 and len(r.number) == 999
    assert [bucket_width(n) for n in (999, 1_000, 10_000, 100_000)] == [1, 10, 100, 1_000]
    assert all(b.median_ms == 2.0 for b in r.buckets)
    # a bucket's slowest step is named: a stall every 997 steps shows up where it was
    assert any(b.max_step == 997 * 150 and b.max_ms == 5.0 for b in r.buckets)
    assert len(r.mem_step) == len(r.buckets) + 999 // 5 and r.mem_rss[-1] == 1000 + 300_000  # one per bucket


def test_a_record_cut_by_a_crash_reads_up_to_the_cut(tmp_path):
    path = tmp_path / "steps.jsonl"
    rec = StepRecord(path, flush_s=0.0)
    for n in range(1, 51):
        rec.add(n, "wait" if n < 3 else "after", 3.0, None)
        rec.tick()  # written as it goes, as at each step boundary
    with open(path, "a") as fh:
        fh.write('{"first":51,"phase":"nn","cpu":[3.0,')  # killed while writing a line
    r = load_step_record(path)
    assert r.last_step == 50 and r.damaged_lines == 1
    steps, ms = r.unprofiled()
    assert steps[0] == 3 and list(ms) == [3.0] * 48


def test_a_file_that_is_not_a_step_record_is_refused(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps({"traceEvents": []}) + "\n")
    with pytest.raises(InputError, match="not a gpuadvise step record"):
        load_step_record(path)


def test_unprofiled_steps_leave_out_the_windows_and_the_step_after_each(tmp_path):
    path = tmp_path / "steps.jsonl"
    rec = StepRecord(path, flush_s=1e9)
    phases = ["wait"] * 3 + ["warmup", "active", "active"] + ["after"] * 4
    for n, p in enumerate(phases, start=1):
        rec.add(n, p, float(n), None)
    rec.close()
    steps, _ = load_step_record(path).unprofiled()
    assert list(steps) == [3, 8, 9, 10]  # 1-2 settle, 4-6 profiled, 7 follows the export


# -- the request file every rank follows ----------------------------------------------------------------

def test_a_request_from_one_rank_names_the_same_steps_on_every_rank(tmp_path):
    r0, r1 = Requests(tmp_path, 0, is_distributed=True), Requests(tmp_path, 1, is_distributed=True)
    r1.post(30, "signal")  # rank 1 was signalled at its step 30
    assert r0.poll(31) == []  # the file is read every few steps, not at each
    got0, got1 = r0.poll(32), r1.poll(32)
    assert [r.step for r in got0] == [r.step for r in got1] == [30 + r1.lead]
    assert r0.poll(36) == [] and r1.poll(36) == []  # each request once


def test_a_request_without_a_step_is_resolved_once_for_every_rank(tmp_path):
    r0, r1 = Requests(tmp_path, 0, is_distributed=True), Requests(tmp_path, 1, is_distributed=True)
    append(tmp_path, {"id": "abc", "step": None, "trigger": "trigger file"})
    got1 = r1.poll(44)  # rank 1, a step ahead, reads it first and gives it a step
    # rank 0 resolved it at the same moment, from its own step (the race two appends can have)
    append(tmp_path, {"id": "abc", "step": 40 + r0.lead, "trigger": "trigger file"})
    got0 = r0.poll(40)
    assert [r.step for r in got0] == [r.step for r in got1] == [44 + r1.lead]  # the first line written wins
    lines = [json.loads(x) for x in (tmp_path / REQUESTS).read_text().splitlines()]
    assert [x["step"] for x in lines] == [None, 44 + r1.lead, 40 + r0.lead]  # rank 0 added no third answer


def test_a_single_process_starts_the_window_at_the_next_step(tmp_path):
    r = Requests(tmp_path, None, is_distributed=False)
    r.post(17, "slower")
    assert [x.step for x in r.poll(17, force=True)] == [18]


# -- the slowdown watch ------------------------------------------------------------------------------------

def _feed(watch: SlowWatch, times: dict[int, float]) -> list:
    fired = []
    for n, ms in sorted(times.items()):
        watch.observe(n, ms)
        seen = watch.check()
        if seen is not None:
            fired.append((n, seen))
    return fired


def test_a_drift_fires_once_when_the_run_settles_at_the_slow_level():
    times = {n: 10.0 if n < 60 else 40.0 for n in range(3, 200)}
    fired = _feed(SlowWatch(50, k=10), times)
    assert [s.kind for _, s in fired] == ["slower"] and 60 < fired[0][0] < 75
    assert "above the early median (10.00 ms" in fired[0][1].detail


def test_a_run_that_keeps_slowing_down_fires_again():
    times = {n: 10.0 * (1 + (n >= 60) + 2 * (n >= 120)) for n in range(3, 200)}
    kinds = [s.kind for _, s in _feed(SlowWatch(50, k=10), times)]
    assert kinds == ["slower", "slower"]


def test_a_periodic_stall_predicts_the_next_one_even_when_a_window_hid_one():
    times = {n: 10.0 + (30.0 if n % 20 == 0 else 0.0) for n in range(3, 200)}
    del times[60]  # step 60 fell in a profiled window: unseen
    fired = [(n, s) for n, s in _feed(SlowWatch(100, k=10), times) if s.kind == "stall"]
    assert len(fired) == 1 and fired[0][1].at_step == fired[0][0] + 20 and "every 20 steps" in fired[0][1].detail


def test_jitter_and_a_stall_seen_at_normal_speed_make_no_period():
    rng = np.random.default_rng(0)
    times = {n: 10.0 + float(rng.uniform(0, 3)) for n in range(3, 300)}
    for n in (40, 60, 100, 140):  # 80 and 120 ran at normal speed: no period of 20
        times[n] = 45.0
    assert [s for _, s in _feed(SlowWatch(100, k=10), times) if s.kind == "stall"] == []


# -- the plan of windows -----------------------------------------------------------------------------------

def test_windows_never_overlap_and_automatic_ones_are_capped():
    plan = Plan(first_start=10, warmup=1, active=3, earliest_later=17, max_auto=1)
    assert plan.add(5, k=3, trigger="signal").start == 17  # after window 1 and its memory history
    assert plan.add(18, k=4, trigger="slower", automatic=True) is None  # overlaps window 2: recorded anyway
    assert plan.add(40, k=30, trigger="every", automatic=True).start == 40
    assert plan.add(60, k=50, trigger="every", automatic=True) is None and "--max-windows" in plan.notes[0]
    assert [w.index for w in plan.windows] == [1, 2, 3] and plan.phase(18) == "active" and plan.phase(21) is None


def test_the_schedule_leaves_the_last_windows_to_evidence():
    # --every 20 and --when-slower with --max-windows 4: the schedule gets two, a new level and a stall the rest
    plan = Plan(first_start=2, warmup=1, active=2, earliest_later=6, max_auto=4, kept_for_evidence=2)
    every = [plan.add(k + 1, k=k, trigger="every", automatic=True) for k in (20, 40, 60, 80)]
    assert [w is not None for w in every] == [True, True, False, False]
    assert "kept for --when-slower" in plan.notes[0]
    assert plan.add(91, k=90, trigger="slower", automatic=True) is not None
    assert plan.add(111, k=110, trigger="stall", automatic=True) is not None
    assert plan.add(131, k=130, trigger="stall", automatic=True) is None  # the cap still holds


def test_the_budget_goes_to_a_recurring_stall_rather_than_to_a_drift_seen_again():
    # the step doubles at 60 and again at 120, and from step 150 a stall every 25 steps: with --max-windows 2,
    # the first new level and the stall are recorded, not the same drift twice; run.json says why each
    times = {n: 10.0 * (1 + (n >= 60) + 2 * (n >= 120)) + (100.0 if n >= 150 and n % 25 == 0 else 0.0)
             for n in range(3, 320)}
    plans = {}
    for kept in (0, 2):  # 0: the budget as it was with --when-slower alone, first come first served
        plan = plans[kept] = Plan(first_start=2, warmup=1, active=2, earliest_later=6, max_auto=2,
                                  kept_for_evidence=kept)
        for n, seen in _feed(SlowWatch(50, k=10), times):
            plan.add((seen.at_step - 2) if seen.at_step else n + 1, k=n, trigger=seen.kind, detail=seen.detail,
                     automatic=True)
    assert [w.trigger for w in plans[0].later()] == ["slower", "slower"]
    assert plans[0].later()[1].as_dict()["reason"].endswith(", again (window 2 recorded the first)")
    later = [w.as_dict() for w in plans[2].later()]
    assert [w["trigger"] for w in later] == ["slower", "stall"]
    assert later[0]["reason"].startswith("a new regime") and later[1]["reason"].startswith("a recurring stall")
    assert later[1]["steps"][1] == 250  # the stall its period predicts, in the window's last recorded step
    assert "a repeat of window 2's evidence" in plans[2].notes[0] and "a recurring stall" in plans[2].notes[0]


def test_the_schedule_follows_every_window():
    pytest.importorskip("torch")
    from torch.profiler import ProfilerAction as A

    plan = Plan(first_start=2, warmup=1, active=2, earliest_later=6, max_auto=5)
    plan.add(8, k=6, trigger="signal")
    assert [plan.schedule(k) for k in range(1, 12)] == [A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE,
                                                        A.NONE, A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE]


# -- run-level measures --------------------------------------------------------------------------------------

def _analysis(tmp_path, ms: dict[int, float], k: int = 10, name: str = "steps.jsonl") -> RunAnalysis:
    path = tmp_path / name
    rec = StepRecord(path, flush_s=1e9)
    for n, v in sorted(ms.items()):
        rec.add(n, "after", v, None)
    rec.close()
    return RunAnalysis(record=load_step_record(path), k=k)


def test_a_jump_is_dated_to_its_step_and_a_ramp_to_where_it_took_off(tmp_path):
    jump = _analysis(tmp_path, {n: 2.0 if n < 70 else 5.0 for n in range(1, 150)}, name="jump.jsonl").levels
    assert jump.began_at == 70 and jump.early_ms == 2.0 and jump.slow_ms == 5.0 and jump.shape == "step"
    ramp = _analysis(tmp_path, {n: 2.0 if n < 50 else 2.0 + 0.05 * (n - 50) for n in range(1, 150)},
                     name="ramp.jsonl").levels
    # the climb left its early level at step 50, not where it crossed a threshold; it never came back
    assert abs(ramp.began_at - 50) <= 2 and ramp.shape == "climb" and ramp.until is None
    assert ramp.early_ms == 2.0 and ramp.slow_steps[1] == 149


def test_the_run_summary_states_how_closely_the_onset_is_dated(tmp_path):
    from gpuadvise.analyzer.report.longrun import headline
    from gpuadvise.analyzer.run.longrun import summarize

    rng = np.random.default_rng(4)
    noisy = _analysis(tmp_path, {n: 10.0 + float(rng.normal(0, 0.5)) + (0.04 * (n - 80) if n >= 80 else 0.0)
                                 for n in range(1, 240)}, k=20)
    summary = summarize(noisy)
    lv = summary["levels"]
    low, high = lv["began_between"]
    assert lv["shape"] == "climb" and low <= 80 <= high and low < lv["began_at"] < high
    assert (f"a steady climb from step {lv['began_at']} (dated to steps {low}–{high} by every growth law that fits)"
            in headline(summary))


def test_a_level_reaches_only_steps_nearby():
    steps = np.array([1, 2, 3, 4, 5, 40, 41, 42, 43, 44], dtype=float)
    values = np.array([1, 1, 1, 1, 1, 9, 9, 9, 9, 9], dtype=float)
    assert list(nearby_median(steps, values, 5)) == [1.0] * 5 + [9.0] * 5  # the gap pulls nothing across


# -- compare and a long run's folder -----------------------------------------------------------------------

def test_compare_reads_a_long_run_by_its_first_window(tmp_path):
    from gpuadvise.analyzer.compare.diff import compare
    from gpuadvise.analyzer.compare.load import load_side
    from gpuadvise.rules import find_rule

    folder = find_rule("step-time-drift").positive().write(tmp_path / "run")
    side = load_side(str(folder), jobs=1)
    cmp = compare(side, side)
    assert cmp["before"]["trace"].endswith("trace.pt.trace.json.gz") and cmp["before"]["traces"] == 1
    assert not any("traces" in w for w in cmp["warnings"])  # window 2 is not a second rank
    still = {f["rule"] for f in cmp["findings"]["still_there"]}
    assert "GA160" in still  # the run-level finding is compared like any other


# -- windows over the run: their own regime, and each finding once -------------------------------------------

def _straddling_run(tmp_path):
    from gpuadvise.fixtures.longrun import RunFolder, Window, trace_for

    ms = {n: 2.0 if n < 60 else 6.0 for n in range(1, 131)}  # the step jumps at step 60
    w1, w2 = Window(1, "schedule", start=3), Window(2, "slower", start=58)  # window 2 records steps 59–61
    for w in (w1, w2):
        b = trace_for(w)
        for _ in range(3):
            with b.step():
                b.cpu("aten::addmm", 1_500.0)
        w.trace = b
    return RunFolder(ms, [w1, w2]).write(tmp_path / "run")


def test_a_window_straddling_the_change_is_measured_against_its_own_side(tmp_path):
    from gpuadvise.analyzer.run.engine import analyze_paths

    reports = analyze_paths([str(_straddling_run(tmp_path))], jobs=1)
    w2 = next(r for r in reports if "trace.w2" in r.source)
    # its neighbours: ten steps of 2 ms before the jump, nine of 6 ms after; its recorded steps mostly after
    # (the jump fell in steps the window hid: placed between the last step seen before it and the first after)
    facts = reports.facts[w2.source]["steps"]
    assert facts["unprofiled_median_ms"] == 6.0 and "after the change at step 63 (between steps 57 and 63)" in facts["regime"]
    assert facts["overhead_x"] == 1.0  # not "the profiler made the steps 3× slower"
    run = reports.long_runs[0]
    assert [w["level_ms"] for w in run.summary["windows"]] == [2.0, 6.0]


@pytest.fixture(scope="module")
def drift_fixture_reports(tmp_path_factory):
    """step-time-drift's positive fixture analysed: two windows, the DataLoader finding in both."""
    from gpuadvise.analyzer.run.engine import analyze_paths
    from gpuadvise.rules import find_rule

    folder = find_rule("step-time-drift").positive().write(tmp_path_factory.mktemp("drift") / "run")
    return analyze_paths([str(folder)], jobs=1)


def test_a_finding_in_every_window_is_stated_once_with_the_windows_it_holds_in(drift_fixture_reports):
    from gpuadvise.analyzer.model.report import all_findings

    reports = drift_fixture_reports
    found = [f for f in all_findings(reports) if f.rule != "GA160"]
    assert len(found) == len({(f.rule, f.topic) for f in found})  # each cause once
    loader = next(f for f in found if f.topic == "dataloader-stall")
    # kept where its fix saves most (window 2, the slow steps), saying where else it holds and how it grew
    assert "trace.w2" in loader.trace and "Windows 1, 2 of this run show it" in loader.message
    # window 1's waits are shorter than the hand-over of a batch from a worker (dataloader-stall): nothing to save
    assert "from 0 % in window 1 to 36 % in window 2" in loader.message
    causes = {c["topic"]: c for c in reports.long_runs[0].summary["causes"]}
    assert [w["index"] for w in causes["dataloader-stall"]["windows"]] == [1, 2]
    assert causes["dataloader-stall"]["kept_in"] == 2


def test_the_run_report_tables_each_causes_saving_window_by_window(drift_fixture_reports):
    from gpuadvise.analyzer.report.formats import render

    reports = drift_fixture_reports
    held = {c["topic"]: c["windows"] for c in reports.long_runs[0].summary["causes"]}["dataloader-stall"]
    steps = [f"{w['steps'][0]}–{w['steps'][1]}" for w in held]
    md = render(reports, "md")
    table = md[md.index("| Cause | Window | Steps | Predicted saving of its fix |"):].split("\n\n")[0].splitlines()
    rows = [r for r in table[2:] if r.split("|")[2].strip().rstrip(" *") in ("1", "2")]
    loader = rows[[i for i, r in enumerate(rows) if "dataloader-stall" in r][0]:][:2]
    # one row per window the cause holds in, its steps and its fix's saving there; the window whose figures
    # the finding states is marked
    assert [r.split("|")[2:5] for r in loader] == [[" 1 ", f" {steps[0]} ", " none predicted "],
                                                   [" 2 * ", f" {steps[1]} ", " 36 % of the step "]]
    text = render(reports, "text")
    line = next(x for x in text.splitlines() if "(dataloader-stall):" in x)
    assert f"window 1 (steps {steps[0]}) none predicted; window 2* (steps {steps[1]}) 36 % of the step" in line
    assert "'" not in line and "{" not in line  # words, not Python reprs

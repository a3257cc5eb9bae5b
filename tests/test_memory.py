"""Memory: safe snapshot reading, the metrics (hand-computed), the rules' edges, run folders, the
renderers, and the real snapshots and `[memory]` traces of the corpus."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from _cli_support import REPO, call_main, run_cli
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model, analyze_snapshot
from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.measure.memory import NO_SITE, replay_history, segment_state, summarize, trace_memory
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.read.snapshot import load_snapshot
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.snapshot import GiB, MiB, SnapshotBuilder, free, live
from gpuadvise.rules import find_rule

MEMORY_TOPICS = {"memory-fragmentation", "allocator-churn", "memory-pressure", "memory-headroom"}
GEMM = "ampere_tf32_s1688gemm_64x64_nn"


def topics(report) -> set[str]:
    return {f.topic for f in report.findings}


# ----------------------------------------------------------------------------------------------------
# A snapshot is untrusted: no pickle code ever runs


class _RunsShell:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Evals:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _Plain:
    """An ordinary class instance: harmless here, but a snapshot never holds one."""

    def __init__(self):
        self.size = 1


def _evil_payloads(marker: Path) -> dict[str, bytes]:
    return {
        "reduce-os-system": pickle.dumps({"segments": [], "x": _RunsShell(marker)}),
        "reduce-os-system-protocol0": pickle.dumps(_RunsShell(marker), protocol=0),
        "builtins-eval": pickle.dumps({"segments": [_Evals(marker)]}),
        # hand-written protocol 0: GLOBAL builtins.eval, called on a string (no class involved)
        "builtins-eval-opcodes": b"cbuiltins\neval\n(V__import__('os').system('touch " + str(marker).encode() + b"')\ntR.",
        "class-instance": pickle.dumps({"segments": [_Plain()]}),
    }


@pytest.mark.parametrize("kind", ["reduce-os-system", "reduce-os-system-protocol0", "builtins-eval",
                                  "builtins-eval-opcodes", "class-instance"])
def test_code_carrying_pickle_is_refused_and_never_runs(tmp_path, kind):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(_evil_payloads(marker)[kind])
    with pytest.raises(InputError) as err:
        load_snapshot(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    assert "refusing to load" in msg and "plain data" in msg
    assert not marker.exists()


def test_the_payload_really_is_live(tmp_path):
    """Control: the same bytes through an unrestricted pickle.loads do run (so the test above means something)."""
    marker = tmp_path / "pwned"
    pickle.loads(_evil_payloads(marker)["reduce-os-system"])
    assert marker.exists()


@pytest.mark.slow
def test_cli_refuses_a_code_carrying_snapshot_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(_evil_payloads(marker)["reduce-os-system"])
    run = run_cli("analyze", evil, cwd=tmp_path)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuadvise: error:") and "evil.pickle" in lines[0], run.stderr
    assert "Traceback" not in run.stderr
    assert not marker.exists()


def test_code_carrying_snapshot_in_a_run_folder_is_refused(tmp_path, capsys):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run.mkdir()
    TraceBuilder().write(run / "trace.json.gz")
    (run / "memory.pickle").write_bytes(_evil_payloads(marker)["builtins-eval"])
    rc, out, err = call_main(capsys, "analyze", run)
    assert rc == 2 and "memory.pickle" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize("data, why", [
    (pickle.dumps([1, 2, 3]), "no 'segments'"),
    (pickle.dumps({"segments": "not a list"}), "no 'segments'"),
    (pickle.dumps({"segments": []})[:-3], "not a readable memory snapshot"),
    (b"", "empty file"),
    (b"\x80\x05not a pickle at all", "snapshot"),
])
def test_not_a_snapshot_is_an_input_error(tmp_path, data, why):
    path = tmp_path / "x.pickle"
    path.write_bytes(data)
    with pytest.raises(InputError, match=why):
        load_snapshot(path)


def test_malformed_fields_do_not_crash(tmp_path):
    """Plain data of the wrong shape is read defensively: odd fields count as zero, never a crash."""
    snap = {"segments": [{"total_size": "big", "blocks": [{"size": None, "state": 3}, "junk"]}, 7,
                         {"total_size": 10 * MiB, "blocks": [{"size": 10 * MiB, "requested_size": True, "state": "active_allocated"}]}],
            "device_traces": [[{"action": "alloc", "size": "x"}, {"no": "action"}, 5,
                               {"action": "alloc", "size": 10**400, "time_us": float("inf")}]],
            "allocator_settings": ["not", "a", "dict"]}
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(snap))
    report = analyze_paths([str(path)])[0]
    assert report.memory.snapshot.reserved == 10 * MiB
    assert not any("failed" in n for n in report.notes), report.notes
    for fmt in ("text", "md", "json"):
        assert _render([report], fmt)


# ----------------------------------------------------------------------------------------------------
# Snapshot metrics, computed by hand


def _three_segments() -> SnapshotBuilder:
    b = SnapshotBuilder()
    b.segment(live(60 * MiB, requested=59 * MiB), free(40 * MiB))  # partly used: 40 MiB stranded
    b.segment(free(50 * MiB))  # empty: cache
    b.segment(live(10 * MiB), free(5 * MiB), live(5 * MiB, requested=4 * MiB))  # 5 MiB stranded
    return b


def test_segment_state_by_hand():
    s = segment_state(_three_segments().to_dict())
    assert s.reserved == 170 * MiB
    assert s.allocated == (59 + 10 + 4) * MiB  # requested bytes of live blocks
    assert s.internal_free == 2 * MiB  # 1 MiB rounding in two blocks
    assert s.external_free == (40 + 50 + 5) * MiB
    assert s.reserved == s.allocated + s.internal_free + s.external_free  # segsum's identity
    assert s.stranded == 45 * MiB and s.stranded_blocks == 2 and s.partly_used_segments == 2
    assert s.empty_segment_bytes == 50 * MiB
    assert s.largest_free_block == 50 * MiB and s.largest_request == 59 * MiB
    assert s.segments == 3
    assert s.slack_pct == pytest.approx(100 * 97 / 170)
    assert s.stranded_pct == pytest.approx(100 * 45 / 170)
    assert [seg["stranded_mib"] for seg in s.largest_segments] == [40.0, 5.0]


def _with_history(timed: bool = True) -> SnapshotBuilder:
    b = _three_segments()
    b.timed = timed
    b.segment_alloc(100 * MiB)
    b.alloc(60 * MiB, site=("/home/me/train.py", 10, "forward"))
    a2 = b.alloc(30 * MiB, site=("/home/me/train.py", 20, "forward"))
    b.free(a2)
    b.segment_free(50 * MiB)  # release ...
    b.segment_alloc(50 * MiB)  # ... and re-allocate: cycle 1
    b.segment_free(20 * MiB)
    b.segment_free(20 * MiB)
    b.segment_alloc(20 * MiB)  # cycle 2
    b.oom(200 * MiB, device_free=10 * MiB)
    return b


def test_history_replay_by_hand():
    snap = _with_history().to_dict()
    h = replay_history(snap, segment_state(snap))
    # final live block bytes are 75 MiB and the history adds +60 +30 −30: it starts at 15 MiB
    assert h.peak_allocated == (15 + 60 + 30) * MiB
    # final reserved 170 MiB, history +100 −50 +50 −20 −20 +20 = +80: it starts at 90, peaks at 190
    assert h.peak_reserved == 190 * MiB
    assert h.reserved_at_peak == 190 * MiB
    assert h.unused_at_peak_pct == pytest.approx(100 * 85 / 190)
    assert [row[1:] for row in h.timeline][:3] == [[15 * MiB, 190 * MiB], [75 * MiB, 190 * MiB], [105 * MiB, 190 * MiB]]
    assert (h.segment_allocs, h.segment_frees, h.release_cycles) == (3, 3, 2)
    assert h.reallocated_bytes == 70 * MiB
    assert [(r["segments"], r["bytes"]) for r in h.releases] == [(1, 50 * MiB), (2, 40 * MiB)]
    assert h.ooms == [{"requested_bytes": 200 * MiB, "device_free_bytes": 10 * MiB, "at": pytest.approx(h.ooms[0]["at"]),
                       "site": None}]
    assert h.actions["alloc"] == 2 and h.actions["oom"] == 1
    assert h.timed and h.timeline_unit == "s" and h.span_s == pytest.approx(0.001)
    # sites by what they held at the allocation peak (the freed 30 MiB still counts: it was live then)
    assert h.top_sites[0] == {"name": "home/me/train.py:10 (forward)", "allocs": 1, "allocated_mib": 60.0,
                              "live_at_peak_mib": 60.0}
    assert h.top_sites[1]["live_at_peak_mib"] == 30.0


def test_old_history_format_without_time_us():
    snap = _with_history(timed=False).to_dict()
    assert all("time_us" not in e for e in snap["device_traces"][0])
    h = replay_history(snap, segment_state(snap))
    assert not h.timed and h.span_s is None and h.timeline_unit == "entry"
    assert h.peak_allocated == 105 * MiB  # the same replay, indexed by entry


def test_sites_without_python_frames():
    b = SnapshotBuilder()
    b.segment(live(MiB))
    b.event("alloc", MiB, 1, frames=[{"filename": "??", "line": 0, "name": "c10::cuda::malloc"}])
    h = replay_history(b.to_dict(), segment_state(b.to_dict()))
    assert h.top_sites[0]["name"] == NO_SITE


def test_allocator_settings_and_summary_dict():
    b = _with_history()
    b.settings["expandable_segments"] = True
    mem = summarize(b.to_dict())
    assert mem.allocator_settings["expandable_segments"] is True
    assert mem.sources == ["snapshot", "history"]
    assert mem.peak_allocated == 105 * MiB and mem.ooms == 1 and mem.capacity is None
    d = json.loads(json.dumps(mem.to_dict()))
    assert d["snapshot"]["stranded"] == 45 * MiB and d["history"]["release_cycles"] == 2
    assert d["trace"] is None and d["counters"] is None


# ----------------------------------------------------------------------------------------------------
# [memory] events, allocator calls, memory_stats


def _memory_trace(points, device_type_0_noise=True) -> dict:
    b = TraceBuilder()
    for alloc, res in points:
        with b.step():
            b.memory(MiB, alloc, res)
            b.kernel(GEMM, 500)
            b.sync()
    b.finish()
    d = b.to_dict()
    if device_type_0_noise:  # CPU memory events (Device Type 0) are not GPU memory
        d["traceEvents"].append({"ph": "i", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4242, "ts": 2_000,
                                 "args": {"Device Type": 0, "Device Id": -1, "Bytes": 8, "Total Allocated": 500 * GiB,
                                          "Total Reserved": 0}})
    return d


def test_trace_memory_events(load_built):
    model = load_built(_memory_trace([(2 * GiB, 3 * GiB), (5 * GiB, 6 * GiB), (4 * GiB, 8 * GiB)]))
    tm = trace_memory(model, compute(model))
    assert tm.events == 3 and tm.device == 0
    assert tm.peak_allocated == 5 * GiB and tm.reserved_at_peak == 6 * GiB
    assert tm.peak_reserved == 8 * GiB and tm.max_gap == 4 * GiB
    assert tm.mallocs == tm.frees == 0
    assert len(tm.timeline) == 3


def test_hip_device_type_counts_as_gpu_memory(load_built):
    """Some ROCm builds tag GPU memory events Device Type 6 (c10's HIP), not 1."""
    d = _memory_trace([(2 * GiB, 3 * GiB)], device_type_0_noise=False)
    for e in d["traceEvents"]:
        if e.get("name") == "[memory]":
            e["args"]["Device Type"] = 6
    tm = trace_memory(load_built(d))
    assert tm.events == 1 and tm.peak_allocated == 2 * GiB


def test_allocator_calls_inside_steps(load_built):
    model = load_built(find_rule("allocator-churn").positive())
    tm = trace_memory(model, compute(model))
    assert tm.iteration_kind == "ProfilerStep" and tm.iterations == 4
    assert (tm.mallocs_in_iterations, tm.frees_in_iterations, tm.iterations_with_frees) == (4, 4, 4)
    assert tm.allocator_ms_in_iterations == pytest.approx(4 * (0.3 + 0.8))


def test_iterations_from_optimizer_steps_without_profiler_steps(load_built):
    b = TraceBuilder()
    for _ in range(4):
        b.kernel(GEMM, 300)
        b.cpu("cudaMalloc", 100, cat="cuda_runtime")
        b.cpu("cudaFree", 100, cat="cuda_runtime")
        b.cpu("Optimizer.step#SGD.step", 200, cat="user_annotation")
    b.finish()
    model = load_built(b)
    tm = trace_memory(model, compute(model))
    assert tm.iteration_kind == "Optimizer.step" and tm.iterations == 3
    assert tm.frees == 4 and tm.frees_in_iterations == 3 and tm.iterations_with_frees == 3
    report = analyze_model(model)
    churn = [f for f in report.findings if f.topic == "allocator-churn"]
    assert churn and "Optimizer.step" in churn[0].message


def _run_folder(tmp_path: Path, *, stats: dict | None = None, total_memory: int | None = None,
                snapshot: SnapshotBuilder | None = None, trace: TraceBuilder | None = None) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    facts: dict = {}
    if stats is not None:
        facts["capture"] = {"memory_stats": stats}
    if total_memory is not None:
        facts["environment"] = {"device": {"name": "NVIDIA A100-SXM4-80GB", "total_memory": total_memory}}
    (d / "run.json").write_text(json.dumps(facts))
    (trace or find_rule("dataloader-stall").negative()).write(d / "trace.json.gz")
    if snapshot is not None:
        snapshot.write(d / "memory.pickle")
    return d


def test_run_folder_snapshot_is_attached_to_its_trace(tmp_path):
    d = _run_folder(tmp_path, snapshot=find_rule("memory-fragmentation").positive(),
                    stats={"num_alloc_retries": 0, "num_ooms": 0, "allocated_bytes.all.peak": 2 * GiB,
                           "reserved_bytes.all.peak": 4 * GiB})
    reports = analyze_paths([str(d)])
    assert len(reports) == 1  # not reported as a separate "trace"
    r = reports[0]
    assert r.kind == "trace" and r.snapshot.endswith("memory.pickle")
    assert r.memory.sources == ["snapshot", "counters"]
    assert r.memory.peak_allocated == 2 * GiB
    assert "memory-fragmentation" in topics(r)
    doc = json.loads(_render(reports, "json"))
    assert doc["summary"]["memory"]["snapshot"]["stranded"] == 1 * GiB
    assert doc["traces"][0]["snapshot"].endswith("memory.pickle")


def test_per_rank_snapshots_go_with_their_ranks(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for rank in (0, 1):
        TraceBuilder(rank=rank).write(d / f"trace.rank{rank}.json.gz")
        b = SnapshotBuilder()
        b.segment(live((rank + 1) * GiB))
        b.write(d / f"memory.rank{rank}.pickle")
    reports = sorted(analyze_paths([str(d)]), key=lambda r: r.rank)
    assert [r.rank for r in reports] == [0, 1]
    assert [r.memory.snapshot.allocated for r in reports] == [1 * GiB, 2 * GiB]
    assert all(Path(r.snapshot).name == f"memory.rank{r.rank}.pickle" for r in reports)


def test_memory_stats_retries_are_pressure(tmp_path):
    d = _run_folder(tmp_path, stats={"num_alloc_retries": 3, "num_ooms": 0, "allocated_bytes.all.peak": 30 * GiB,
                                     "reserved_bytes.all.peak": 40 * GiB}, total_memory=80 * GiB)
    r = analyze_paths([str(d)])[0]
    assert r.memory.counters.num_alloc_retries == 3
    f = next(f for f in r.findings if f.topic == "memory-pressure")
    assert "3 cudaMalloc retries" in f.message and f.severity == "medium"
    assert "memory-headroom" not in topics(r)  # no headroom verdict after a retry


# ----------------------------------------------------------------------------------------------------
# Rules: where they must and must not fire


def test_snapshot_alone_gets_no_trace_verdict(tmp_path, capsys):
    path = find_rule("memory-fragmentation").positive().write(tmp_path / "memory.pickle")
    rc, out, err = call_main(capsys, "analyze", path, "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert doc["traces"][0]["kind"] == "snapshot"
    assert {f["topic"] for f in doc["findings"]} == {"memory-fragmentation"}
    assert doc["summary"]["memory"]["snapshot"]["reserved"] == int(3.75 * GiB)


def test_fragmentation_is_silent_when_the_history_shows_the_peak_used_the_reserve():
    """Holes at dump time are memory freed after a peak that filled the footprint: nothing to fix."""
    b = find_rule("memory-fragmentation").positive()
    live_now = segment_state(b.to_dict()).allocated  # 1.75 GiB live, 3.75 GiB reserved
    a = b.alloc(int(3.75 * GiB) - live_now - 16 * MiB)  # the step's activations filled it ...
    b.free(a)  # ... and were freed before the dump
    report = analyze_snapshot(b.to_dict())
    assert report.memory.history.unused_at_peak_pct < 1
    assert "memory-fragmentation" not in topics(report)


def test_fragmentation_with_expandable_segments_already_on():
    b = find_rule("memory-fragmentation").positive()
    b.settings["expandable_segments"] = True
    f = next(f for f in analyze_snapshot(b.to_dict()).findings if f.topic == "memory-fragmentation")
    assert "already on" in f.recommendation.split("\n")[0]
    assert f.evidence.numbers["stranded_gib"] == 1.0 and f.impact.est_step_saving_pct == 0.0


def test_fragmentation_finding_numbers():
    f = next(f for f in analyze_snapshot(find_rule("memory-fragmentation").positive().to_dict()).findings)
    n = f.evidence.numbers
    assert (n["reserved_gib"], n["allocated_gib"], n["stranded_gib"], n["empty_segments_gib"]) == (3.75, 1.75, 1.0, 1.0)
    assert n["unallocated_pct"] == pytest.approx(53.3, abs=0.1)
    assert "3.75 GiB reserved" in f.message and "1.00 GiB" in f.message
    assert f.evidence.sources == ["train.py:41 (forward)", "train.py:12 (<module>)"]
    assert "expandable_segments:True" in f.recommendation and "max_split_size_mb" in f.recommendation


@pytest.mark.parametrize("cycles, fires", [(1, False), (2, True)])
def test_churn_from_history(cycles, fires):
    b = SnapshotBuilder()
    b.segment(live(GiB))
    for _ in range(cycles):  # empty_cache() then the next step's cudaMallocs
        b.empty_cache(3, 64 * MiB)
        for _ in range(3):
            b.segment_alloc(64 * MiB)
    report = analyze_snapshot(b.to_dict())
    assert ("allocator-churn" in topics(report)) is fires
    if fires:
        f = report.findings[0]
        assert f.evidence.numbers["release_cycles"] == 2 and f.impact.est_step_saving_pct == 0.0


def test_churn_in_steps_predicts_a_saving(load_built):
    report = analyze_model(load_built(find_rule("allocator-churn").positive()))
    f = next(f for f in report.findings if f.topic == "allocator-churn")
    assert f.evidence.numbers["iterations_with_frees"] == 4
    assert 0 < f.impact.est_step_saving_pct < 100 and "replay" in f.impact.basis


def test_pressure_from_an_oom_in_the_history():
    report = analyze_snapshot(find_rule("memory-pressure").positive().to_dict())
    f = next(f for f in report.findings if f.topic == "memory-pressure")
    assert f.severity == "high"
    assert "6.00 GiB failed with 2.00 GiB free" in f.message
    assert f.evidence.numbers["failed_request_gib"] == 6.0
    assert f.evidence.sources == ["train.py:57 (forward)"]


def test_pressure_from_a_peak_near_capacity(load_built):
    report = analyze_model(load_built(_memory_trace([(60 * GiB, 70 * GiB), (73 * GiB, 76 * GiB)])))  # 80 GiB A100
    f = next(f for f in report.findings if f.topic == "memory-pressure")
    assert f.evidence.numbers["peak_pct_of_capacity"] == pytest.approx(91.2, abs=0.1)
    report = analyze_model(load_built(_memory_trace([(60 * GiB, 70 * GiB), (70 * GiB, 76 * GiB)])))  # 87.5 %
    assert "memory-pressure" not in topics(report)


def test_headroom_needs_capacity_and_a_loader_that_keeps_up(load_built):
    rule = find_rule("memory-headroom")
    assert "memory-headroom" in topics(analyze_model(load_built(rule.positive())))
    no_capacity = rule.positive()
    no_capacity.header["deviceProperties"][0].pop("totalGlobalMem")
    assert "memory-headroom" not in topics(analyze_model(load_built(no_capacity)))
    stall = TraceBuilder()
    for _ in range(4):
        with stall.step():
            stall.memory(GiB, 6 * GiB, 8 * GiB)
            stall.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 3_000)
            stall.kernel(GEMM, 500)
            stall.sync()
    stall.finish()
    report = analyze_model(load_built(stall))
    assert "memory-headroom" not in topics(report) and "dataloader-stall" in topics(report)


def test_no_memory_data_no_memory_rules(load_built):
    report = analyze_model(load_built(find_rule("dataloader-stall").positive()))
    assert report.memory is None
    assert not topics(report) & MEMORY_TOPICS


# ----------------------------------------------------------------------------------------------------
# Renderers


def _render(reports, fmt):
    from gpuadvise.analyzer.report import render

    return render(reports, fmt)


def test_markdown_memory_section_for_a_snapshot(tmp_path):
    path = _with_history().write(tmp_path / "memory.pickle")
    reports = analyze_paths([str(path)])
    md = _render(reports, "md")
    assert "- **Snapshot:**" in md and "## Memory" in md
    section = md.split("## Memory", 1)[1]
    for text in ("| Snapshot: reserved / allocated | 0.17 GiB / 0.07 GiB (57.1 % unallocated) |",
                 "| Stranded in partly used segments | 0.04 GiB (26.5 % of reserved) in 2 free blocks of 2 segments |",
                 "| Largest free block / largest live request | 50 MiB / 59 MiB |",
                 "| At the allocation peak | 0.10 GiB allocated of 0.19 GiB reserved (44.7 % unused) |",
                 "| Out-of-memory events | 1; first request 0.20 GiB |",
                 "`home/me/train.py:10 (forward)`"):
        assert text in section, text
    assert "## Steps" not in md  # a snapshot has no steps
    text = _render(reports, "text")
    assert "memory: peak 0.10 GiB allocated, 0.19 GiB reserved" in text


def test_json_memory_summary_per_trace(load_built, tmp_path):
    path = TraceBuilder().write(tmp_path / "plain.json.gz")
    doc = json.loads(_render(analyze_paths([str(path)]), "json"))
    assert doc["summary"]["memory"] is None and doc["traces"][0]["memory"] is None
    model = load_built(_memory_trace([(2 * GiB, 3 * GiB), (5 * GiB, 6 * GiB)]))
    reports = [analyze_model(model, source="t")]
    doc = json.loads(_render(reports, "json"))
    mem = doc["traces"][0]["memory"]
    assert mem == doc["summary"]["memory"]
    assert mem["sources"] == ["trace"] and mem["peak_allocated_bytes"] == 5 * GiB
    assert mem["capacity_bytes"] == 80 * GiB and mem["peak_allocated_pct_of_capacity"] == 6.25
    assert "## Memory" in _render(reports, "md")


def test_site_names_from_a_snapshot_are_defused_in_markdown(tmp_path):
    b = SnapshotBuilder()
    b.segment(live(GiB, site=("x.py", 1, "f|<script>`")), free(GiB))
    md = _render(analyze_paths([str(b.write(tmp_path / "m.pickle"))]), "md")
    # in a code span (markdown renders it literally), with the table pipe escaped
    assert "| ``x.py:1 (f\\|<script>`)`` |" in md
    assert all("``x.py:1 (f" in line for line in md.splitlines() if "<script>" in line)


# ----------------------------------------------------------------------------------------------------
# The real corpus (skipped without it)

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
needs_corpus = pytest.mark.skipif(not TRACES.is_dir(), reason=f"trace corpus not found at {TRACES}")
SNAPSHOTS = sorted(p.relative_to(TRACES).as_posix() for p in TRACES.rglob("*.pickle")) if TRACES.is_dir() else []
FRAGMENTED = {"kkaitlyn111-cs336-a2-systems/memory_snapshot.pickle": (27.0, 1.7),
              "cranberrii-ftcourse/memory_snapshot.pickle": (64.0, 1.5)}
CONTROL = "kkaitlyn111-cs336-a2-systems/memory_ctx512_forward.pickle"
MEMORY_TRACES = ["hta/tests/data/df_index_resolver/df_index_resolver.json.gz",
                 "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"]


@needs_corpus
@pytest.mark.slow
@pytest.mark.parametrize("rel", SNAPSHOTS or ["<none>"])
def test_real_snapshots_analyse_cleanly(rel, capsys):
    if rel == "<none>":
        pytest.skip("no snapshots in the corpus")
    rc, out, err = call_main(capsys, "analyze", TRACES / rel, "--format", "json")
    assert rc == 0 and err == "", err
    doc = json.loads(out)
    assert doc["traces"][0]["kind"] == "snapshot"
    found = {f["topic"] for f in doc["findings"]}
    assert found <= MEMORY_TOPICS, found  # never a trace verdict for a snapshot
    s = doc["summary"]["memory"]["snapshot"]
    assert s["reserved"] == s["allocated"] + s["internal_free"] + s["external_free"]


@needs_corpus
@pytest.mark.slow
@pytest.mark.parametrize("rel", sorted(FRAGMENTED))
def test_real_fragmented_snapshots(rel):
    if not (TRACES / rel).is_file():
        pytest.skip(f"{rel} not in the corpus")
    r = analyze_paths([str(TRACES / rel)])[0]
    unallocated, stranded_gib = FRAGMENTED[rel]
    s = r.memory.snapshot
    assert s.slack_pct >= unallocated and s.stranded / GiB >= stranded_gib  # the MANIFEST's figures
    assert "memory-fragmentation" in topics(r)


@needs_corpus
@pytest.mark.slow
def test_real_control_snapshot_is_not_fragmented():
    if not (TRACES / CONTROL).is_file():
        pytest.skip(f"{CONTROL} not in the corpus")
    r = analyze_paths([str(TRACES / CONTROL)])[0]
    assert r.memory.snapshot.slack_pct < 1
    assert "memory-fragmentation" not in topics(r)


@needs_corpus
@pytest.mark.slow
@pytest.mark.parametrize("rel", MEMORY_TRACES)
def test_real_memory_events_without_false_alarms(rel):
    if not (TRACES / rel).is_file():
        pytest.skip(f"{rel} not in the corpus")
    r = analyze_paths([str(TRACES / rel)])[0]
    tm = r.memory.trace
    assert tm.events > 1000 and tm.peak_allocated > 0 and tm.peak_reserved >= tm.peak_allocated
    assert r.memory.capacity and r.memory.pct_of_capacity(r.memory.peak_reserved) < 50
    assert not topics(r) & {"memory-fragmentation", "memory-pressure", "allocator-churn"}
    assert "## Memory" in _render([r], "md")

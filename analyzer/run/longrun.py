"""The run-level analysis of long runs: for each process of a `gpuadvise profile` run folder that left a step
record (`steps.jsonl`), the record, its windows' reports (already analysed, one per trace) and the
comparison of window 1 with each later window (gpuadvise compare's, analyzer/compare/diff.py) make a
`RunAnalysis` (measure/longrun/longrun.py); the run-level rules (`requires = ("run",)`) run once on it, and a
`LongRunReport` carries the section every format draws.

`LongRunReport.summary` (plain data, the JSON's `long_runs[]`): `steps` (recorded in all), `clock`, `exact_steps`
(steps below it are kept one by one, the rest per bucket), `levels` (`k`, `early_ms`, `early_steps`,
`slow_ms`, `slow_at`, `late_ms`, `late_steps`, `began_at`, `began_between` (its range), `until`,
`change_pct`, `shape`: steady, step,
climb, faster climb or speed-up, `slow_steps`, `warmup_until`; null with fewer than 2·k unprofiled steps), `memory` (`kind`, `steps`, `start_bytes`, `end_bytes`, `per_step_bytes`,
`rising_share`, `samples`; null without 5 samples), `windows` (`index`, `trigger`, `detail`, `steps`,
`state`, `trace`, `level_ms`: the unprofiled steps around it, `median_step_ms`: its recorded steps,
`findings`: its rules), `causes` (each window finding once: `once_per_cause`), `chart` (`step`, `ms`, `max_ms`: the series in at most `CHART_POINTS` bins, the
median and the slowest step of each).
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.measure.longrun.longrun import DEFAULT_K, RunAnalysis, WindowView
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.report import LongRunReport, Reports
from gpuadvise.analyzer.read.steprecord import load_step_record

from .single import run_rules

CHART_POINTS = 300


def analyze_runs(sources, reports: list, rules=None) -> list[LongRunReport]:
    """One LongRunReport per (run folder, rank) with a step record."""
    by_source = {r.source: r for r in reports}
    groups: dict[tuple, dict] = {}
    for src in sources:
        if getattr(src, "record", None) is None or src.kind != "trace":
            continue
        g = groups.setdefault((str(src.path.parent), src.rank), {"record": src.record, "windows": {}, "facts": {}})
        index = src.capture.index if src.capture is not None and src.capture.window else 1
        if str(src.path) in by_source:
            g["windows"][index] = by_source[str(src.path)]
            g["facts"][index] = src.facts
    out = []
    for (folder, rank), g in groups.items():
        report = _run_report(folder, rank, g, rules)
        if report is not None:
            out.append(report)
    return out


def own_regime(sources) -> None:
    """Before the windows are analysed: a later window whose unprofiled neighbours straddle the run's change
    (measure/longrun/changepoints.py on the step record) measures its profiler overhead, and its level, against the
    neighbours on its own side of the change only (the source's `facts["steps"]` is replaced by a copy with
    `unprofiled_median_ms`, `unprofiled_n` and `overhead_x` from those; `regime` says which side)."""
    changes: dict[str, object] = {}
    for src in sources:
        if getattr(src, "record", None) is None or src.kind != "trace" or src.capture is None or not src.capture.window \
                or src.capture.index <= 1:
            continue
        steps = src.facts.get("steps") if isinstance(src.facts, dict) else None
        if not isinstance(steps, dict) or not isinstance(steps.get("number"), list) or not isinstance(steps.get("ms"), list):
            continue
        key = str(src.record)
        if key not in changes:
            try:
                changes[key] = RunAnalysis(record=load_step_record(src.record),
                                           k=runfacts.slower_steps(src.facts) or DEFAULT_K).change
            except InputError:
                changes[key] = None
        change = changes[key]
        if change is None or change.onset is None or not change.is_drift:
            continue
        own = _own_side(steps, change)
        if own is not None:
            src.facts["steps"] = own


def _own_side(steps: dict, change) -> dict | None:
    """The window's step summary with its unprofiled median from the neighbours on its recorded steps' side."""
    rows = [(n, ph, ms) for n, ph, ms in zip(steps["number"], steps.get("phase") or [], steps["ms"])
            if isinstance(n, int) and isinstance(ms, (int, float))]
    recorded = [n for n, ph, _ in rows if ph == "active"]
    if not recorded:
        return None

    # steps between the last one before the onset and the onset went unseen (a window): the change is placed
    # halfway between them
    at = 0.5 * (change.onset + change.last_before) if change.last_before is not None else change.onset

    def side(n: int) -> int:
        return int(n >= at) + int(change.until is not None and n > change.until)

    mine = side(recorded[len(recorded) // 2])
    unprofiled = [(n, ms) for i, (n, ph, ms) in enumerate(rows) if ph in ("wait", "after", "off")
                  and i > 0 and rows[i - 1][1] in ("wait", "after", "off")]
    if len({side(n) for n, _ in unprofiled}) < 2:
        return None  # its neighbours are all on one side: nothing to change
    same = [ms for n, ms in unprofiled if side(n) == mine]
    if not same:
        return None
    u = round(float(np.median(same)), 3)
    p = steps.get("profiled_median_ms")
    out = dict(steps, unprofiled_median_ms=u, unprofiled_n=len(same),
               regime=f"the unprofiled steps {'before' if mine == 0 else 'after'} the change at step {change.onset}"
                      + (f" (between steps {change.last_before} and {change.onset})"
                         if change.last_before is not None and change.onset - change.last_before > 1 else ""))
    if isinstance(p, (int, float)) and u > 0:
        out["overhead_x"] = round(p / u, 3)
    return out


def _run_report(folder: str, rank, g: dict, rules) -> LongRunReport | None:
    notes: list[str] = []
    try:
        record = load_step_record(g["record"])
    except InputError as exc:
        first = g["windows"].get(1) or next(iter(g["windows"].values()), None)
        if first is not None:
            first.notes.append(f"the run's step record was not read: {exc.problem}")
        return None
    facts = g["facts"].get(1) or next(iter(g["facts"].values()), {})
    windows = []
    for w in runfacts.windows(facts) or [runfacts.WindowFact(1, "schedule", "", None, "captured", None, None)]:
        report = g["windows"].get(w.index)
        wf = g["facts"].get(w.index) or runfacts.window_facts(facts, w.index)
        steps = w.steps or _report_steps(report)
        windows.append(WindowView(index=w.index, trigger=w.trigger, detail=w.detail, steps=steps, state=w.state,
                                  trace=w.trace, report=report, level_ms=runfacts.unprofiled_median_ms(wf)))
    analysis = RunAnalysis(record=record, windows=windows, comparisons=_comparisons(g), facts=facts,
                           k=runfacts.slower_steps(facts) or DEFAULT_K)
    if record.damaged_lines:
        notes.append(f"{record.damaged_lines} line(s) of the step record could not be read (the run was stopped "
                     "while writing one?)")
    if record.buckets:
        notes.append(f"steps from {record.exact_steps} on are kept per bucket (median, fastest, slowest): "
                     f"{len(record.buckets)} buckets")
    findings = run_rules(analysis, rules, source=folder, rank=rank, notes=notes)
    summary = summarize(analysis)
    summary["causes"] = once_per_cause(windows)
    return LongRunReport(folder=folder, rank=rank, record=str(g["record"]), summary=summary,
                         findings=findings, notes=notes)


def once_per_cause(windows: list[WindowView]) -> list[dict]:
    """Each window's findings, stated once over the run: a finding (rule and topic) that several windows
    hold is kept in the window where its fix is predicted to save most (the latest on a tie; its figures
    all come from that window's steps) and left out of the others' reports; its message says which
    windows hold it and how its predicted saving changed between them. Returns the run's causes (the
    JSON's `causes`: `rule`, `topic`, `title`, `kept_in`, `windows`: [{`index`, `steps`, `saving_pct`}])."""
    groups: dict[tuple, list] = {}
    for w in windows:
        for f in (w.report.findings if w.report is not None else []):
            groups.setdefault((f.rule, f.topic), []).append((w, f))
    causes = []
    for (rule, topic), held in groups.items():
        keep_w, keep = max(held, key=lambda wf: (wf[1].impact.est_step_saving_pct or 0.0, wf[0].index))
        seen = [{"index": w.index, "steps": list(w.steps) if w.steps else None,
                 "saving_pct": round(float(f.impact.est_step_saving_pct or 0.0), 1)} for w, f in held]
        causes.append({"rule": rule, "topic": topic, "title": keep.title, "kept_in": keep_w.index, "windows": seen})
        if len(held) < 2:
            continue
        for w, f in held:
            if f is not keep:
                w.report.findings = [x for x in w.report.findings if x is not f]
        keep.message = keep.message.rstrip() + " " + _held_in(seen, keep_w.index)
    return causes


def _held_in(seen: list[dict], kept: int) -> str:
    where = ", ".join(str(s["index"]) for s in seen)
    first, last = seen[0], seen[-1]
    if any(s["saving_pct"] > 0 for s in seen):
        change = (f"; its fix's predicted saving went from {first['saving_pct']:.0f} % in window {first['index']} to "
                  f"{last['saving_pct']:.0f} % in window {last['index']}" if abs(last["saving_pct"] - first["saving_pct"]) >= 1
                  else f"; its fix's predicted saving stayed near {last['saving_pct']:.0f} %")
    else:
        change = ""
    return f"Windows {where} of this run show it (stated once, with window {kept}'s figures){change}."


def _report_steps(report) -> tuple[int, int] | None:
    nums = report.figures.step_numbers if report is not None and report.figures is not None else []
    return (nums[0], nums[-1]) if nums else None


def _comparisons(g: dict) -> dict:
    """gpuadvise compare's data for window 1 against each later window that was analysed."""
    from gpuadvise.analyzer.compare.diff import compare
    from gpuadvise.analyzer.compare.side import Side

    first = g["windows"].get(1)
    if first is None or first.metrics is None:
        return {}
    sides = {}

    def side(i):
        if i not in sides:
            r = g["windows"][i]
            sides[i] = Side.of(Reports([r]), label=f"window {i}", facts={r.source: g["facts"].get(i) or {}})
        return sides[i]

    return {i: compare(side(1), side(i)) for i, r in sorted(g["windows"].items()) if i > 1 and r.metrics is not None}


def summarize(a: RunAnalysis) -> dict:
    r = a.record
    lv = a.levels
    mem = a.memory_trend(from_step=_settled_step(a))
    return {
        "steps": r.steps, "clock": r.clock, "exact_steps": r.exact_steps, "last_step": r.last_step,
        "levels": None if lv is None else {
            "k": lv.k, "early_ms": round(lv.early_ms, 3), "early_steps": list(lv.early_steps),
            "slow_ms": round(lv.slow_ms, 3), "slow_at": lv.slow_at, "late_ms": round(lv.late_ms, 3),
            "late_steps": list(lv.late_steps), "began_at": lv.began_at, "until": lv.until,
            "change_pct": round(lv.change_pct, 1), "shape": lv.shape,
            "began_between": list(lv.began_between) if lv.began_between else None,
            "slow_steps": list(lv.slow_steps) if lv.slow_steps else None, "warmup_until": lv.warmup_until},
        "memory": None if mem is None else {
            "kind": mem.kind, "steps": list(mem.steps), "start_bytes": mem.start_bytes, "end_bytes": mem.end_bytes,
            "per_step_bytes": round(mem.per_step_bytes, 1), "rising_share": round(mem.rising_share, 3),
            "samples": mem.samples},
        "windows": [_window_summary(w) for w in a.windows],
        "chart": _chart(a),
    }


def _settled_step(a: RunAnalysis) -> int:
    """Memory from here on: after window 1 (allocator caches, the first steps' buffers fill up before it)."""
    first = a.window(1)
    return first.steps[1] + 1 if first is not None and first.steps else 0


def _window_summary(w: WindowView) -> dict:
    r = w.report
    fig = r.figures if r is not None else None
    return {"index": w.index, "trigger": w.trigger, "detail": w.detail, "steps": list(w.steps) if w.steps else None,
            "state": w.state, "trace": w.trace, "level_ms": w.level_ms,
            "median_step_ms": fig.median_step_ms if fig is not None and fig.steps else None,
            "findings": [f.rule for f in r.findings] if r is not None else []}


def _chart(a: RunAnalysis) -> dict:
    steps, ms = a.series
    if not len(ms):
        return {"step": [], "ms": [], "max_ms": []}
    bins = np.array_split(np.arange(len(ms)), min(CHART_POINTS, len(ms)))
    return {"step": [int(steps[b[0]]) for b in bins], "ms": [round(float(np.median(ms[b])), 3) for b in bins],
            "max_ms": [round(float(np.max(ms[b])), 3) for b in bins]}

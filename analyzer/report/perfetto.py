"""The findings as a timeline track: Trace Event slices added to the user's own trace, so Perfetto or
chrome://tracing shows where each problem sits next to the kernels and ops that prove it.

One process, "gpuadvise", sorted first; one lane (thread) per finding, in report order, holding one
complete ("X") slice from the start of the finding's first evidence range to the end of its last.
Where a finding's evidence has no time ranges, its steps' spans stand in; a finding with neither
(a setting read from run.json, say) spans the analysed window. The slice's args carry the message,
the advice and the rule's fix, the predicted saving and each evidence range, in the trace's own microseconds.
"""

from __future__ import annotations

CATEGORY = "gpuadvise"  # the loader knows it and leaves these slices out of the analysis
PROCESS_NAME = "gpuadvise"


def evidence_span_us(report, finding) -> tuple[tuple[float, float], list[tuple[float, float]], str]:
    """((start, end), ranges, basis) of a finding on its trace's rebased clock (µs from the trace start)."""
    e = finding.evidence
    if e.time_ranges_ms:
        ranges = [(a * 1e3, b * 1e3) for a, b in e.time_ranges_ms]
        basis = "evidence time ranges"
    else:
        steps = report.metrics.steps if report.metrics is not None else []
        wanted = set(e.steps)
        ranges = [(s.start, max(s.end, s.gpu_end if s.gpu_end == s.gpu_end else s.end))
                  for s in steps if s.number in wanted]
        basis = "evidence steps"
        if not ranges and report.metrics is not None:
            ranges, basis = [tuple(report.metrics.window)], "the analysed window (no time ranges or steps)"
    if not ranges:
        return (0.0, 0.0), [], "none"
    return (min(a for a, _ in ranges), max(b for _, b in ranges)), ranges, basis


def finding_events(report, pid: int) -> list[dict]:
    """The gpuadvise track for one trace's report: metadata events, then one slice per finding."""
    base = report.model.meta.base_ts_us if report.model is not None else 0.0
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": PROCESS_NAME}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}},
    ]
    for lane, f in enumerate(report.findings, start=1):
        (start, end), ranges, basis = evidence_span_us(report, f)
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane,
                       "args": {"name": f"{lane}. {f.rule} ({f.severity})"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": lane, "args": {"sort_index": lane}})
        events.append({
            "ph": "X", "cat": CATEGORY, "name": f.title, "pid": pid, "tid": lane,
            "ts": base + start, "dur": max(end - start, 0.0),
            "args": {
                "rule": f.rule, "severity": f.severity, "message": f.message, "advice": f.advice, "fix": f.fix,
                "predicted_step_saving_pct": f.impact.est_step_saving_pct,
                "evidence": basis, "evidence_steps": list(f.evidence.steps),
                "evidence_ranges_us": [[base + a, base + b] for a, b in ranges],
            },
        })
    return events

"""JSON report: `findings` (the finding fields) and `summary`, for scripts and CI; `job` (ranks, per-rank
stats, the slowest rank per step) when two or more ranks were analysed together; `runs` (what changed over
a long run: its step record, windows and levels, run/longrun.py) for a run folder with a step record."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from gpuadvise.version import __version__

from gpuadvise.analyzer.model.report import TraceReport, all_findings


def trace_summary(r: TraceReport) -> dict:
    """One trace's entry under `traces`: where it came from, its memory summary, its figures."""
    s: dict = {"trace": r.source, "rank": r.rank, "kind": r.kind}
    if r.window is not None:
        s["window"] = r.window
    if r.snapshot:
        s["snapshot"] = r.snapshot
    s["memory"] = r.memory.to_dict() if r.memory is not None else None
    if r.figures is not None:
        s.update(asdict(r.figures))
    return s


def summary(reports: list[TraceReport]) -> dict:
    """The slowest trace's summary at the top (the usual single-trace case: that one), every trace under
    `traces`."""
    traces = [trace_summary(r) for r in reports]
    # a long run's later windows describe other stretches of the same process: window 1 heads the summary
    timed = [t for t in traces if t.get("kind") == "trace" and "steps" in t and t.get("window", 1) == 1]
    # several ranks: the slowest one sets the pace of the job, so it heads the summary
    main = max(timed, key=lambda t: t.get("median_step_ms") or 0.0) if timed else (traces[0] if traces else {})
    top = {k: main.get(k) for k in ("steps", "median_step_ms", "gpu_busy_pct", "gpu_busy_in_steps_pct", "device",
                                  "device_description", "platform", "unprofiled_median_step_ms", "profiler_overhead_x")}
    top["trace"] = main.get("trace")
    top["rank"] = main.get("rank")
    top["memory"] = main.get("memory")
    top["traces"] = len(reports)
    top["findings"] = len(all_findings(reports))
    return top


def render(reports: list[TraceReport]) -> str:
    return json.dumps(document(reports), indent=2, default=_default, allow_nan=False) + "\n"


def document(reports: list[TraceReport]) -> dict:
    """The report as plain JSON-able data (what `render` writes; `gpuadvise compare` reads it)."""
    doc = {
        "tool": "gpuadvise",
        "version": __version__,
        "summary": summary(reports),
        "findings": [f.to_dict() for f in all_findings(reports)],
        "traces": [dict(trace_summary(r), notes=r.notes) for r in reports],
    }
    job = getattr(reports, "job", None)
    if job is not None:  # two or more ranks: the job-level view (per-rank table, straggler per step)
        doc["job"] = job.to_dict()
    runs = getattr(reports, "runs", None)
    if runs:  # long runs: what changed over each process's run
        doc["runs"] = [run.to_dict() for run in runs]
    return _finite(doc)


def _finite(o):
    """NaN/inf are not JSON: they become null."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return _finite(o.item())
    except ImportError:  # pragma: no cover
        pass
    return o


def _default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

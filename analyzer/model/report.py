"""What an analysis produces, as the renderers and the TUI read it: one `TraceReport` per trace or
snapshot, gathered in `Reports` (with the job-level report when several ranks were analysed)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from .findings import Finding, order
from .trace import TraceModel

if TYPE_CHECKING:  # the measurements are computed upstream; the report only carries them
    from gpuadvise.analyzer.measure.memory import MemorySummary
    from gpuadvise.analyzer.measure.metrics import Metrics


@dataclass
class TraceReport:
    source: str
    rank: int | None
    model: TraceModel | None
    metrics: Metrics | None
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    kind: str = "trace"  # "trace" or "snapshot" (a memory snapshot on its own)
    memory: MemorySummary | None = None
    snapshot: str | None = None  # the allocator snapshot read with a trace (run folder)
    rank_stats: object = None  # job.RankStats, when the trace is one rank of several
    calibration: object = None  # measure.calibration.Calibration: the profiler's own cost
    _summary: dict | None = field(default=None, repr=False)  # kept by compact(), which drops what it needs

    def summary(self) -> dict:
        if self._summary is not None:
            return dict(self._summary)
        s: dict = {"trace": self.source, "rank": self.rank, "kind": self.kind}
        if self.snapshot:
            s["snapshot"] = self.snapshot
        s["memory"] = self.memory.to_dict() if self.memory is not None else None
        if self.model is None or self.metrics is None:
            return s
        m, meta = self.metrics, self.model.meta
        dev = self.model.device
        ps = m.per_step
        s.update({
            "device": dev.name if dev else None,
            "compute_capability": f"{dev.compute_major}.{dev.compute_minor}" if dev and dev.compute_major is not None else None,
            "platform": meta.platform,
            "events": meta.events_total,
            "steps": len(m.steps),
            "step_numbers": [st.number for st in m.steps],
            "median_step_ms": round(m.median_step_us / 1e3, 3),
            # both figures a step time is made of (metrics' module docstring): the CPU span alone is
            # what HTA and TensorBoard report; it understates the step when the CPU runs ahead
            "median_step_cpu_ms": round(m.median_cpu_step_us / 1e3, 3),
            "median_step_gpu_ms": round(m.median_gpu_step_us / 1e3, 3),
            "step_time_basis": _step_basis(m),
            # the profiler's own cost: run.json's unprofiled step time (None for traces from elsewhere)
            "unprofiled_median_step_ms": _r(self.calibration.unprofiled_step_us / 1e3, 3)
            if self.calibration is not None and self.calibration.unprofiled_step_us else None,
            "profiler_overhead_x": _r(self.calibration.overhead_x) if self.calibration is not None else None,
            "profiler_calibration": self.calibration.describe() if self.calibration is not None else None,
            "step_times_ms": [{"step": st.number, "ms": round(st.dur / 1e3, 3), "cpu_ms": round(st.cpu_dur / 1e3, 3),
                               "gpu_ms": round(st.gpu_dur / 1e3, 3), "bound": "gpu" if st.gpu_bound else "cpu"}
                              for st in m.steps],
            "window_ms": round(m.window_us / 1e3, 3),
            "gpu_busy_pct": _r(m.gpu_busy_pct),
            "gpu_busy_in_steps_pct": _r(m.busy_in_steps_pct),
            "temporal_breakdown": {k: _r(v) for k, v in m.temporal.items()},
            "step_breakdown_ms": {
                col.replace("_us", ""): round(float(np.median(ps[col])) / 1e3, 3)
                for col in ("dur_us", "kernel_us", "comm_us", "memcpy_us", "memset_us", "dataloader_us", "sync_us", "idle_us")
                if col in ps
            },
            "idle_breakdown_ms": {k.replace("_us", ""): round(float(m.idle_breakdown[k].sum()) / 1e3, 3)
                                  for k in ("host_wait_us", "kernel_wait_us", "other_us")} if len(m.idle_breakdown) else {},
            "kernels": int(len(self.model.kernels)),
            "events_skipped": meta.events_skipped,
            "truncated": meta.truncated,
        })
        return s

    def compact(self) -> "TraceReport":
        """The report without the parsed events (what a worker sends back): the summary, findings,
        notes, memory and the per-step and kernel tables stay; the model keeps only its metadata."""
        if self.model is None or self.metrics is None:
            return self
        self._summary = self.summary()
        m = self.metrics
        empty = {name: getattr(self.model, name).iloc[0:0] for name in
                 ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations")}
        self.model = replace(self.model, **empty)
        self.metrics = replace(m, ops=m.ops.iloc[0:0], copies=m.copies.iloc[0:0], syncs=m.syncs.iloc[0:0],
                               launches=m.launches.iloc[0:0], dataloader=m.dataloader.iloc[0:0],
                               gpu_union=(m.gpu_union[0][:0], m.gpu_union[1][:0]))
        return self


class Reports(list):
    """The reports of `analyze_paths`, one per source (a list), the job-level report when two or more
    ranks were analysed together (`.job`, else None), and the run.json facts read with the sources
    (`.facts`: trace path → facts; empty for traces from elsewhere)."""

    def __init__(self, reports=(), job=None, facts: dict | None = None):
        super().__init__(reports)
        self.job = job
        self.facts = dict(facts or {})


def _step_basis(m: Metrics) -> str:
    if not m.steps:
        return "no ProfilerStep annotations: the whole trace is one step"
    gpu = sum(st.gpu_bound for st in m.steps)
    if not gpu:
        return "CPU span of each ProfilerStep (the GPU kept up with the CPU)"
    return (f"GPU timeline: {gpu} of {len(m.steps)} steps took longer on the GPU than their CPU span "
            "(the CPU ran ahead); such a step lasts from its first GPU activity to the next step's")


def _r(v, nd=2):
    if v is None:
        return None
    return round(float(v), nd)


def all_findings(reports: list[TraceReport]) -> list[Finding]:
    job = getattr(reports, "job", None)
    return order([f for r in reports for f in r.findings] + (job.findings if job is not None else []))

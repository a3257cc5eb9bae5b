"""Runs the pipeline: source → model → metrics → rules → a report the renderers draw.

With two or more traces, each is analysed on its own (the map: in worker processes or on a Dask
cluster, see ranks.py), then the ranks are reduced to a job view (job.py) and the job-level rules
(`requires = ("ranks",)`) run once on it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field, replace

import numpy as np

from .analysis import Analysis
from .findings import Finding, order
from .loader import load_trace
from .memory import MemorySummary, summarize
from .metrics import Metrics, compute
from .model import TraceModel
from .sources import Source, resolve


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
    """The reports of `analyze_paths`, one per source (a list), and the job-level report when two or
    more ranks were analysed together (`.job`, else None)."""

    def __init__(self, reports=(), job=None):
        super().__init__(reports)
        self.job = job


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


def analyze_model(model: TraceModel, facts: dict | None = None, source: str = "", rank: int | None = None,
                  rules=None, snapshot: dict | None = None) -> TraceReport:
    """One trace, with the allocator snapshot taken in the same run when there is one."""
    metrics = compute(model)
    memory = summarize(snapshot, model, metrics, facts)
    analysis = Analysis(model, metrics, facts, memory)
    notes: list[str] = []
    if model.meta.events_skipped:
        notes.append(f"{model.meta.events_skipped} malformed events were skipped")
    if model.meta.unknown_categories:
        total = sum(model.meta.unknown_categories.values())
        notes.append(f"{total} events of unknown categories were ignored: "
                     + ", ".join(sorted(model.meta.unknown_categories)[:5]))
    if not metrics.steps and metrics.has_gpu:
        notes.append("no ProfilerStep annotations: the whole trace is treated as one step")
    rank = model.meta.rank if model.meta.rank is not None else rank
    findings = _run_rules(analysis, rules, source, rank, notes)
    return TraceReport(source=source, rank=rank, model=model, metrics=metrics, findings=findings, notes=notes,
                       memory=memory)


def analyze_snapshot(snapshot: dict, facts: dict | None = None, source: str = "", rank: int | None = None,
                     rules=None) -> TraceReport:
    """A memory snapshot on its own: only the rules that need nothing but memory run."""
    memory = summarize(snapshot, facts=facts)
    notes: list[str] = []
    findings = _run_rules(Analysis(None, None, facts, memory), rules, source, rank, notes)
    return TraceReport(source=source, rank=rank, model=None, metrics=None, findings=findings, notes=notes,
                       kind="snapshot", memory=memory)


def _run_rules(analysis, rules, source: str | None, rank: int | None, notes: list[str],
               keep_rank: bool = False) -> list[Finding]:
    """Every rule whose inputs `analysis` has (`Rule.requires`); a rule that raises costs only its own
    findings. Job-level rules (`keep_rank`) name the rank and trace themselves."""
    from gpuadvise.rules import all_rules

    findings: list[Finding] = []
    for rule in rules or all_rules():
        if not all(analysis.has(need) for need in getattr(rule, "requires", ("trace",))):
            continue  # its input is not here (a trace rule on a snapshot, a memory rule without memory data)
        try:
            found = rule.check(analysis)
        except Exception as exc:  # a rule bug must not cost the user the other findings
            notes.append(f"rule {rule.code} ({rule.name}) failed: {type(exc).__name__}: {exc}")
            if _debug():
                traceback.print_exc()
            continue
        if not keep_rank:
            for f in found:
                f.rank = rank
                f.trace = source
        findings.extend(found)
    return order(findings)


def analyze_source(src: Source, rules=None, progress=None) -> TraceReport:
    """Analyse one source; `progress(done_bytes, total_bytes)` follows the trace decode when given."""
    from .snapshot import load_snapshot

    if src.kind == "snapshot":
        return analyze_snapshot(load_snapshot(src.path), src.facts, source=str(src.path), rank=src.rank, rules=rules)
    snapshot = load_snapshot(src.snapshot) if src.snapshot is not None else None
    model = load_trace(src.path, progress=progress)
    report = analyze_model(model, src.facts, source=str(src.path), rank=src.rank, rules=rules, snapshot=snapshot)
    if src.snapshot is not None:
        report.snapshot = str(src.snapshot)
    if model.meta.damaged_at is not None:
        report.notes.insert(0, f"the trace is damaged at byte {model.meta.damaged_at}; analysed the "
                               f"{model.meta.events_total} complete events before the damage")
    elif model.meta.truncated:
        report.notes.insert(0, f"the trace was cut off; analysed the {model.meta.events_total} complete events before the cut")
    return report


def analyze_paths(paths: list[str], progress=None, rules=None, bytes_progress=None, jobs: int | None = None,
                  scheduler=None, rank_progress=None) -> Reports:
    """Analyse every source, then the job when there are ≥2 ranks.

    - one trace, or `jobs=1`: in this process, one source after the other; `progress(i, n, source)`
      before each source and `bytes_progress(done, total)` during each decode;
    - ≥2 traces: in worker processes (`jobs`, default `ranks.default_jobs`), or on the Dask cluster of
      `scheduler` (a `dask.distributed.Client` or a scheduler address); `rank_progress(done, n, nbytes)`
      as ranks finish.
    """
    from . import ranks

    sources = resolve(paths)
    traces = sum(1 for s in sources if s.kind == "trace")
    try:
        codes = ranks.rule_codes(rules)
    except ValueError:  # rules that are not in the catalog cannot travel: run here
        codes, jobs, scheduler = None, 1, None
    workers = 1
    if traces >= 2 and scheduler is None:
        workers = min(jobs if jobs is not None else ranks.default_jobs(sources), len(sources))
    if scheduler is not None:
        results = ranks.map_dask(sources, codes, scheduler, progress=rank_progress)
    elif workers > 1:
        results = ranks.map_local(sources, codes, workers, progress=rank_progress)
    else:
        results = []
        for i, src in enumerate(sources):
            if progress:
                progress(i, len(sources), src)
            results.append(analyze_source(src, rules=rules, progress=bytes_progress))
        if traces >= 2:
            from .job import rank_stats

            for r in results:
                r.rank_stats = rank_stats(r)
    reports = [r if isinstance(r, TraceReport) else _failed(r) for r in results]
    if traces >= 2:
        reports.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0))  # stable: rank order
    if reports and getattr(sources, "notes", None):
        reports[0].notes[:0] = sources.notes  # files of the folder(s) that are not traces
    return Reports(reports, job=analyze_job(reports, rules))


def _failed(failure) -> TraceReport:
    """A rank whose worker failed (not bad input: that stops the run): reported as a note on that rank."""
    return TraceReport(source=failure.source, rank=failure.rank, model=None, metrics=None, findings=[],
                       notes=[f"analysis failed: {failure.message}"])


def analyze_job(reports: list[TraceReport], rules=None):
    """The reduce: the job view of ≥2 ranks and the job-level rules on it (None for fewer ranks)."""
    from .job import JobAnalysis, JobReport, build_view

    view = build_view([r.rank_stats for r in reports if r.rank_stats is not None])
    if view is None:
        return None
    by_rank: dict = {}
    for r in reports:
        by_rank.setdefault(r.rank, []).extend(r.findings)
    notes = list(view.notes)
    analysis = JobAnalysis(view, by_rank)
    findings = _run_rules(analysis, rules, source=None, rank=None, notes=notes, keep_rank=True)
    return JobReport(view=view, findings=findings, notes=notes)


def _debug() -> bool:
    import os

    return bool(os.environ.get("GPUADVISE_DEBUG"))


def all_findings(reports: list[TraceReport]) -> list[Finding]:
    job = getattr(reports, "job", None)
    return order([f for r in reports for f in r.findings] + (job.findings if job is not None else []))

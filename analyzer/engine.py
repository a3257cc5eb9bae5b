"""Runs the pipeline: source → model → metrics → rules → a report the renderers draw."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

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

    def summary(self) -> dict:
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


def _run_rules(analysis: Analysis, rules, source: str, rank: int | None, notes: list[str]) -> list[Finding]:
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


def analyze_paths(paths: list[str], progress=None, rules=None, bytes_progress=None) -> list[TraceReport]:
    """`progress(i, n, source)` before each source; `bytes_progress(done, total)` during each decode."""
    sources = resolve(paths)
    reports = []
    for i, src in enumerate(sources):
        if progress:
            progress(i, len(sources), src)
        reports.append(analyze_source(src, rules=rules, progress=bytes_progress))
    return reports


def _debug() -> bool:
    import os

    return bool(os.environ.get("GPUADVISE_DEBUG"))


def all_findings(reports: list[TraceReport]) -> list[Finding]:
    return order([f for r in reports for f in r.findings])

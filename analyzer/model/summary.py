"""The summary of an analysis, as typed data: what every output reads. The text, markdown and HTML
reports, the TUI's overview and `gpuadvise compare` read it, and the JSON report is its serialisation
(`RunSummary.to_dict`, plus the tool and version): one summary, so every output quotes the same figures.

- `TraceSummary`: one trace or snapshot: where it came from (source, rank, kind, the allocator snapshot
  read with it), its memory summary, its figures (`TraceFigures`; None for a snapshot on its own or a
  rank whose analysis failed) and its notes.
- `RunSummary`: the whole analysis: every trace, the findings in report order, the job-level report of
  two or more ranks, the run-level reports of long runs (`long_runs`: what changed over a run folder's
  run, its step record and windows), which trace heads it (the slowest one: it sets the job's pace; never
  a long run's later window) and the run's own figures (`RunFigures`).

`summarize(reports)` builds it once from `Reports` (or any list of `TraceReport`s).

Adding a field:
- a figure of each trace: a field of `model.report.TraceFigures`, computed in `run/figures.py`. Every
  reader finds it at `trace.figures.<name>`, and the JSON's `traces[i]` carries it. To repeat the heading
  trace's value in the JSON's top `summary` as well, add its name to `HEADLINE`.
- a figure of the run (across ranks, over time): a field of `RunFigures`, given its value in `summarize`.
  Readers find it at `summary.figures.<name>`, and the JSON's top `summary` carries it after the
  headline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from .findings import Finding
from .report import TraceFigures, TraceReport, all_findings, ms_text

if TYPE_CHECKING:  # computed upstream; the summary only carries them
    from gpuadvise.analyzer.measure.job.job import JobReport
    from gpuadvise.analyzer.measure.memory import MemorySummary

    from .report import LongRunReport

# The heading trace's figures the JSON repeats in its top `summary`, in this order (a script reading a
# single-trace report finds its headline there).
HEADLINE = ("steps", "median_step_ms", "gpu_busy_pct", "gpu_busy_in_steps_pct", "device", "device_description",
            "platform", "unprofiled_median_step_ms", "profiler_overhead_x")


@dataclass(frozen=True)
class TraceSummary:
    """One trace's (or snapshot's) summary: its entry under the JSON's `traces`."""

    source: str
    rank: int | None = None
    kind: str = "trace"  # "trace" or "snapshot" (a memory snapshot on its own)
    snapshot: str | None = None  # the allocator snapshot read with the trace (run folder)
    memory: MemorySummary | None = None
    figures: TraceFigures | None = None
    notes: tuple[str, ...] = ()
    window: int | None = None  # a long run's window (1, 2, …): the same process at another stretch of the run

    @classmethod
    def of(cls, r: TraceReport) -> TraceSummary:
        return cls(source=r.source, rank=r.rank, kind=r.kind, snapshot=r.snapshot, memory=r.memory,
                   figures=r.figures, notes=tuple(r.notes), window=r.window)

    @property
    def timed(self) -> bool:
        """A trace with its figures: it has a step time (a snapshot or a failed rank has none)."""
        return self.kind == "trace" and self.figures is not None

    def figure(self, name: str):
        """One of its figures by name (None when it has none)."""
        return getattr(self.figures, name) if self.figures is not None else None

    def to_dict(self) -> dict:
        """The JSON's entry: where it came from, its memory, its figures (flat), its notes."""
        d: dict = {"trace": self.source, "rank": self.rank, "kind": self.kind}
        if self.window is not None:
            d["window"] = self.window
        if self.snapshot:
            d["snapshot"] = self.snapshot
        d["memory"] = self.memory.to_dict() if self.memory is not None else None
        if self.figures is not None:
            d.update(asdict(self.figures))
            if not d["gpus"]:  # one GPU: its figures are the trace's
                del d["gpus"]
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class RunFigures:
    """The run's own figures (not one trace's): the JSON's top `summary` carries them after the headline."""

    traces: int = 0  # traces and snapshots analysed
    findings: int = 0  # findings of every trace and of the job
    # the job's MFU (`job_mfu`): every rank's model FLOPs per step over the job's step (its slowest rank's
    # median) and every rank's peak; one trace: its own. None without a count or a peak; `mfu_basis` says
    # how it was made, or what is missing
    mfu_pct: float | None = None
    hfu_pct: float | None = None
    model_flops: float | None = None  # per step, every rank together
    mfu_basis: str | None = None


@dataclass(frozen=True)
class RunSummary:
    """The whole analysis. `heading` indexes the trace that heads it (None when there is none)."""

    traces: tuple[TraceSummary, ...] = ()
    findings: tuple[Finding, ...] = ()  # every trace's and the job's, in report order (`all_findings`)
    heading: int | None = None
    job: JobReport | None = None  # two or more ranks: the per-rank table, the slowest rank per step
    figures: RunFigures = field(default_factory=RunFigures)
    long_runs: tuple[LongRunReport, ...] = ()  # run folders with a step record: what changed over the run

    @property
    def head(self) -> TraceSummary | None:
        return self.traces[self.heading] if self.heading is not None else None

    def headline(self) -> dict:
        """The JSON's top `summary`: the heading trace's headline figures, where it came from and its
        memory, then the run's figures."""
        t = self.head
        top = {name: t.figure(name) if t is not None else None for name in HEADLINE}
        top["trace"] = t.source if t is not None else None
        top["rank"] = t.rank if t is not None else None
        top["memory"] = t.memory.to_dict() if t is not None and t.memory is not None else None
        top.update(asdict(self.figures))
        return top

    def to_dict(self) -> dict:
        """The JSON report's body: `summary`, `findings`, `traces`, `job` with two or more ranks, `long_runs`
        with a run folder's step record."""
        d = {"summary": self.headline(), "findings": [f.to_dict() for f in self.findings],
             "traces": [t.to_dict() for t in self.traces]}
        if self.job is not None:
            d["job"] = self.job.to_dict()
        if self.long_runs:
            d["long_runs"] = [r.to_dict() for r in self.long_runs]
        return d


def summarize(reports: list[TraceReport]) -> RunSummary:
    """The summary of `reports` (`Reports`, or a plain list of `TraceReport`s: no job then)."""
    traces = tuple(TraceSummary.of(r) for r in reports)
    findings = tuple(all_findings(reports))
    return RunSummary(traces=traces, findings=findings, heading=heading(traces), job=getattr(reports, "job", None),
                      figures=RunFigures(traces=len(traces), findings=len(findings), **job_mfu(traces)),
                      long_runs=tuple(getattr(reports, "long_runs", None) or ()))


def job_mfu(traces: tuple[TraceSummary, ...]) -> dict:
    """RunFigures' MFU fields: one trace's own; for several ranks, their model FLOPs per step together over
    the job's step (the slowest rank's median: it sets the pace) and their peaks together."""
    ranks = [t.figures.flops for t in traces if t.timed and (t.window or 1) == 1 and t.figures.flops is not None]
    counted = [f for f in ranks if f.state == "counted" and f.model_flops is not None and f.step_ms]
    if not counted:
        return {"mfu_basis": ranks[0].note} if ranks else {}
    if len(counted) == 1:
        f = counted[0]
        return {"mfu_pct": f.mfu_pct, "hfu_pct": f.hfu_pct, "model_flops": f.model_flops, "mfu_basis": f.basis or None}
    flops = sum(f.model_flops for f in counted)
    hardware = sum(f.hardware_flops or f.model_flops for f in counted)
    step_ms = max(f.step_ms for f in counted)
    peaks = [f.peak_tflops for f in counted]
    out = {"model_flops": flops, "mfu_basis": f"{len(counted)} ranks' model FLOPs over the slowest rank's median step "
                                              f"({ms_text(step_ms)} ms)"}
    if all(peaks):
        peak = sum(peaks)
        out["mfu_pct"] = round(100 * flops / (step_ms / 1e3) / (peak * 1e12), 2)
        out["hfu_pct"] = round(100 * hardware / (step_ms / 1e3) / (peak * 1e12), 2)
        out["mfu_basis"] += f" and their dense peaks together ({peak:g} TFLOP/s)"
    return out


def one_per_rule(findings, job: bool = True) -> tuple[list, dict]:
    """The findings a report lists: in a job's report (`job`), one entry per rule for the per-rank ones
    (the rank where it saves most: the findings come ordered), and the ranks each entry stands for (by id
    of the finding kept). Every format lists the same entries."""
    if not job:
        return list(findings), {id(f): [f.rank] for f in findings}
    kept, ranks_of, first = [], {}, {}
    for f in findings:
        if f.rank is None or f.rule not in first:
            kept.append(f)
            ranks_of[id(f)] = [f.rank]
            if f.rank is not None:
                first[f.rule] = f
        else:
            ranks_of[id(first[f.rule])].append(f.rank)
    return kept, {k: sorted(v) for k, v in ranks_of.items()}


def heading(traces: tuple[TraceSummary, ...]) -> int | None:
    """The trace that heads the summary: the slowest timed one (with several ranks it sets the job's
    pace; the first of equals), else the first. A long run's later windows are other stretches of the same
    process, not ranks: window 1 heads."""
    timed = [i for i, t in enumerate(traces) if t.timed and (t.window or 1) == 1]
    if timed:
        return max(timed, key=lambda i: traces[i].figures.median_step_ms or 0.0)
    return 0 if traces else None

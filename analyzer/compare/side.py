"""One run of a comparison (a *side*), as typed data: the analysis's summary (`model.summary.RunSummary`,
the one every report format reads: traces, figures, memory, findings, the job) plus the few things a
comparison needs that the summary does not carry: each profiled step's time of the heading trace (for
the spread), its kernel and op totals (for what changed most), and its run.json facts (for what
differs).

`load_side(path)` analyses a run into a side, `Side.of(reports, label)` makes one of a ready analysis,
and the constructor takes the parts as data, so `compare` runs on hand-made sides as well (tests) and
never touches a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuadvise.analyzer.model.summary import RunSummary, TraceSummary, summarize

KEEP_TABLE_ROWS = 300  # kernels / ops per side kept for the diff (by total time)


@dataclass(frozen=True)
class Total:
    """One kernel's or op's total over the profiled steps."""

    name: str
    count: int
    total_ms: float


@dataclass(frozen=True)
class Side:
    label: str
    summary: RunSummary = field(default_factory=RunSummary)
    steps_ms: tuple[float, ...] = ()  # the heading trace's profiled steps (none without ProfilerSteps)
    kernels: tuple[Total, ...] = ()  # the heading trace's, by total time, at most KEEP_TABLE_ROWS
    ops: tuple[Total, ...] = ()
    facts: dict = field(default_factory=dict)  # the heading trace's run.json (empty for a trace from elsewhere)

    @property
    def head(self) -> TraceSummary | None:
        """The trace whose figures the side is compared on (the slowest rank of several)."""
        return self.summary.head

    @classmethod
    def of(cls, reports, label: str, facts: dict | None = None) -> Side:
        """A side of ready reports (`run.analyze`); `facts` maps a trace path to its run.json facts
        (default: the facts the reports were read with)."""
        if facts is None:
            facts = getattr(reports, "facts", None)
        summary = summarize(reports)
        if summary.heading is None:
            return cls(label=str(label), summary=summary)
        r = reports[summary.heading]
        m = r.metrics
        steps, kernels, ops = (), (), ()
        if m is not None:
            if m.steps and len(m.per_step):
                steps = tuple(round(float(v) / 1e3, 3) for v in m.per_step["dur_us"])
            kernels, ops = _totals(m.kernels), _totals(m.ops)
        return cls(label=str(label), summary=summary, steps_ms=steps, kernels=kernels, ops=ops,
                   facts=dict((facts or {}).get(r.source) or {}))


def load_side(path, jobs: int | None = None, cache: bool | None = None, label: str | None = None) -> Side:
    """Analyse one run (a run folder, a trace, or a folder of rank traces; or the sources
    `run.resolve_inputs` made of one) into a side. The run.json facts come with the reports."""
    from gpuadvise.analyzer import run

    reports = run.analyze(path if not isinstance(path, str) else [path], jobs=jobs, cache=cache)
    if label is None:
        label = path if isinstance(path, str) else " ".join(str(s.path) for s in path)
    return Side.of(reports, label=label)


def _totals(frame) -> tuple[Total, ...]:
    if frame is None or frame.empty:
        return ()
    rows = frame.head(KEEP_TABLE_ROWS)
    return tuple(Total(name=str(n), count=int(c), total_ms=round(float(t) / 1e3, 4))
                 for n, c, t in zip(rows["name"], rows["count"], rows["total_us"]))

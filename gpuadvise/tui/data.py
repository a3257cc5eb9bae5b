"""What every screen reads: the reports, their findings in order, and the timeline indexes (built
once, in a worker, because a 1 GB trace has millions of events)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpuadvise.analyzer.model.report import TraceReport
from gpuadvise.analyzer.model.findings import Finding
from gpuadvise.analyzer.model.summary import TraceSummary, summarize

from . import timeline_index
from .text import short_source

# Which lane a finding's evidence lives in, by topic; the timeline selects it when jumping there.
LANE_FOR_TOPIC = {
    "dataloader-stall": "dataloader",
    "pageable-memcpy": "runtime",
    "host-sync": "runtime",
}


@dataclass
class Jump:
    """A request to show a place in the timeline (from a finding, a table row, the palette)."""

    report: int
    start_us: float | None = None
    end_us: float | None = None
    step: int | None = None  # ProfilerStep number, when there is no time range
    marks: list[tuple[float, float]] = field(default_factory=list)  # evidence ranges to draw, µs
    lane_kind: str | None = None
    highlight: set[str] | None = None  # event names to highlight (e.g. the kernels a finding names)
    label: str = ""


class ViewData:
    def __init__(self, reports: list[TraceReport]):
        self.reports = reports
        self.summary = summarize(reports)  # what the overview shows, as every report format shows it
        self.findings: list[Finding] = list(self.summary.findings)
        traced = [i for i, r in enumerate(reports) if r.model is not None and r.metrics is not None]
        self.current = traced[0] if traced else 0
        self.pending_jump: Jump | None = None
        self._timelines: dict[int, timeline_index.TimelineIndex] = {}
        self._lock = threading.Lock()

    @property
    def report(self) -> TraceReport:
        return self.reports[self.current]

    @property
    def current_summary(self) -> TraceSummary:
        """The current trace's summary (the figures every report format quotes)."""
        return self.summary.traces[self.current]

    @property
    def has_trace(self) -> bool:
        return self.report.model is not None and self.report.metrics is not None

    def label(self, i: int | None = None) -> str:
        r = self.reports[self.current if i is None else i]
        rank = f" (rank {r.rank})" if r.rank is not None else ""
        return short_source(r.source) + rank

    def report_of(self, f: Finding) -> int:
        for i, r in enumerate(self.reports):
            if r.source == f.trace and r.rank == f.rank:
                return i
        return self.current

    def timeline(self, i: int | None = None) -> timeline_index.TimelineIndex | None:
        """The report's timeline index, built on first use (callers on the UI thread should check
        `timeline_ready` first and let the worker build it)."""
        i = self.current if i is None else i
        r = self.reports[i]
        if r.model is None or r.metrics is None:
            return None
        with self._lock:
            if i not in self._timelines:
                self._timelines[i] = timeline_index.build(r.model, r.metrics)
            return self._timelines[i]

    def timeline_ready(self, i: int | None = None) -> bool:
        return (self.current if i is None else i) in self._timelines

    def jump_for(self, f: Finding) -> Jump:
        """Where a finding's evidence is: its worst time range; else its first step, with the names it
        cites (kernels, ops) highlighted."""
        i = self.report_of(f)
        e = f.evidence
        marks = [(a * 1e3, b * 1e3) for a, b in e.time_ranges_ms]
        names = {str(item["name"]) for item in e.items if isinstance(item, dict) and item.get("name")}
        jump = Jump(report=i, marks=marks, lane_kind=LANE_FOR_TOPIC.get(f.topic, "gpu"), label=f"{f.rule} {f.title}")
        if marks:
            jump.start_us, jump.end_us = marks[0]  # rules list the worst range first
        else:
            jump.highlight = names or None  # no place in time: show where the named kernels/ops run
            jump.step = e.steps[0] if e.steps else None
        return jump

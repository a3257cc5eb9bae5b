"""Overview: the run's facts, its median step, every step's time split as a bar, GPU busy per step."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from gpuadvise.analyzer.model.report import overhead_words
from gpuadvise.analyzer.report import flops
from gpuadvise.analyzer.report.longrun import headline, sparkline

from ..text import clean, ms, pct, short_source
from ..widgets.charts import BusyChart, breakdown_bar, breakdown_legend
from ..widgets.table_view import Column, TableView
from .base import ViewScreen

BAR_WIDTH = 30
SEVERITY_STYLE = {"high": "bold red", "medium": "bold yellow", "low": "cyan", "info": "dim"}


class OverviewScreen(ViewScreen):
    MODE = "overview"
    HELP = """\
**Overview** — the run at a glance: device, versions and steps; the median step time; each step's
time split into GPU compute, communication, copies, GPU idle while waiting for data, and other GPU
idle; and GPU busy % per step (0–100 % scale). A run without a GPU timeline (a CPU run) shows where the
training thread spent each step instead: inside ops, waiting for data, in collectives, outside ops.

| key | does |
|---|---|
| ↑ ↓ PgUp PgDn | move in the steps table |
| s / r | sort by the next column / reverse |
| enter | open the selected step in the timeline |
"""
    DEFAULT_CSS = """
    OverviewScreen #facts { padding: 0 1; height: auto; }
    OverviewScreen #top-findings { padding: 0 1; height: auto; margin-top: 1; }
    OverviewScreen .caption { padding: 0 1; color: $text-muted; margin-top: 1; }
    OverviewScreen BusyChart { margin: 0 1; }
    OverviewScreen #steps { min-height: 5; }
    """

    def compose_body(self) -> ComposeResult:
        r = self.data.report
        with Vertical():
            yield Static(self._facts(), id="facts")
            yield Static(self._top_findings(), id="top-findings")
            figures = self.data.current_summary.figures
            if figures is not None and figures.cpu_steps:  # no GPU timeline: a step is the CPU's time
                yield Static("Steps — the training thread's time (no GPU timeline recorded)", classes="caption")
                yield TableView(_cpu_step_columns(), pd.DataFrame([asdict(s) for s in figures.cpu_steps]), title="steps",
                                filter_keys=(), sort="step", descending=False, id="steps")
            elif r.metrics is not None and len(r.metrics.per_step):
                ps = r.metrics.per_step
                first, last = int(ps["step"].iloc[0]), int(ps["step"].iloc[-1])
                span = f" #{first}–#{last}" if first >= 0 else ""
                yield Static(f"GPU busy per step{span} (0–100 %)", classes="caption")
                yield BusyChart(list(ps["step"]), list(ps["gpu_busy_pct"]), id="busy-chart")
                caption = Text("Steps — time split: ", style="")
                caption.append_text(breakdown_legend())
                yield Static(caption, classes="caption")
                yield TableView(_step_columns(), _step_frame(ps), title="steps", filter_keys=(), sort="step",
                                descending=False, id="steps")

    def focus_main(self) -> None:
        tables = self.query(TableView)
        if tables:
            tables.first().focus()

    def on_table_view_selected(self, event: TableView.Selected) -> None:
        from ..data import Jump

        step = int(event.row["step"])
        self.app.jump_to(Jump(report=self.data.current, step=step if step >= 0 else None))

    def _facts(self) -> Text:
        """The trace's summary (the figures every report format quotes), with the device details and
        versions its model records."""
        r, summary = self.data.report, self.data.current_summary
        t = Text(no_wrap=False, end="")

        def row(label: str, value: Text | str) -> None:
            if len(t):
                t.append("\n")
            t.append(f"{label:<10} ", style="bold")
            t.append_text(value if isinstance(value, Text) else Text(value))

        rank = f"  (rank {summary.rank})" if summary.rank is not None else ""
        row("Trace", Text(clean(short_source(summary.source)) + rank))
        if r.model is None or r.metrics is None or not summary.timed:
            row("Kind", "memory snapshot" if summary.kind == "snapshot" else summary.kind)
            for note in summary.notes:
                row("Note", Text(clean(note)))
            return t
        s = summary.figures
        m, meta = r.metrics, r.model.meta
        dev = r.model.device
        if s.device_description:
            row("Device", clean(s.device_description))
        elif dev is not None:
            parts = [clean(dev.name)]
            if dev.compute_major is not None:
                parts.append(f"sm {dev.compute_major}.{dev.compute_minor}")
            if dev.num_sms:
                parts.append(f"{dev.num_sms} SMs")
            if dev.total_memory:
                parts.append(f"{dev.total_memory / 2**30:.1f} GiB")
            parts.append(meta.platform.upper() if meta.platform != "unknown" else "platform unknown")
            row("Device", " · ".join(parts))
        else:
            row("Device", "not recorded in the trace")
        versions = ", ".join(f"{clean(k)} {clean(v)}" for k, v in meta.versions.items()) or "not recorded"
        row("Versions", versions)
        if s.steps:
            nums = s.step_numbers
            if s.steps == 1:
                row("Steps", f"1 (#{nums[0]}) · step {s.median_step_ms:,.2f} ms · window {s.window_ms:,.2f} ms")
            else:
                row("Steps", f"{s.steps} (#{nums[0]}–#{nums[-1]}) · median step {s.median_step_ms:,.2f} ms · "
                             f"window {s.window_ms:,.2f} ms")
        else:
            row("Steps", f"no ProfilerStep marks: the whole trace ({s.window_ms:,.2f} ms) is one window")
        if s.one_time_note:
            row("One-time", clean(s.one_time_note))
        if s.unprofiled_median_step_ms:
            row("Unprofiled", f"median step {s.unprofiled_median_step_ms:.2f} ms outside the window · "
                              f"{overhead_words(s.profiler_overhead_x)}")
        if m.has_gpu:
            temporal = s.temporal_breakdown
            row("GPU", f"busy {pct(s.gpu_busy_in_steps_pct)} inside the steps, {pct(s.gpu_busy_pct)} of its active span · "
                       f"compute {pct(temporal.get('compute_pct'))} · idle {pct(temporal.get('idle_pct'))}")
        else:
            row("GPU", Text("no GPU activity in this trace", style="yellow"))
        mfu = flops.labelled(s.flops)
        if mfu:  # MFU with its denominator, or the FLOPs where there is no peak, or what is missing
            row(mfu[0], clean(" ".join([mfu[1], *flops.qualifiers(s.flops)])))
        row("Events", f"{s.events:,} · {s.kernels:,} kernels of {len(m.kernels):,} kinds · "
                      f"{len(r.model.copies):,} copies")
        run = self.data.long_run_of()
        if run is not None:  # a long run: the whole run's step time, and where this window sits in it
            row("Run", clean(headline(run.summary)))
            chart = run.summary.get("chart") or {}
            level = (run.summary.get("levels") or {}).get("slow_ms")
            if chart.get("ms"):
                line = Text(sparkline(chart["ms"], width=56, level_ms=level), style="cyan")
                line.append(f"  steps {chart['step'][0]}–{chart['step'][-1]}", style="dim")
                row("Step time", line)
            if r.window is not None:
                w = next((w for w in run.summary.get("windows") or [] if w["index"] == r.window), None)
                if w is not None:
                    row("Window", clean(f"{w['index']} of {len(run.summary['windows'])}: {w['trigger']}"
                                        + (f" — {w['detail']}" if w.get("detail") else "")))
        for note in summary.notes:
            row("Note", Text(clean(note), style="yellow"))
        return t

    def _top_findings(self) -> Text:
        fs = [f for f in self.data.findings if self.data.report_of(f) == self.data.current]
        t = Text(end="")
        if not fs:
            t.append("No findings for this trace.", style="dim")
            return t
        t.append(f"Top findings ({min(len(fs), 3)} of {len(fs)})", style="bold")
        t.append("  · press 2 for all of them with their evidence and fix\n", style="dim")
        for i, f in enumerate(fs[:3], 1):
            saving = f"{'≤' if f.impact.upper_bound else ''}{f.impact.est_step_saving_pct:.1f} %"
            t.append(f" {i}. ")
            t.append(f"{saving:>8}", style=SEVERITY_STYLE.get(f.severity, ""))
            t.append("  ")
            t.append(clean(f.title))
            if i < min(len(fs), 3):
                t.append("\n")
        return t


def _step_columns() -> list[Column]:
    return [
        Column("step", "Step", 6, fmt=lambda v: f"#{int(v)}" if v >= 0 else "all"),
        Column("dur_us", "Time ms", 9, fmt=ms),
        Column("gpu_busy_pct", "GPU busy", 8, fmt=pct),
        Column("bar", "Breakdown", BAR_WIDTH, align="left", sortable=False),
        Column("kernel_us", "Compute", 8, fmt=ms),
        Column("comm_us", "Comm", 7, fmt=ms),
        Column("memcpy_us", "Memcpy", 7, fmt=ms),
        Column("dataloader_us", "Loader", 8, fmt=ms),
        Column("sync_us", "Sync", 7, fmt=ms),
        Column("idle_us", "Idle", 8, fmt=ms),
    ]


def _cpu_step_columns() -> list[Column]:
    """A run without a GPU timeline (model.report.CpuStep): where the training thread spent each step."""
    return [
        Column("step", "Step", 6, fmt=lambda v: f"#{int(v)}" if v >= 0 else "all"),
        Column("ms", "Time ms", 9, fmt=lambda v: f"{v:.2f}"),
        Column("in_ops_ms", "In ops", 8, fmt=lambda v: f"{v:.2f}"),
        Column("loader_wait_ms", "Loader wait", 11, fmt=lambda v: f"{v:.2f}"),
        Column("collective_wait_ms", "Collectives", 11, fmt=lambda v: f"{v:.2f}"),
        Column("outside_ops_ms", "Outside ops", 11, fmt=lambda v: f"{v:.2f}"),
    ]


def _step_frame(ps: pd.DataFrame) -> pd.DataFrame:
    frame = ps.copy()
    for col in ("kernel_us", "comm_us", "memcpy_us", "memset_us", "dataloader_us", "sync_us", "idle_us"):
        if col not in frame:
            frame[col] = 0.0
    frame["bar"] = [breakdown_bar(row, BAR_WIDTH) for _, row in frame.iterrows()]
    frame["gpu_busy_pct"] = frame["gpu_busy_pct"].astype(float).replace([np.inf, -np.inf], np.nan)
    return frame

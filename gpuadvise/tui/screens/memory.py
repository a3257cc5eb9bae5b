"""Memory: allocated and reserved device memory over the trace, from the profiler's `[memory]`
events (profile_memory=True). Without them the screen says there is no memory data."""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from ..text import ms, nbytes
from ..widgets.charts import MemoryChart
from .base import ViewScreen


class MemoryScreen(ViewScreen):
    MODE = "memory"
    HELP = """\
**Memory** — device memory over the trace from the profiler's memory events (`profile_memory=True`):
allocated (solid) and reserved by the caching allocator (shaded). Older traces carry only each
allocation's size; then the chart shows the change in allocated memory since the trace began.

| key | does |
|---|---|
| d | next device |
"""
    BINDINGS = [Binding("d", "next_device", "Next device")]
    DEFAULT_CSS = """
    MemoryScreen #memory-stats { padding: 0 1; height: auto; }
    MemoryScreen #memory-legend { padding: 0 1; height: 1; color: $text-muted; }
    MemoryScreen MemoryChart { margin: 1 1 0 1; }
    MemoryScreen #no-memory { padding: 1 2; }
    """

    def __init__(self):
        super().__init__()
        self.device_pos = 0

    def devices(self) -> list[tuple[int, int]]:
        """(device_type, device) pairs with memory events, GPUs first."""
        mem = _memory(self.data.report)
        if mem.empty:
            return []
        keys = mem.groupby(["device_type", "device"]).size().index
        return sorted(((int(t), int(d)) for t, d in keys), key=lambda k: (k[0] != 1, k))

    def compose_body(self) -> ComposeResult:
        devices = self.devices()
        if not devices:
            yield Static(_no_memory(self.data.report), id="no-memory")
            return
        self.device_pos %= len(devices)
        dtype, dev = devices[self.device_pos]
        mem = _memory(self.data.report)
        rows = mem[(mem["device_type"] == dtype) & (mem["device"] == dev)].sort_values("ts", kind="stable")
        ts = rows["ts"].to_numpy(dtype=float)
        has_totals = rows["total_allocated"].notna().any()
        if has_totals:
            allocated = rows["total_allocated"].ffill().fillna(0).to_numpy(dtype=float)
            reserved = rows["total_reserved"].ffill().to_numpy(dtype=float) if rows["total_reserved"].notna().any() else None
        else:  # only per-event sizes: the running sum is the change since the trace began
            allocated = np.cumsum(rows["bytes"].fillna(0).to_numpy(dtype=float))
            allocated = allocated - min(float(allocated.min()), 0.0)
            reserved = None
        m = self.data.report.metrics
        window = (0.0, max(float(ts.max()) if len(ts) else 1.0, m.window[1] if m is not None else 1.0))
        yield Static(self._stats(rows, dtype, dev, allocated, reserved, has_totals, len(devices)), id="memory-stats")
        yield MemoryChart(ts, allocated, reserved, window, id="memory-chart")
        legend = Text("█ allocated", style="#5fafd7")
        if reserved is not None:
            legend.append("   ░ reserved", style="#5f5f87")
        legend.append(f"   time: 0 – {ms(window[1])} ms from trace start", style="dim")
        yield Static(legend, id="memory-legend")

    def _stats(self, rows: pd.DataFrame, dtype: int, dev: int, allocated, reserved, has_totals, n_devices) -> Text:
        name = f"GPU {dev}" if dtype == 1 else ("CPU" if dtype == 0 else f"device type {dtype} #{dev}")
        t = Text(end="")
        t.append(f"{name}", style="bold")
        if n_devices > 1:
            t.append(f"  ({self.device_pos + 1} of {n_devices}; d: next device)", style="dim")
        sizes = rows["bytes"].to_numpy(dtype=float)
        allocs = sizes[sizes > 0]
        t.append(f"\n{len(rows):,} memory events · {len(allocs):,} allocations · {int((sizes < 0).sum()):,} frees")
        if len(allocs):
            t.append(f" · largest allocation {nbytes(allocs.max())}")
        if has_totals:
            peak = int(np.argmax(allocated))
            t.append(f"\npeak allocated {nbytes(allocated.max())} at {ms(rows['ts'].iloc[peak])} ms · "
                     f"at the end {nbytes(allocated[-1])}")
            if reserved is not None and np.isfinite(reserved).any():
                t.append(f" · peak reserved {nbytes(np.nanmax(reserved))}")
        else:
            t.append(f"\nthis trace records no totals: chart shows allocated memory relative to the trace start "
                     f"(peak +{nbytes(allocated.max())})", style="yellow")
        return t

    async def action_next_device(self) -> None:
        n = len(self.devices())
        if n > 1:
            self.device_pos = (self.device_pos + 1) % n
            await self.recompose()


def _memory(report) -> pd.DataFrame:
    if report.model is None:
        return pd.DataFrame()
    return report.model.memory


def _no_memory(report) -> Text:
    t = Text("No memory data.\n\n", style="bold")
    if report.model is None:
        t.append("This file is a memory snapshot; its summary is on the Overview.")
        return t
    t.append("The trace holds no memory events. Record them with torch.profiler's "
             "profile_memory=True; `gpuadvise profile` on a GPU also records the allocator's history.")
    return t

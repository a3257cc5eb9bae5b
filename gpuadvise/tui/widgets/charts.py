"""Small charts drawn with block characters: GPU busy per step, and memory over time.

Both bucket their series into one value per screen column (the maximum, so peaks never vanish) and
draw with eighth blocks, so a trace with 10^6 memory events costs one `np.maximum.reduceat`."""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from ..text import nbytes

EIGHTHS = " ▁▂▃▄▅▆▇█"
AXIS = Style(color="#8a8a8a")


def bucket_max(x: np.ndarray, y: np.ndarray, lo: float, hi: float, columns: int) -> np.ndarray:
    """Max of y per column over [lo, hi) split in `columns`; NaN where a column holds no sample.
    Columns after the last sample carry its value (memory stays where it was)."""
    out = np.full(columns, np.nan)
    if not len(x) or columns <= 0 or hi <= lo:
        return out
    col = np.clip(((x - lo) / (hi - lo) * columns).astype(np.int64), 0, columns - 1)
    order = np.argsort(col, kind="stable")
    col, ys = col[order], y[order]
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    out[col[starts]] = np.maximum.reduceat(ys, starts)
    # a level holds until the next sample: fill gaps forward
    idx = np.where(~np.isnan(out), np.arange(columns), 0)
    np.maximum.accumulate(idx, out=idx)
    filled = out[idx]
    filled[: col[0]] = np.nan
    return filled


def column_bars(values: np.ndarray, height: int, row: int) -> list[str]:
    """The characters of chart row `row` (0 = top) for bar heights `values` in 0..1."""
    levels = np.nan_to_num(values, nan=0.0) * height * 8
    floor = (height - 1 - row) * 8  # eighths below this row
    fill = np.clip(levels - floor, 0, 8).round().astype(int)
    return [EIGHTHS[f] for f in fill]


class BusyChart(Widget):
    """GPU busy % of each step as bars on a fixed 0–100 % scale (a busy GPU reads as a full bar),
    with the step numbers under the bars when they fit."""

    DEFAULT_CSS = "BusyChart { height: 6; }"
    AXIS_WIDTH = 6
    MAX_BAR = 5

    def __init__(self, steps: list[int], busy_pct: list[float], *, id: str | None = None):
        super().__init__(id=id)
        self.steps = [int(s) for s in steps]
        self.busy = np.asarray(busy_pct, dtype=float)

    def _layout(self, width: int) -> int:
        """Bar width in columns (0 when the steps are bucketed, more steps than columns)."""
        n = len(self.busy)
        if n == 0 or n * 2 > width:
            return 0
        return max(min(width // n - 1, self.MAX_BAR), 1)

    def _values(self, width: int) -> np.ndarray:
        n = len(self.busy)
        if n == 0 or width <= 0:
            return np.zeros(max(width, 0))
        bar = self._layout(width)
        if bar:  # one bar per step, a blank column between bars
            vals = np.full(width, np.nan)
            for i, v in enumerate(self.busy):
                vals[i * (bar + 1): i * (bar + 1) + bar] = v / 100
            return vals
        # more steps than columns: the lowest busy % of the steps in each column (the worst shows)
        edges = np.linspace(0, n, width + 1).astype(int)
        return np.array([self.busy[a:max(b, a + 1)].min() / 100 for a, b in zip(edges[:-1], edges[1:])])

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        plot = width - self.AXIS_WIDTH
        bar = self._layout(plot)
        rows = height - 1 if bar >= 3 else height  # last line: step numbers, when bars are wide enough
        if y == rows:
            labels = [" "] * plot
            for i, s in enumerate(self.steps):
                text = f"#{s}"[:bar]
                for k, ch in enumerate(text):
                    labels[i * (bar + 1) + k] = ch
            return Strip([Segment(" " * self.AXIS_WIDTH, AXIS), Segment("".join(labels), AXIS)]).crop_extend(
                0, width, self.rich_style).apply_style(self.rich_style)
        axis = {0: "100% ", rows // 2: " 50% ", rows - 1: "  0% "}.get(y, "     ")
        chars = column_bars(self._values(plot), rows, y)
        colour = Style(color="#5faf5f")
        return Strip([Segment(axis + "┤", AXIS), Segment("".join(chars), colour)]).crop_extend(
            0, width, self.rich_style).apply_style(self.rich_style)


class MemoryChart(Widget):
    """Allocated (solid) and reserved (shaded) memory over the trace, one column per time bucket."""

    DEFAULT_CSS = "MemoryChart { height: 1fr; min-height: 6; }"
    AXIS_WIDTH = 11

    def __init__(self, ts: np.ndarray, allocated: np.ndarray, reserved: np.ndarray | None, window: tuple[float, float],
                 *, id: str | None = None):
        super().__init__(id=id)
        self.ts = ts
        self.allocated = allocated
        self.reserved = reserved
        self.window = window
        self._cache: tuple | None = None

    def _series(self, columns: int):
        if self._cache is None or self._cache[0] != columns:
            lo, hi = self.window
            alloc = bucket_max(self.ts, self.allocated, lo, hi, columns)
            res = bucket_max(self.ts, self.reserved, lo, hi, columns) if self.reserved is not None else None
            top = np.nanmax([np.nanmax(alloc) if np.isfinite(alloc).any() else 0,
                             np.nanmax(res) if res is not None and np.isfinite(res).any() else 0])
            self._cache = (columns, alloc, res, max(float(top), 1.0))
        return self._cache[1:]

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        plot = max(width - self.AXIS_WIDTH - 1, 1)
        alloc, res, top = self._series(plot)
        if y == 0:
            label = nbytes(top)
        elif y == height - 1:
            label = nbytes(0)
        elif y == height // 2:
            label = nbytes(top / 2)
        else:
            label = ""
        segments = [Segment(label.rjust(self.AXIS_WIDTH - 1) + " ┤", AXIS)]
        a = column_bars(alloc / top, height, y)
        r = column_bars(res / top, height, y) if res is not None else [" "] * plot
        alloc_style, res_style = Style(color="#5fafd7"), Style(color="#5f5f87")
        for ca, cr in zip(a, r):
            if ca != " ":
                segments.append(Segment(ca, alloc_style))
            elif cr != " ":
                segments.append(Segment("░", res_style))
            else:
                segments.append(Segment(" "))
        return Strip(segments).crop_extend(0, width, self.rich_style).apply_style(self.rich_style)


BREAKDOWN_PARTS = (
    ("compute", "#5faf5f"),
    ("comm", "#af5fd7"),
    ("memcpy", "#d7af00"),
    ("data loader", "#ff8700"),
    ("idle", "#4e4e4e"),
)


def breakdown_parts(row) -> list[float]:
    """A step's time split for the bar, in µs: GPU compute, communication, copies (memcpy + memset),
    GPU idle while the training thread waited for data, and the rest of the GPU idle time. The first
    three are unions of GPU activity; the data-loader part is capped at the idle time so the bar adds up."""
    dur = max(float(row["dur_us"]), 1e-9)
    compute = float(row.get("kernel_us", 0.0))
    comm = float(row.get("comm_us", 0.0))
    copies = float(row.get("memcpy_us", 0.0)) + float(row.get("memset_us", 0.0))
    idle = max(float(row.get("idle_us", dur - compute - comm - copies)), 0.0)
    loader = min(float(row.get("dataloader_us", 0.0)), idle)
    parts = [compute, comm, copies, loader, idle - loader]
    total = sum(parts)
    return [p * dur / total for p in parts] if total > dur else parts


def breakdown_bar(row, width: int) -> Text:
    """The breakdown as a bar `width` cells wide (cumulative rounding keeps the total exact)."""
    parts = breakdown_parts(row)
    dur = max(float(row["dur_us"]), 1e-9)
    text = Text(no_wrap=True, end="")
    done = 0
    acc = 0.0
    for (_, colour), value in zip(BREAKDOWN_PARTS, parts):
        acc += value
        upto = min(int(round(acc / dur * width)), width)
        if upto > done:
            text.append("█" * (upto - done), style=colour)
            done = upto
    if done < width:
        text.append("█" * (width - done), style=BREAKDOWN_PARTS[-1][1])
    return text


def breakdown_legend() -> Text:
    text = Text(no_wrap=True, end="")
    for i, (name, colour) in enumerate(BREAKDOWN_PARTS):
        if i:
            text.append("  ")
        text.append("█ ", style=colour)
        text.append(name)
    return text

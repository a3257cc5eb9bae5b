"""The timeline: lanes of CPU threads and GPU streams over one step, drawn with the Line API.

Each line is one lane. To draw it, the widget splits the visible time range into one window per
screen column and asks the lane's numpy index which event covers each window and how busy the window
is (`TimelineIndex` / `Lane`), so drawing costs O(columns · log events) whatever the trace size.
Shading shows how much of a column is busy; when an event spans several columns its name is written
inside the bar.
"""

from __future__ import annotations

import math

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .. import timeline_index as ti
from ..text import clean

LABEL_WIDTH = 26
HEADER_ROWS = 2  # time axis, evidence marks
MIN_US_PER_COLUMN = 0.01
SHADES = ((0.75, "█"), (0.5, "▓"), (0.25, "▒"), (0.0, "░"))

COLOURS = {
    ti.OP: "#5f87af", ti.ANNOTATION: "#8787d7", ti.DATALOADER: "#ff8700", ti.LAUNCH: "#5fafd7",
    ti.COPY_CALL: "#d7d75f", ti.SYNC_CALL: "#ff5f5f", ti.RUNTIME: "#808080", ti.KERNEL: "#5faf5f",
    ti.COMM: "#af5fd7", ti.MEMCPY: "#d7af00", ti.MEMSET: "#00afaf", ti.GPU_SYNC: "#ff5f87", ti.EVIDENCE: "#ffd700",
}
BAR = {code: Style(color=c) for code, c in COLOURS.items()}
LABELLED = {code: Style(color="#000000", bgcolor=c) for code, c in COLOURS.items()}
DIM = Style(color="#3a3a3a")
CURSOR = Style(reverse=True)
AXIS = Style(color="#8a8a8a")
LANE_LABEL = Style(color="#afafaf")
LANE_LABEL_GPU = Style(color="#87d787")
SELECTED_LABEL = Style(color="#000000", bgcolor="#d7af5f", bold=True)


class TimelineView(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    TimelineView { height: 1fr; scrollbar-size-horizontal: 0; }
    """
    BINDINGS = [
        Binding("left", "cursor(-1)", "◀", show=False),
        Binding("right", "cursor(1)", "▶", show=False),
        Binding("up", "lane(-1)", "Lane up", show=False),
        Binding("down", "lane(1)", "Lane down", show=False),
        Binding("shift+left,h", "pan(-0.25)", "Pan ◀", show=False),
        Binding("shift+right,l", "pan(0.25)", "Pan ▶", show=False),
        Binding("plus,equals_sign,i", "zoom(0.5)", "Zoom in"),
        Binding("minus,o", "zoom(2)", "Zoom out"),
        Binding("0", "fit", "Fit"),
        Binding("enter", "zoom_item", "Zoom to item", show=False),
        Binding("left_square_bracket", "step(-1)", "Prev step"),
        Binding("right_square_bracket", "step(1)", "Next step"),
        Binding("n", "mark(1)", "Evidence"),
        Binding("N", "mark(-1)", "Prev evidence", show=False),
        Binding("full_stop", "event(1)", "Next event", show=False),
        Binding("comma", "event(-1)", "Prev event", show=False),
        Binding("home", "edge(0)", "Step start", show=False),
        Binding("end", "edge(1)", "Step end", show=False),
    ]

    class Changed(Message):
        """View, cursor or lane changed: the screen redraws its info line and the details."""

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.index: ti.TimelineIndex | None = None
        self.step_pos = 0
        self.t0 = 0.0
        self.span = 1.0
        self.cursor_t = 0.0
        self.lane = 0
        self.marks: ti.Lane | None = None
        self.highlight: list[ti.Lane] | None = None  # per lane, the events matching the highlight
        self.highlight_label = ""

    # -- state -------------------------------------------------------------------------------------
    def set_index(self, index: ti.TimelineIndex | None) -> None:
        self.index = index
        self.marks = None
        self.highlight = None
        self.highlight_label = ""
        self.lane = 0
        self.step_pos = 0
        if index is not None:
            self.show_step(0)
        self._resize()
        self.refresh()

    @property
    def bar_width(self) -> int:
        return max(self.scrollable_content_region.width - LABEL_WIDTH, 1)

    @property
    def us_per_column(self) -> float:
        return self.span / self.bar_width

    @property
    def step(self) -> tuple[int, float, float]:
        return self.index.steps[self.step_pos]

    def _limits(self) -> tuple[float, float]:
        """The view stays on the current step (with a small margin either side)."""
        _, lo, hi = self.step
        margin = max((hi - lo) * 0.02, 1.0)
        return lo - margin, hi + margin

    def _clamp(self) -> None:
        lo, hi = self._limits()
        self.span = min(max(self.span, MIN_US_PER_COLUMN * self.bar_width), hi - lo)
        self.t0 = min(max(self.t0, lo), hi - self.span)
        self.cursor_t = min(max(self.cursor_t, self.t0), self.t0 + self.span - 1e-9)

    def _changed(self) -> None:
        self._clamp()
        self.refresh()
        self.post_message(self.Changed())

    def show_step(self, pos: int, cursor_t: float | None = None) -> None:
        if self.index is None:
            return
        self.step_pos = min(max(pos, 0), len(self.index.steps) - 1)
        lo, hi = self._limits()
        self.t0, self.span = lo, hi - lo
        self.cursor_t = self.step[1] if cursor_t is None else cursor_t
        self._changed()

    def show_range(self, start: float, end: float, lane_kind: str | None = None) -> None:
        """Centre [start, end) with room either side, on the step that holds it; cursor on its start."""
        if self.index is None:
            return
        self.step_pos = self.index.step_at(start)
        width = max(end - start, MIN_US_PER_COLUMN * self.bar_width)
        self.span = width * 2.0
        self.t0 = start - width * 0.5
        self.cursor_t = start
        if lane_kind:
            self.select_lane_kind(lane_kind)
        self._changed()

    def select_lane_kind(self, kind: str) -> None:
        if self.index is not None:
            i = self.index.lane_of_kind(kind)
            if i is not None:
                self._select_lane(i)

    def set_marks(self, ranges_us: list[tuple[float, float]], label: str = "evidence") -> None:
        self.marks = ti.evidence_lane(ranges_us, label) if ranges_us else None
        self.refresh()

    def set_highlight(self, query: str | set[str] | None, label: str = "") -> None:
        """Highlight events whose name contains `query` (case-insensitive) or is in a set of names;
        the rest is dimmed. None or "" clears it."""
        if self.index is None or not query:
            self.highlight, self.highlight_label = None, ""
        else:
            by_names: dict[int, np.ndarray] = {}
            subs = []
            for lane in self.index.lanes:
                key = id(lane.names)
                if key not in by_names:  # lanes of one frame share their names: match each once
                    if isinstance(query, set):
                        by_names[key] = np.asarray(lane.names.isin(list(query)), dtype=bool)
                    else:
                        by_names[key] = np.asarray(lane.names.str.contains(query, case=False, regex=False), dtype=bool)
                subs.append(lane.matching(by_names[key]))
            self.highlight = subs
            self.highlight_label = label or (query if isinstance(query, str) else f"{len(query)} names")
        self.refresh()
        self.post_message(self.Changed())

    def item_at_cursor(self) -> tuple[ti.Lane, int, int] | None:
        """(lane, event index, events in the cursor's column) under the cursor, or None."""
        if self.index is None or not self.index.lanes:
            return None
        lane = self.index.lanes[self.lane]
        a = self.t0 + math.floor((self.cursor_t - self.t0) / self.us_per_column) * self.us_per_column
        b = a + self.us_per_column
        hit = int(lane.hit(np.array([a]), np.array([b]))[0])
        if hit < 0:
            return None
        return lane, hit, lane.count(a, b)

    # -- actions -----------------------------------------------------------------------------------
    def action_cursor(self, columns: int) -> None:
        self.cursor_t += columns * self.us_per_column
        if self.cursor_t < self.t0:
            self.t0 = self.cursor_t
        elif self.cursor_t >= self.t0 + self.span:
            self.t0 = self.cursor_t - self.span + self.us_per_column
        self._changed()

    def action_pan(self, fraction: float) -> None:
        shift = fraction * self.span
        self.t0 += shift
        self.cursor_t += shift
        self._changed()

    def action_zoom(self, factor: float) -> None:
        frac = (self.cursor_t - self.t0) / self.span if self.span else 0.5
        self.span *= factor
        self._clamp()
        self.t0 = self.cursor_t - frac * self.span
        self._changed()

    def action_fit(self) -> None:
        self.show_step(self.step_pos, cursor_t=self.cursor_t)

    def action_step(self, delta: int) -> None:
        if self.index is not None:
            self.show_step(self.step_pos + delta)

    def action_edge(self, end: int) -> None:
        lo, hi = self._limits()
        self.cursor_t = hi if end else lo
        self.t0 = hi - self.span if end else lo
        self._changed()

    def action_lane(self, delta: int) -> None:
        if self.index is not None and self.index.lanes:
            self._select_lane(self.lane + delta)
            self._changed()

    def action_zoom_item(self) -> None:
        item = self.item_at_cursor()
        if item is not None:
            lane, i, _ = item
            self.show_range(float(lane.starts[i]), float(lane.ends[i]))

    def action_mark(self, direction: int) -> None:
        """Move to the next (or previous) evidence range, across steps."""
        if self.marks is None or not len(self.marks):
            self.notify("No evidence ranges to visit: open a finding with time evidence and press enter.",
                        severity="warning")
            return
        k = self.marks.next_start(self.cursor_t, forward=direction > 0)
        if k < 0:  # wrap around
            k = 0 if direction > 0 else len(self.marks) - 1
        self.show_range(float(self.marks.starts[k]), float(self.marks.ends[k]))

    def action_event(self, direction: int) -> None:
        if self.index is None or not self.index.lanes:
            return
        lane = self.index.lanes[self.lane]
        k = lane.next_start(self.cursor_t, forward=direction > 0)
        if k < 0:
            return
        t = float(lane.starts[k])
        if t < self._limits()[0] or t > self._limits()[1]:
            self.step_pos = self.index.step_at(t)
        self.cursor_t = t
        if not self.t0 <= t < self.t0 + self.span:
            self.t0 = t - self.span / 2
        self._changed()

    def _select_lane(self, i: int) -> None:
        self.lane = min(max(i, 0), len(self.index.lanes) - 1)
        visible = max(self.scrollable_content_region.height - HEADER_ROWS, 1)
        if self.lane < self.scroll_y:
            self.scroll_to(y=self.lane, animate=False)
        elif self.lane >= self.scroll_y + visible:
            self.scroll_to(y=self.lane - visible + 1, animate=False)

    def on_click(self, event: Click) -> None:
        if self.index is None:
            return
        if event.x >= LABEL_WIDTH:
            self.cursor_t = self.t0 + (event.x - LABEL_WIDTH + 0.5) * self.us_per_column
        if event.y >= HEADER_ROWS and self.index.lanes:
            self._select_lane(int(self.scroll_y) + event.y - HEADER_ROWS)
        self._changed()

    # -- drawing -----------------------------------------------------------------------------------
    def _resize(self) -> None:
        lanes = len(self.index.lanes) if self.index is not None else 0
        self.virtual_size = Size(self.scrollable_content_region.width, lanes + HEADER_ROWS)

    def on_resize(self) -> None:
        self._resize()
        if self.index is not None:
            self._clamp()

    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        upc = self.us_per_column
        left = self.t0 + np.arange(self.bar_width) * upc
        return left, left + upc

    def _cursor_column(self) -> int:
        return int(math.floor((self.cursor_t - self.t0) / self.us_per_column))

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if self.index is None:
            return Strip.blank(width, self.rich_style)
        if y == 0:
            return self._axis(width)
        if y == 1:
            label = f"evidence: {self.marks.label}" if self.marks is not None else ""
            return self._row(label, self.marks, None, width, LANE_LABEL, empty_char="─" if self.marks else " ")
        lane_no = int(self.scroll_y) + y - HEADER_ROWS
        if lane_no >= len(self.index.lanes):
            return Strip.blank(width, self.rich_style)
        lane = self.index.lanes[lane_no]
        hl = self.highlight[lane_no] if self.highlight is not None else None
        label_style = SELECTED_LABEL if lane_no == self.lane else (LANE_LABEL_GPU if lane.stream else LANE_LABEL)
        return self._row(lane.label, lane, hl, width, label_style, highlight=self.highlight is not None)

    def _row(self, label: str, lane: ti.Lane | None, hl: ti.Lane | None, width: int, label_style: Style,
             highlight: bool = False, empty_char: str = " ") -> Strip:
        base = self.rich_style
        segments = [Segment(_pad(clean(label), LABEL_WIDTH - 1), label_style), Segment(" ", base)]
        w = self.bar_width
        cursor = self._cursor_column()
        if lane is None or not len(lane):
            cells = [(empty_char, DIM if empty_char != " " else base)] * w
        else:
            a, b = self._edges()
            hit = lane.hit(a, b)
            busy = lane.busy(a, b)
            lit = hl.hit(a, b) >= 0 if (highlight and hl is not None) else None
            cells = self._cells(lane, hit, busy, lit, base)
        if 0 <= cursor < w:
            ch, st = cells[cursor]
            cells[cursor] = (ch if ch.strip() else "│", st + CURSOR)
        segments.extend(_merge(cells))
        return Strip(segments).crop_extend(0, width, base).apply_style(base)  # one background throughout

    def _cells(self, lane: ti.Lane, hit: np.ndarray, busy: np.ndarray, lit: np.ndarray | None, base: Style):
        w = len(hit)
        cells: list[tuple[str, Style]] = []
        for c in range(w):
            i = hit[c]
            if i < 0:
                cells.append((" ", base))
                continue
            code = int(lane.styles[i])
            style = BAR[code] if lit is None or lit[c] else DIM
            b = busy[c]
            ch = next((s for threshold, s in SHADES if b > threshold), "▏")
            cells.append((ch if b < 0.999 else "█", style))
        # Write names inside bars that span at least 4 full columns.
        c = 0
        while c < w:
            i = hit[c]
            run = c
            while run < w and hit[run] == i and busy[run] >= 0.999:
                run += 1
            if i >= 0 and run - c >= 4 and (lit is None or lit[c]):
                name = clean(lane.name(i))
                label = _pad(" " + name, run - c)
                style = LABELLED[int(lane.styles[i])]
                for k, ch in enumerate(label):
                    cells[c + k] = (ch, style)
            c = max(run, c + 1)
        return cells

    def _axis(self, width: int) -> Strip:
        base = self.rich_style
        number, lo, _ = self.step
        label = f"ms from step #{number}" if number >= 0 else "ms from window start"
        w = self.bar_width
        upc = self.us_per_column
        tick = _nice(upc * 14)
        chars = [" "] * w
        first = math.ceil((self.t0 - lo) / tick) * tick
        t = first
        while True:
            col = int(round((lo + t - self.t0) / upc))
            if col >= w:
                break
            text = "╷" + _fmt_ms(t, tick)
            if col >= 0 and col + len(text) <= w:  # a label cut at the edge would misread (14 for 140)
                for k, ch in enumerate(text):
                    chars[col + k] = ch
            t += tick
        cursor = self._cursor_column()
        segments = [Segment(_pad(label, LABEL_WIDTH - 1), AXIS), Segment(" ", base), Segment("".join(chars), AXIS)]
        strip = Strip(segments).crop_extend(0, width, base).apply_style(base)
        if 0 <= cursor < w:  # a ▼ over the cursor column
            left = strip.crop(0, LABEL_WIDTH + cursor)
            right = strip.crop(LABEL_WIDTH + cursor + 1, width)
            strip = Strip.join([left, Strip([Segment("▼", base + Style(color="#ffd700", bold=True))]), right])
        return strip


def _merge(cells: list[tuple[str, Style]]) -> list[Segment]:
    """Consecutive cells of one style as one segment (fewer segments, faster compositing)."""
    out: list[Segment] = []
    text, style = "", None
    for ch, st in cells:
        if st is style or st == style:
            text += ch
        else:
            if text:
                out.append(Segment(text, style))
            text, style = ch, st
    if text:
        out.append(Segment(text, style))
    return out


def _pad(text: str, width: int) -> str:
    if len(text) > width:
        return text[: max(width - 1, 0)] + "…"
    return text.ljust(width)


def _nice(x: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at or above x."""
    if x <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * p >= x:
            return m * p
    return 10 * p


def _fmt_ms(t_us: float, tick_us: float) -> str:
    decimals = max(0, -int(math.floor(math.log10(tick_us / 1e3)))) if tick_us < 1e3 else 0
    return f"{t_us / 1e3:.{decimals}f}"

"""A sortable, filterable table over a pandas frame that renders only the visible rows (Line API).

Textual's DataTable builds every row up front (about 12 s for 100k rows); this one keeps the frame
as it is plus an index array of the rows in view, so filtering or sorting 100k rows is one pandas
operation and drawing touches only what fits on screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Size
from textual.markup import escape
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..text import clean


@dataclass
class Column:
    key: str
    title: str
    width: int = 10  # 0: take the width the fixed columns leave
    align: str = "right"
    fmt: Callable[[Any], str | Text] | None = None  # None: the value as a cleaned string
    sortable: bool = True


class TableView(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    TableView {
        border: round $primary 50%;
        height: 1fr;
        scrollbar-size-horizontal: 0;
    }
    TableView:focus { border: round $accent; }
    TableView > .tableview--header { text-style: bold; color: $text-accent; }
    TableView > .tableview--cursor { background: $primary 40%; }
    TableView:focus > .tableview--cursor { background: $accent 50%; }
    TableView > .tableview--empty { color: $text-muted; text-style: italic; }
    """
    COMPONENT_CLASSES = {"tableview--header", "tableview--cursor", "tableview--empty"}
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
        Binding("s", "sort_next", "Sort"),
        Binding("r", "reverse", "Reverse"),
    ]

    class Highlighted(Message):
        """The cursor moved to another row (None when the table is empty)."""

        def __init__(self, table: "TableView", row: pd.Series | None):
            super().__init__()
            self.table = table
            self.row = row

        @property
        def control(self) -> "TableView":
            return self.table

    class Selected(Highlighted):
        """Enter was pressed on a row."""

    def __init__(self, columns: list[Column], frame: pd.DataFrame | None = None, *, title: str = "rows",
                 filter_keys: tuple[str, ...] = ("name",), sort: str | None = None, descending: bool = True,
                 empty: str = "nothing to show", name: str | None = None, id: str | None = None,
                 classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.columns = columns
        self.title = title
        self.filter_keys = filter_keys
        self.sort_key = sort
        self.descending = descending
        self.empty_message = empty
        self.query_text = ""
        self.cursor = 0
        self.frame = pd.DataFrame()
        self.view = np.empty(0, dtype=np.int64)  # positions in `frame`, in display order
        self._haystack: pd.Series | None = None
        self._strips: dict[tuple, Strip] = {}  # rendered rows, dropped whenever the rows change
        self.set_frame(frame if frame is not None else pd.DataFrame(columns=[c.key for c in columns]))

    # -- data -------------------------------------------------------------------------------------
    def set_frame(self, frame: pd.DataFrame) -> None:
        self.frame = frame.reset_index(drop=True)
        keys = [k for k in self.filter_keys if k in self.frame]
        # One lower-cased string per row, built once: filtering is then a single vectorised contains.
        if keys and len(self.frame):
            hay = self.frame[keys[0]].astype(str)
            for k in keys[1:]:
                hay = hay + "\x00" + self.frame[k].astype(str)
            self._haystack = hay.str.lower()
        else:
            self._haystack = None
        self._rebuild()

    def set_filter(self, text: str) -> None:
        self.query_text = text.strip()
        self._rebuild()

    def sort_by(self, key: str, descending: bool | None = None) -> None:
        self.sort_key = key
        if descending is not None:
            self.descending = descending
        self._rebuild()

    def _rebuild(self) -> None:
        frame = self.frame
        positions = np.arange(len(frame))
        if self.query_text and self._haystack is not None:
            mask = self._haystack.str.contains(self.query_text.lower(), regex=False).to_numpy()
            positions = positions[mask]
        if self.sort_key and self.sort_key in frame and len(positions) > 1:
            col = frame[self.sort_key].iloc[positions].reset_index(drop=True)
            if not pd.api.types.is_numeric_dtype(col):
                col = col.astype(str).str.lower()
            # pandas' stable sort keeps ties in frame order in both directions
            order = col.sort_values(ascending=not self.descending, kind="stable", na_position="last").index.to_numpy()
            positions = positions[order]
        self.view = positions
        self._strips.clear()
        self.cursor = min(self.cursor, max(len(positions) - 1, 0))
        self._update_title()
        self._resize()
        self.refresh()
        self._announce()

    def _update_title(self) -> None:
        total = len(self.frame)
        shown = len(self.view)
        what = f"{shown:,} of {total:,} {self.title}" if shown != total else f"{total:,} {self.title}"
        # border titles are markup: the typed filter is escaped so `[relu]` stays text
        self.border_title = what + (f" · filter “{escape(self.query_text)}”" if self.query_text else "")

    def _resize(self) -> None:
        self.virtual_size = Size(self.scrollable_content_region.width, len(self.view) + 1)

    def on_resize(self) -> None:
        self._resize()

    @property
    def current_row(self) -> pd.Series | None:
        if not len(self.view):
            return None
        return self.frame.iloc[int(self.view[self.cursor])]

    def _announce(self) -> None:
        self.post_message(self.Highlighted(self, self.current_row))

    # -- keys --------------------------------------------------------------------------------------
    def _set_cursor(self, row: int) -> None:
        if not len(self.view):
            return
        row = min(max(row, 0), len(self.view) - 1)
        if row == self.cursor:
            return
        self.cursor = row
        visible = max(self.scrollable_content_region.height - 1, 1)
        if row < self.scroll_y:
            self.scroll_to(y=row, animate=False)
        elif row >= self.scroll_y + visible:
            self.scroll_to(y=row - visible + 1, animate=False)
        self.refresh()
        self._announce()

    def action_move(self, delta: int) -> None:
        self._set_cursor(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._set_cursor(self.cursor + direction * max(self.scrollable_content_region.height - 2, 1))

    def action_edge(self, end: int) -> None:
        self._set_cursor(len(self.view) - 1 if end else 0)

    def action_sort_next(self) -> None:
        keys = [c.key for c in self.columns if c.sortable]
        if not keys:
            return
        nxt = keys[(keys.index(self.sort_key) + 1) % len(keys)] if self.sort_key in keys else keys[0]
        # names read best A→Z, numbers biggest first
        numeric = nxt in self.frame and pd.api.types.is_numeric_dtype(self.frame[nxt])
        self.sort_by(nxt, descending=numeric)

    def action_reverse(self) -> None:
        self.descending = not self.descending
        self._rebuild()

    def key_enter(self) -> None:
        row = self.current_row
        if row is not None:
            self.post_message(self.Selected(self, row))

    def on_click(self, event: Click) -> None:
        if event.y == 0:
            col = self._column_at(event.x)
            if col is not None and col.sortable:
                if col.key == self.sort_key:
                    self.action_reverse()
                else:
                    self.sort_by(col.key, descending=col.align == "right")
            return
        self._set_cursor(int(self.scroll_y) + event.y - 1)

    # -- drawing -----------------------------------------------------------------------------------
    def _widths(self, total: int) -> list[int]:
        fixed = sum(c.width for c in self.columns if c.width) + len(self.columns) - 1
        flex = [c for c in self.columns if not c.width]
        spare = max(total - fixed, 8)
        return [c.width or max(spare // max(len(flex), 1), 8) for c in self.columns]

    def _column_at(self, x: int) -> Column | None:
        pos = 0
        for col, w in zip(self.columns, self._widths(self.scrollable_content_region.width)):
            if pos <= x < pos + w:
                return col
            pos += w + 1
        return None

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            return self._header(width, base)
        if not len(self.view):
            if y == 1:
                text = Text(" " + (f"no rows match “{self.query_text}”" if self.query_text else self.empty_message))
                text.stylize(self.get_component_rich_style("tableview--empty"))
                return _strip(text, width, base, self.app.console)
            return Strip.blank(width, base)
        row = int(self.scroll_y) + y - 1
        if row >= len(self.view):
            return Strip.blank(width, base)
        position = int(self.view[row])
        cursor = row == self.cursor
        # Rows are re-requested on every refresh (a cursor move repaints the widget): keep the strips.
        key = (position, width, cursor, cursor and self.has_focus, base)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._render_row(position, width, base, cursor)
            if len(self._strips) > 4000:
                self._strips.clear()
            self._strips[key] = strip
        return strip

    def _render_row(self, position: int, width: int, base: Style, cursor: bool) -> Strip:
        values = self.frame.iloc[position]
        cursor_style = self.get_component_rich_style("tableview--cursor") if cursor else None
        # the cursor as the row's base style: cells that bring their own colours (the bars) keep them
        text = Text(no_wrap=True, end="", style=cursor_style or "")
        for i, (col, w) in enumerate(zip(self.columns, self._widths(width))):
            if i:
                text.append(" ")
            cell = self._cell(col, values.get(col.key))
            if isinstance(cell, str):  # the common case, without Text copies
                cell = cell if len(cell) <= w else cell[: max(w - 1, 0)] + "…"
                text.append(cell.rjust(w) if col.align == "right" else cell.ljust(w))
            else:
                text.append_text(_fit(cell, w, col.align))
        style = base + cursor_style if cursor_style else base
        return _strip(text, width, style, self.app.console)

    def _cell(self, col: Column, value) -> str | Text:
        if isinstance(value, Text):
            return value
        if col.fmt is not None:
            return col.fmt(value)
        if value is None or (isinstance(value, float) and np.isnan(value)):
            return "–"
        return clean(value)  # trace names: control sequences stripped; a plain str is never markup here

    def _header(self, width: int, base: Style) -> Strip:
        text = Text(no_wrap=True, end="")
        for i, (col, w) in enumerate(zip(self.columns, self._widths(width))):
            if i:
                text.append(" ")
            mark = (" ▼" if self.descending else " ▲") if col.key == self.sort_key else ""
            text.append_text(_fit(Text(col.title + mark), w, col.align))
        text.stylize(self.get_component_rich_style("tableview--header"))
        return _strip(text, width, base, self.app.console)


def _fit(text: Text, width: int, align: str) -> Text:
    text = text.copy()
    text.no_wrap = True
    if text.cell_len > width:
        text.truncate(max(width - 1, 0))
        text.append("…")
    pad = width - text.cell_len
    if pad > 0:
        if align == "right":
            text = Text(" " * pad) + text
        else:
            text.append(" " * pad)
    return text


def _strip(text: Text, width: int, style: Style, console) -> Strip:
    segments = list(text.render(console, end=""))
    return Strip(segments).crop_extend(0, width, style).apply_style(style)

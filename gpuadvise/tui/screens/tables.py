"""Kernels & ops, and Copies & syncs: aggregate tables (TableView pages through pandas frames, so
100k distinct names stay instant). Enter on a row shows it in the timeline."""

from __future__ import annotations

import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..data import Jump
from ..text import clean, ms, nbytes, pct
from ..widgets.table_view import Column, TableView
from .base import FILTER_BINDING, ViewScreen

TABLE_KEYS = """\
| key | does |
|---|---|
| ↑ ↓ PgUp PgDn Home End | move in the table |
| tab | switch table |
| s | sort by the next column (or click a header) |
| r | reverse the order |
| / | filter by name (both tables) |
| enter | show the row in the timeline |
"""


class TablesScreen(ViewScreen):
    """Two stacked tables, a filter for both, and the full text of the selected row below."""

    FILTERABLE = True
    BINDINGS = [FILTER_BINDING]
    DEFAULT_CSS = """
    TablesScreen #row-detail { height: 3; padding: 0 1; color: $text; }
    TablesScreen .top-table { height: 3fr; }
    TablesScreen .bottom-table { height: 2fr; }
    """

    def tables(self) -> tuple[TableView, TableView] | None:
        return None

    def compose_body(self) -> ComposeResult:
        if not self.data.has_trace:
            yield Static(Text("This file has no trace tables (a memory snapshot).", style="yellow"), id="row-detail")
            return
        top, bottom = self.tables()
        top.add_class("top-table")
        bottom.add_class("bottom-table")
        with Vertical():
            yield top
            yield bottom
        yield Static(id="row-detail")

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "filter":
            return self.data.has_trace
        return super().check_action(action, parameters)

    def focus_main(self) -> None:
        tables = self.query(TableView)
        if tables and not any(t.has_focus for t in tables):
            tables.first().focus()

    def apply_filter(self, text: str) -> None:
        for table in self.query(TableView):
            table.set_filter(text)

    def on_table_view_highlighted(self, event: TableView.Highlighted) -> None:
        focused = self.focused
        if event.table is focused or not isinstance(focused, TableView):
            self._describe(event.table, event.row)

    def on_descendant_focus(self, event) -> None:
        if isinstance(event.widget, TableView):
            self._describe(event.widget, event.widget.current_row)

    def _describe(self, table: TableView, row: pd.Series | None) -> None:
        detail = self.query_one("#row-detail", Static)
        detail.update(self.describe(table, row) if row is not None else "")

    def describe(self, table: TableView, row: pd.Series) -> Text:
        return Text(clean(row.get("name", "")))


class KernelsScreen(TablesScreen):
    MODE = "kernels"
    FILTER_PLACEHOLDER = "filter kernels and ops by name"
    HELP = "**Kernels & ops** — GPU kernels and CPU ops by name: count, total, mean, share of the total.\n\n" + TABLE_KEYS

    def tables(self):
        m = self.data.report.metrics
        kernels = m.kernels.copy()
        if len(kernels):
            kernels["class"] = [("comm" if c else (p or "matmul") if mm else "")
                                for c, mm, p in zip(kernels["comm"], kernels["matmul"], kernels["precision"])]
        ops = m.ops.copy()
        if len(ops):
            ops["share_pct"] = 100 * ops["total_us"] / max(ops["total_us"].sum(), 1e-9)
        k = TableView([
            Column("name", "Kernel", 0, align="left"),
            Column("count", "Count", 8, fmt=lambda v: f"{int(v):,}"),
            Column("total_us", "Total ms", 10, fmt=ms),
            Column("mean_us", "Mean µs", 9, fmt=lambda v: f"{v:,.1f}"),
            Column("median_us", "Median µs", 9, fmt=lambda v: f"{v:,.1f}"),
            Column("share_pct", "Share", 7, fmt=pct),
            Column("class", "Class", 10, align="left"),
        ], kernels, title="kernels", sort="total_us", empty="no kernels in this trace", id="kernels")
        o = TableView([
            Column("name", "CPU op", 0, align="left"),
            Column("count", "Count", 8, fmt=lambda v: f"{int(v):,}"),
            Column("total_us", "Total ms", 10, fmt=ms),
            Column("mean_us", "Mean µs", 9, fmt=lambda v: f"{v:,.1f}"),
            Column("share_pct", "Share", 7, fmt=pct),
        ], ops, title="CPU ops", sort="total_us", empty="no CPU ops in this trace", id="ops")
        return k, o

    def describe(self, table, row) -> Text:
        t = Text(no_wrap=False, end="")
        t.append(clean(row["name"]), style="bold")
        t.append(f"\n{int(row['count']):,} calls · {ms(row['total_us'])} ms total · mean {row['mean_us']:,.1f} µs",
                 style="dim")
        t.append("  (enter: where it runs in the timeline)", style="dim")
        return t

    def on_table_view_selected(self, event: TableView.Selected) -> None:
        name = str(event.row["name"])
        lane = "gpu" if event.table.id == "kernels" else "ops"
        self.app.jump_to(Jump(report=self.data.current, highlight={name}, lane_kind=lane, label=name))


class CopiesScreen(TablesScreen):
    MODE = "copies"
    FILTER_PLACEHOLDER = "filter copies and syncs (kind, call, op, source)"
    HELP = ("**Copies & syncs** — host↔device copies grouped by kind (pageable or pinned host memory, "
            "direction) with bytes and bandwidth; calls that block the CPU on the GPU, grouped by the op "
            "and source line they come from.\n\n" + TABLE_KEYS)

    def tables(self):
        m = self.data.report.metrics
        copies = _copy_groups(m.copies)
        syncs = _sync_groups(m.syncs)
        c = TableView([
            Column("kind", "Kind", 7, align="left"),
            Column("direction", "Dir", 5, align="left"),
            Column("route", "From → to", 0, align="left"),
            Column("count", "Count", 7, fmt=lambda v: f"{int(v):,}"),
            Column("bytes", "Bytes", 10, fmt=nbytes),
            Column("total_us", "Time ms", 10, fmt=ms),
            Column("gbps", "GB/s", 8, fmt=lambda v: f"{v:,.2f}"),
        ], copies, title="copy kinds", filter_keys=("kind", "direction", "route"), sort="total_us",
            empty="no memcpy or memset in this trace", id="copies")
        s = TableView([
            Column("name", "Blocking call", 22, align="left"),
            Column("what", "Kind", 20, align="left"),
            Column("op", "Op", 24, align="left"),
            Column("source", "Source", 0, align="left"),
            Column("count", "Count", 6, fmt=lambda v: f"{int(v):,}"),
            Column("total_us", "Total ms", 10, fmt=ms),
            Column("max_us", "Max ms", 8, fmt=ms),
        ], syncs, title="sync groups", filter_keys=("name", "what", "op", "source"), sort="total_us",
            empty="no blocking calls in this trace", id="syncs")
        return c, s

    def describe(self, table, row) -> Text:
        t = Text(no_wrap=False, end="")
        if table.id == "copies":
            t.append(f"{clean(row['name'])}", style="bold")
            t.append(f"\n{int(row['count']):,} × · {nbytes(row['bytes'])} in {ms(row['total_us'])} ms "
                     f"({row['gbps']:.2f} GB/s)", style="dim")
        else:
            t.append(f"{clean(row['name'])} in {clean(row['op']) or '(no op)'}", style="bold")
            t.append(f"\n{clean(row['source']) or 'no source line (profile with --with-stack)'}", style="dim")
        t.append("  (enter: first one in the timeline)", style="dim")
        return t

    def on_table_view_selected(self, event: TableView.Selected) -> None:
        row = event.row
        lane = "gpu" if event.table.id == "copies" else "runtime"
        self.app.jump_to(Jump(report=self.data.current, start_us=float(row["first_ts"]), end_us=float(row["first_end"]),
                              lane_kind=lane, label=str(row["name"])))


def _copy_groups(copies: pd.DataFrame) -> pd.DataFrame:
    cols = ["name", "kind", "direction", "route", "count", "bytes", "total_us", "gbps", "first_ts", "first_end"]
    if copies.empty:
        return pd.DataFrame(columns=cols)
    g = copies.sort_values("ts").groupby(["name", "kind", "direction", "src", "dst"], dropna=False, observed=True).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), total_us=("dur", "sum"),
        first_ts=("ts", "first"), first_end=("end", "first")).reset_index()
    g["route"] = [f"{s} → {d}" if s or d else "" for s, d in zip(g["src"], g["dst"])]
    g["gbps"] = g["bytes"] / g["total_us"].clip(lower=1e-9) / 1e3
    return g[cols]


def _sync_groups(syncs: pd.DataFrame) -> pd.DataFrame:
    cols = ["name", "what", "op", "source", "count", "total_us", "max_us", "first_ts", "first_end"]
    if syncs.empty:
        return pd.DataFrame(columns=cols)
    s = syncs.copy()
    s["what"] = [f"{k} (profiler)" if p else k for k, p in zip(s["kind"], s["profiler_sync"])]
    g = s.sort_values("ts").groupby(["name", "what", "op", "source"], dropna=False).agg(
        count=("dur", "size"), total_us=("dur", "sum"), max_us=("dur", "max"),
        first_ts=("ts", "first"), first_end=("end", "first")).reset_index()
    return g[cols]

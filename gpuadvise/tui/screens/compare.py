"""The compare screen: two runs side by side, drawn from the dict `analyzer.compare.diff.compare()` returns
(the same one `gpuadvise compare` renders), so it needs no trace and no torch."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from gpuadvise.analyzer.report import compare as rc

from ..text import clean
from ..widgets.charts import breakdown_bar, breakdown_legend

BAR_WIDTH = 40
CLASS_STYLE = {"resolved": "bold green", "new": "bold red", "still_there": "yellow", "unchecked": "dim"}
CLASS_NAME = {"resolved": "resolved", "new": "new", "still_there": "still there", "unchecked": "not checked"}


class CompareScreen(Screen):
    HELP = """\
**Compare** — BEFORE and AFTER side by side: the step time (median, fastest and slowest step, and the
unprofiled figure when both runs recorded one), GPU busy, the median step split drawn on one scale,
the findings resolved, new, still there (and those one side could not check), each resolved finding's
predicted saving next to the change measured, the kernels and ops whose time changed most, and what
differs between the runs. Warnings (other device, other script, other profiler settings) come first.

| key | does |
|---|---|
| ↑ ↓ PgUp PgDn Home End | scroll |
| e | export the comparison as markdown (charts as SVG files beside it) |
| ? / F1 | this help |
| q | quit |
"""
    DEFAULT_CSS = """
    CompareScreen #compare-body { padding: 0 1; }
    CompareScreen .section { margin-top: 1; height: auto; }
    CompareScreen #warnings { color: $warning; height: auto; }
    """
    BINDINGS = [Binding("home", "scroll('home')", "Top", show=False), Binding("end", "scroll('end')", "End", show=False)]

    def __init__(self, result: dict):
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        c = self.result
        with VerticalScroll(id="compare-body"):
            yield Static(self._header(), id="header")
            if c["warnings"]:
                yield Static(self._warnings(), id="warnings", classes="section")
            yield Static(self._verdict(), id="verdict", classes="section")
            yield Static(self._step_table(), id="steps", classes="section")
            if c["breakdown"]:
                yield Static(self._breakdown(), id="breakdown", classes="section")
            yield Static(self._findings(), id="findings", classes="section")
            if c["predictions"]:
                yield Static(self._predictions(), id="predictions", classes="section")
            for table in ("kernels", "ops"):
                if c[table]:
                    yield Static(self._changes(table), id=table, classes="section")
            if c["environment"]:
                yield Static(self._environment(), id="environment", classes="section")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#compare-body").focus()

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#compare-body", VerticalScroll)
        body.scroll_home() if where == "home" else body.scroll_end()

    # -- sections ----------------------------------------------------------------------------------
    def _header(self) -> Text:
        b, a = self.result["before"], self.result["after"]
        t = Text(end="")
        for name, s in (("BEFORE ", b), ("AFTER  ", a)):
            if len(t):
                t.append("\n")
            t.append(name, style="bold")
            t.append(clean(s["label"]))
            t.append(f"  ·  {clean(s.get('device') or 'device not recorded')}", style="dim")
        return t

    def _warnings(self) -> Text:
        t = Text(end="")
        for i, w in enumerate(self.result["warnings"]):
            t.append(("\n" if i else "") + "⚠ " + clean(w))
        return t

    def _verdict(self) -> Text:
        c = self.result
        s = c["step_time"].get("saving_pct")
        style = "bold" if s is None else "bold green" if s > 0 else "bold red" if s < 0 else "bold"
        v = rc.verdict(c)
        t = Text(v[0].upper() + v[1:] + ".", style=style, end="")
        t.append(f"\nFindings: {rc.counts(c)}.")
        gate = c.get("gate")
        if gate:
            t.append("\n" + clean(rc.gate_line(gate)), style="bold red" if gate["failed"] else "green")
        return t

    def _step_table(self) -> Table:
        table = Table(title="Step time", title_justify="left", title_style="bold", box=None, pad_edge=False)
        table.add_column("")
        for name in ("BEFORE", "AFTER", "change"):
            table.add_column(name, justify="right", no_wrap=True, min_width=10)
        for what, vb, va, ch in rc.headline(self.result):
            table.add_row(Text(what), Text(vb), Text(va), Text(ch))
        return table

    def _breakdown(self) -> Group:
        rows = {r["part"]: r for r in self.result["breakdown"]}
        dur = rows.get("dur") or {}
        longest = max(dur.get("before_ms") or 0.0, dur.get("after_ms") or 0.0) or 1.0  # one scale for both bars
        lines = Text(end="")
        lines.append("Median step split, on one scale: ", style="bold")
        lines.append_text(breakdown_legend())
        for name, key in (("BEFORE", "before_ms"), ("AFTER ", "after_ms")):
            us = {f"{part}_us": (r[key] or 0.0) * 1e3 for part, r in rows.items()}
            dur = us.get("dur_us", 0.0)
            width = max(int(round(BAR_WIDTH * dur / 1e3 / longest)), 1) if dur else 0
            lines.append(f"\n{name} ")
            if width:
                lines.append_text(breakdown_bar(us, width))
            lines.append(f" {rc.ms(rows['dur'][key]) if 'dur' in rows else '–'} ms")
        table = Table(box=None, pad_edge=False)
        table.add_column("part")
        for name in ("BEFORE ms", "AFTER ms", "change ms"):
            table.add_column(name, justify="right", no_wrap=True, min_width=10)
        for r in self.result["breakdown"]:
            table.add_row(Text(r["label"]), Text(rc.ms(r["before_ms"])), Text(rc.ms(r["after_ms"])),
                          Text(rc.signed(r["change_ms"])))
        return Group(lines, Text(""), table)

    def _findings(self) -> Table:
        table = Table(title=f"Findings: {rc.counts(self.result)}", title_justify="left", title_style="bold",
                      box=None, pad_edge=False)
        for name, justify in (("", "left"), ("rule", "left"), ("topic", "left"), ("severity", "left"),
                              ("est. saving BEFORE → AFTER", "right"), ("finding", "left")):
            table.add_column(name, justify=justify, no_wrap=name != "finding", ratio=1 if name == "finding" else None)
        for key in ("resolved", "new", "still_there", "unchecked"):
            for f in self.result["findings"][key]:
                sev = " → ".join(s["severity"] for s in (f["before"], f["after"]) if s)
                saving = f"{rc._finding_saving(f['before'])} → {rc._finding_saving(f['after'])}"
                title = clean(f["title"]) + (f" ({clean(f['note'])})" if f.get("note") else "")
                table.add_row(Text(CLASS_NAME[key], style=CLASS_STYLE[key]), Text(f["rule"]), Text(clean(f["topic"])),
                              Text(sev), Text(saving), Text(title))
        if not any(self.result["findings"].values()):
            table.add_row(Text("none", style="dim"), Text(""), Text(""), Text(""), Text(""), Text("no findings on either side"))
        return table

    def _predictions(self) -> Text:
        st = self.result["step_time"]
        t = Text(end="")
        t.append("Predicted vs measured", style="bold")
        if st.get("figure_label"):
            t.append(f"  ({clean(st['figure_label'])})", style="dim")
        for p in self.result["predictions"]:
            t.append("\n  " + clean(rc.prediction_sentence(p, st)))
        return t

    def _changes(self, table_name: str) -> Table:
        title = "Kernels" if table_name == "kernels" else "Ops"
        table = Table(title=f"{title} whose time per step changed most (ms per step: the mean over the profiled steps)", title_justify="left",
                      title_style="bold", box=None, pad_edge=False)
        for name in ("change", "BEFORE", "AFTER"):
            table.add_column(name, justify="right", no_wrap=True, min_width=9)
        table.add_column("name", no_wrap=True, overflow="ellipsis", ratio=1)
        for r in self.result[table_name]:
            style = "red" if r["change_ms_per_step"] > 0 else "green"
            table.add_row(Text(f"{r['change_ms_per_step']:+.3f}", style=style), Text(f"{r['before_ms_per_step']:.3f}"),
                          Text(f"{r['after_ms_per_step']:.3f}"), Text(clean(r["name"])))
        return table

    def _environment(self) -> Table:
        table = Table(title="What differs between the runs", title_justify="left", title_style="bold",
                      box=None, pad_edge=False)
        for name in ("fact", "BEFORE", "AFTER"):
            table.add_column(name)
        for r in self.result["environment"]:
            table.add_row(Text(clean(r["key"])), Text(clean(rc._val(r["before"]))), Text(clean(rc._val(r["after"]))))
        return table


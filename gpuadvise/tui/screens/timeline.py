"""Timeline: one step at a time, lanes for CPU threads and GPU streams, zoom and pan by keyboard,
the item under the cursor described below. The drawing itself is `TimelineView` (Line API)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from .. import timeline_index as ti
from ..data import Jump
from ..text import clean, duration, ms
from ..widgets.timeline_view import COLOURS, TimelineView
from .base import FILTER_BINDING, ViewScreen

LEGEND = ((ti.KERNEL, "kernel"), (ti.COMM, "comm"), (ti.MEMCPY, "memcpy"), (ti.MEMSET, "memset"),
          (ti.OP, "CPU op"), (ti.DATALOADER, "DataLoader"), (ti.LAUNCH, "launch"), (ti.SYNC_CALL, "sync"),
          (ti.EVIDENCE, "evidence"))


class TimelineScreen(ViewScreen):
    MODE = "timeline"
    FILTERABLE = True
    FILTER_PLACEHOLDER = "highlight events whose name contains…"
    HELP = """\
**Timeline** — one step at a time. Each line is a lane: per CPU thread its top-level ops, nested ops,
DataLoader waits and CUDA runtime calls (syncs in red); per GPU stream its kernels, copies and
memsets. Shading shows how busy a column is (░ ▒ ▓ █); wide bars carry their names. Only what is on
screen is drawn, so huge traces stay fast.

| key | does |
|---|---|
| ← → | move the cursor one column |
| ↑ ↓ | select a lane |
| shift+← shift+→ / h l | pan a quarter screen |
| + / - (or i / o) | zoom in / out around the cursor |
| 0 | fit the whole step |
| enter | zoom to the item under the cursor |
| . / , | next / previous event in the lane |
| [ / ] | previous / next step |
| s | pick a step |
| n / N | next / previous evidence range of the finding you came from |
| / | highlight events by name (escape clears) |
"""
    BINDINGS = [
        Binding("s", "pick_step", "Steps"),
        FILTER_BINDING,
        Binding("escape", "clear_highlight", "Clear highlight", show=False),
    ]
    DEFAULT_CSS = """
    TimelineScreen #timeline-info { height: 1; padding: 0 1; background: $boost; }
    TimelineScreen #timeline-legend { height: 1; padding: 0 1; }
    TimelineScreen #timeline-details { height: 5; padding: 0 1; border-top: solid $primary 50%; }
    """

    def compose_body(self) -> ComposeResult:
        yield Static(id="timeline-info")
        yield TimelineView(id="timeline")
        yield Static(_legend(), id="timeline-legend")
        yield Static(id="timeline-details")

    def on_mount(self) -> None:
        self._connect_index()

    def after_recompose(self) -> None:
        self._connect_index()

    def focus_main(self) -> None:
        self.query_one(TimelineView).focus()

    @property
    def view(self) -> TimelineView:
        return self.query_one(TimelineView)

    def _connect_index(self) -> None:
        """Hand the timeline its index once the worker has built it."""
        if not self.data.has_trace:
            self.query_one("#timeline-info", Static).update(Text("This file has no timeline (a memory snapshot).",
                                                                 style="yellow"))
            return
        if not self.data.timeline_ready():
            events = sum(len(df) for df in (self.data.report.model.gpu, self.data.report.model.cpu,
                                             self.data.report.model.runtime))
            self.query_one("#timeline-info", Static).update(f"Indexing {events:,} events for the timeline…")
            self.app.waiting_for_index.add(self)  # the app calls index_ready() when the worker is done
            return
        self.app.waiting_for_index.discard(self)
        self.view.set_index(self.data.timeline())
        self._apply_jump()

    def index_ready(self) -> None:
        if self.data.timeline_ready() and self.view.index is None:
            self._connect_index()

    async def on_screen_resume(self) -> None:
        await super().on_screen_resume()
        if self.data.timeline_ready() and self.view.index is not None:
            self._apply_jump()

    def _apply_jump(self) -> None:
        jump: Jump | None = self.data.pending_jump
        if jump is None or jump.report != self.data.current:
            return
        self.data.pending_jump = None
        view = self.view
        view.set_marks(jump.marks, jump.label or "evidence")
        view.set_highlight(jump.highlight, label=jump.label if jump.highlight else "")
        if jump.start_us is not None:
            view.show_range(jump.start_us, jump.end_us if jump.end_us is not None else jump.start_us,
                            lane_kind=jump.lane_kind)
        else:
            pos = 0
            if jump.step is not None:
                pos = next((k for k, s in enumerate(view.index.steps) if s[0] == jump.step), 0)
            if jump.lane_kind:
                view.select_lane_kind(jump.lane_kind)
            view.show_step(pos)
        view.focus()

    def on_timeline_view_changed(self, event: TimelineView.Changed) -> None:
        self._update_info()
        self._update_details()

    def _update_info(self) -> None:
        v = self.view
        if v.index is None:
            return
        number, lo, hi = v.step
        t = Text(no_wrap=True, end="")
        name = f"Step #{number}" if number >= 0 else "Whole trace"
        t.append(name, style="bold")
        t.append(f" ({v.step_pos + 1}/{len(v.index.steps)}) {ms(hi - lo)} ms", style="")
        t.append(f" · view {ms(v.t0 - lo)}–{ms(v.t0 + v.span - lo)} ms · {duration(v.us_per_column)}/col"
                 f" · cursor {ms(v.cursor_t - lo, 3)} ms")
        if v.highlight is not None:
            t.append(" · highlight: ", style="")
            t.append(clean(v.highlight_label), style="bold yellow")
        self.query_one("#timeline-info", Static).update(t)

    def _update_details(self) -> None:
        v = self.view
        details = self.query_one("#timeline-details", Static)
        if v.index is None or not v.index.lanes:
            details.update("")
            return
        lane = v.index.lanes[v.lane]
        item = v.item_at_cursor()
        t = Text(no_wrap=False, end="")
        t.append(clean(lane.label), style="bold")
        if item is None:
            t.append("  nothing at the cursor", style="dim")
            details.update(t)
            return
        lane, i, count = item
        r = self.data.report
        pairs = ti.event_details(r.model, r.metrics, lane, i)
        step_lo = v.step[1]
        t.append(f"  {count:,} event{'s' if count != 1 else ''} in this column" if count > 1 else "", style="dim")
        for key, value in pairs:
            t.append("\n" if key in ("name", "start") else "  ·  ")
            t.append(f"{key}: ", style="dim")
            t.append(clean(value), style="bold" if key == "name" else "")
            if key == "start":
                t.append(f" ({ms(float(lane.starts[i]) - step_lo, 3)} ms into the step)", style="dim")
        details.update(t)

    def action_pick_step(self) -> None:
        v = self.view
        if v.index is None:
            return
        ps = self.data.report.metrics.per_step

        def chosen(pos: int | None) -> None:
            if pos is not None:
                v.show_step(pos)

        self.app.push_screen(StepPicker(v.index.steps, ps, v.step_pos), chosen)

    def apply_filter(self, text: str) -> None:
        self.view.set_highlight(text.strip() or None)

    def action_clear_highlight(self) -> None:
        self.view.set_highlight(None)
        self.view.set_marks([])


def _legend() -> Text:
    t = Text(no_wrap=True, end="")
    for code, name in LEGEND:
        t.append("█ ", style=COLOURS[code])
        t.append(name + "  ", style="dim")
    return t


class StepPicker(ModalScreen[int | None]):
    """A list of the steps with their time and GPU busy %; enter opens one."""

    BINDINGS = [Binding("escape", "dismiss_none", "Close")]
    DEFAULT_CSS = """
    StepPicker { align: center middle; }
    StepPicker > OptionList { width: 64; height: 70%; border: round $accent; }
    """

    def __init__(self, steps, per_step, current: int):
        super().__init__()
        self.steps = steps
        self.per_step = per_step
        self.current = current

    def compose(self) -> ComposeResult:
        options = []
        rows = {int(s): row for s, row in zip(self.per_step["step"], self.per_step.itertuples())}
        for number, lo, hi in self.steps:
            row = rows.get(int(number))
            t = Text(no_wrap=True, end="")
            t.append(f"#{number:<6}" if number >= 0 else "all    ", style="bold")
            t.append(f"{ms(hi - lo):>10} ms")
            if row is not None:
                t.append(f"   GPU busy {row.gpu_busy_pct:5.1f} %")
                t.append(f"   DataLoader {ms(row.dataloader_us):>8} ms", style="dim")
            options.append(Option(t))
        ol = OptionList(*options)
        ol.border_title = "Go to step"
        yield ol

    def on_mount(self) -> None:
        ol = self.query_one(OptionList)
        ol.highlighted = self.current
        ol.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option_index)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

"""The frame around every screen: the screen tabs at the top and the filter bar at the bottom."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input, Static

from ..text import clean

# (mode name, title, key) in tab order.
SCREENS = (
    ("overview", "Overview", "1"),
    ("findings", "Findings", "2"),
    ("timeline", "Timeline", "3"),
    ("kernels", "Kernels & ops", "4"),
    ("copies", "Copies & syncs", "5"),
    ("memory", "Memory", "6"),
    ("job", "Job", "7"),
)


class ScreenTabs(Static):
    """One line naming the screens with their keys, the current one lit, the trace on the right.
    Clicking a name switches to it."""

    DEFAULT_CSS = """
    ScreenTabs { dock: top; height: 1; background: $panel; color: $text-muted; }
    """

    def __init__(self, current: str, trace_label: str):
        super().__init__()
        self.current = current
        self.trace_label = trace_label

    def on_mount(self) -> None:
        self.update(self.render_tabs(self.size.width or 120))

    def on_resize(self) -> None:
        self.update(self.render_tabs(self.size.width))

    def render_tabs(self, width: int) -> Text:
        text = Text(no_wrap=True, end="")
        self._spans: list[tuple[int, int, str]] = []
        for mode, title, key in SCREENS:
            start = len(text)
            if mode == self.current:
                text.append(f" {key} {title} ", style="bold reverse")
            else:
                text.append(f" {key}", style="bold")
                text.append(f" {title} ")
            self._spans.append((start, len(text), mode))
        label = clean(self.trace_label)
        room = width - text.cell_len - 2
        if room > 8:
            if len(label) > room:
                label = "…" + label[-(room - 1):]
            text.append(" " * (room - len(label) + 1))
            text.append(label, style="italic")
        return text

    def on_click(self, event) -> None:
        for start, end, mode in getattr(self, "_spans", []):
            if start <= event.x < end:
                self.app.action_show(mode)
                return


class FilterBar(Input):
    """`/` opens it; typing filters live; enter keeps the filter and goes back; escape clears it."""

    DEFAULT_CSS = """
    FilterBar { dock: bottom; display: none; border: tall $accent; height: 3; }
    FilterBar.-open { display: block; }
    """
    BINDINGS = [Binding("escape", "clear", "Clear filter")]

    class Applied(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def on_mount(self) -> None:
        self.can_focus = False  # hidden: it must not take focus (and the keys typed at the screen)

    def open(self) -> None:
        self.can_focus = True
        self.add_class("-open")
        self.focus()

    def close(self) -> None:
        self.remove_class("-open")
        self.can_focus = False
        self.screen.focus_main()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Applied(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value:
            self.remove_class("-open")
        self.can_focus = False  # the filter stays on show; `/` edits it again
        self.screen.focus_main()

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Applied(""))
        self.close()

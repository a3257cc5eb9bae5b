"""Modal dialogs: help, and export of the markdown report."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Markdown, Static

GLOBAL_KEYS = """\
| key | does |
|---|---|
| 1 … 6 | Overview · Findings · Timeline · Kernels & ops · Copies & syncs · Memory |
| ctrl+p | command palette (screens, steps, findings, export) |
| e | export the markdown report |
| ? / F1 | this help |
| < / > | previous / next trace, when several were opened |
| q | quit |
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "close", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90; max-width: 95%; height: 85%; border: round $accent; padding: 0 1;
                                   background: $surface; }
    """

    def __init__(self, screen_help: str):
        super().__init__()
        self.screen_help = screen_help

    def compose(self) -> ComposeResult:
        body = (self.screen_help.strip() + "\n\n" if self.screen_help else "") + "**Everywhere**\n\n" + GLOBAL_KEYS
        with VerticalScroll() as v:
            v.border_title = "Help · escape closes"
            yield Markdown(body)

    def action_close(self) -> None:
        self.dismiss(None)


class ExportScreen(ModalScreen[Path | None]):
    """Asks where to write the markdown report; enter writes it, escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 84; max-width: 95%; height: auto; border: round $accent; padding: 1 2;
                              background: $surface; }
    ExportScreen Static { margin-bottom: 1; }
    """

    def __init__(self, default: Path, cursor_blink: bool = True):
        super().__init__()
        self.default = default
        self.cursor_blink = cursor_blink

    def compose(self) -> ComposeResult:
        with Vertical() as v:
            v.border_title = "Export the markdown report"
            yield Static("Write the report (findings, steps, top kernels) to this file. enter writes, escape cancels.")
            field = Input(value=str(self.default), id="export-path")
            field.cursor_blink = self.cursor_blink
            yield field

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        value = event.value.strip()
        self.dismiss(Path(value).expanduser() if value else None)

    def action_cancel(self) -> None:
        self.dismiss(None)

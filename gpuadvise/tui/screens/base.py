"""What every data screen shares: the tabs on top, an optional filter bar, the footer, and a
refresh when the user switches to another trace."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer

from ..data import ViewData
from ..widgets.chrome import FilterBar, ScreenTabs


class ViewScreen(Screen):
    MODE = ""  # mode name, see chrome.SCREENS
    FILTERABLE = False
    FILTER_PLACEHOLDER = "filter by name (case-insensitive)"
    HELP = ""  # Markdown: what the screen shows and its keys

    def __init__(self):
        super().__init__()
        self._shown_report: int | None = None

    @property
    def data(self) -> ViewData:
        return self.app.data

    def compose(self) -> ComposeResult:
        self._shown_report = self.data.current
        yield ScreenTabs(self.MODE, self.data.label())
        yield from self.compose_body()
        if self.FILTERABLE:
            bar = FilterBar(placeholder=self.FILTER_PLACEHOLDER, id="filter")
            bar.cursor_blink = self.app.cursor_blink
            yield bar
        yield Footer(compact=True)

    def compose_body(self) -> ComposeResult:
        yield from ()

    def focus_main(self) -> None:
        """Give focus back to the screen's main widget (after the filter bar closes)."""

    async def on_screen_resume(self) -> None:
        if self._shown_report is not None and self._shown_report != self.data.current:
            await self.recompose()
            self.after_recompose()
        self.focus_main()

    def after_recompose(self) -> None:
        """Hook for screens that restore state after a trace switch."""

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "filter":
            return self.FILTERABLE
        return True

    def action_filter(self) -> None:
        if self.FILTERABLE:
            self.query_one(FilterBar).open()

    def on_filter_bar_applied(self, event: FilterBar.Applied) -> None:
        self.apply_filter(event.text)

    def apply_filter(self, text: str) -> None:
        """Subclasses filter their content by `text`."""


FILTER_BINDING = Binding("slash", "filter", "Filter")

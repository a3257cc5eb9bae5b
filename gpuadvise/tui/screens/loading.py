"""The first screen: painted at once while a worker reads and analyses the traces; turns into a
clear error message when the input cannot be read."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.containers import Center, Vertical
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from ..text import clean


class LoadingScreen(Screen):
    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen #loading-box { width: 80; height: auto; border: round $accent; padding: 1 2; }
    LoadingScreen #loading-title { text-style: bold; }
    LoadingScreen #loading-status { margin-top: 1; width: 100%; height: 1; }
    LoadingScreen #loading-error { margin-top: 1; color: $error; display: none; }
    LoadingScreen.-failed #loading-error { display: block; }
    LoadingScreen.-failed ProgressBar { display: none; }
    """

    def __init__(self, paths: list[str]):
        super().__init__()
        self.paths = paths
        self.started = time.monotonic()
        self.stage = "starting"
        self.counts: tuple[int | None, int | None] = (None, None)
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static("gpuadvise view", id="loading-title")
            yield Static(Text("\n".join(clean(p) for p in self.paths), style="dim", no_wrap=True, overflow="ellipsis"),
                         id="loading-paths")
            yield Static(self.stage, id="loading-status")
            with Center():
                yield ProgressBar(total=None, show_eta=False, id="loading-bar")
            yield Static(id="loading-error")
        yield Footer()

    def on_mount(self) -> None:
        # progress or a failure may arrive before the screen is mounted: show what came
        self._ticker = self.set_interval(0.5, self._tick)
        if self.error is not None:
            self.fail(self.error)
        else:
            self._show_stage()

    def set_stage(self, stage: str, done: float | None = None, total: int | None = None,
                  determinate: bool = False) -> None:
        self.stage = stage
        self.counts = (done, total) if determinate else (None, None)
        self._show_stage()

    def _show_stage(self) -> None:
        done, total = self.counts
        try:
            if total:
                self.query_one(ProgressBar).update(total=total, progress=done or 0)
        except NoMatches:  # not composed yet: on_mount shows it
            return
        self._tick()

    def _tick(self) -> None:
        if self.error is not None:
            return
        elapsed = time.monotonic() - self.started
        try:
            # one line of fixed size: the new text is repainted without laying the screen out again
            self.query_one("#loading-status", Static).update(
                Text(f"{clean(self.stage)} · {elapsed:.0f} s", no_wrap=True, overflow="ellipsis"), layout=False)
        except NoMatches:
            pass

    def fail(self, message: str) -> None:
        self.error = message
        try:
            status = self.query_one("#loading-status", Static)
            box = self.query_one("#loading-error", Static)
        except NoMatches:  # not composed yet: on_mount shows it
            return
        self.add_class("-failed")
        status.update(Text("Could not open the input.", style="bold"))
        error = Text(clean(message))
        error.append("\n\nPress q to quit.", style="dim")
        box.update(error)

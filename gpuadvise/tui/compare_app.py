"""`gpuadvise view BEFORE AFTER --compare`: a loading screen while both runs are analysed in a
worker thread, then the compare screen. Built from paths, or from a ready comparison (tests)."""

from __future__ import annotations

import os
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Markdown

from gpuadvise.analyzer.errors import EXIT_INPUT, EXIT_INTERNAL, InputError

from .app import LoadFailed, LoadProgress
from .screens.dialogs import ExportScreen, HelpScreen
from .screens.loading import LoadingScreen


class Compared(Message):
    """The worker's result: the comparison of the two runs."""

    def __init__(self, result: dict):
        super().__init__()
        self.result = result


class CompareApp(App[int]):
    TITLE = "gpuadvise compare"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark,f1", "help", "Help"),
        Binding("e", "export", "Export"),
    ]

    def __init__(self, paths: list[str] | None = None, result: dict | None = None, *,
                 export_dir: str | os.PathLike | None = None, cursor_blink: bool = True):
        super().__init__()
        if result is None and (paths is None or len(paths) != 2):
            raise ValueError("give BEFORE and AFTER paths, or a ready comparison")
        self.paths = list(paths or [])
        self.result = result
        self.export_dir = Path(export_dir) if export_dir is not None else Path.cwd()
        self.cursor_blink = cursor_blink
        self.exit_code = 0
        self.failure: str | None = None
        self.last_export: Path | None = None
        self.loading = False

    def get_default_screen(self) -> LoadingScreen:
        return LoadingScreen([f"BEFORE {p}" for p in self.paths[:1]] + [f"AFTER  {p}" for p in self.paths[1:]]
                             or ["comparison"])

    def on_mount(self) -> None:
        if self.result is not None:
            self._show(self.result)
        else:
            self.loading = True
            self.load()

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load(self) -> None:
        from gpuadvise.analyzer import run as analysis
        from gpuadvise.analyzer.compare.diff import compare
        from gpuadvise.analyzer.compare.side import load_side

        try:
            inputs = [analysis.resolve_inputs([p]) for p in self.paths]  # both checked before either is analysed
            sides = []
            for i, (name, path, sources) in enumerate(zip(("BEFORE", "AFTER"), self.paths, inputs)):
                self.post_message(LoadProgress(f"Reading and analysing {name}: {Path(path).name or path}", i, 2))
                sides.append(load_side(sources, jobs=1, label=path))
            self.post_message(Compared(compare(*sides)))
        except InputError as exc:
            self.post_message(LoadFailed(f"gpuadvise: error: {exc}", EXIT_INPUT))
        except Exception as exc:  # our bug: show it, don't crash the terminal
            self.post_message(LoadFailed(f"gpuadvise: internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL))
        finally:
            self.loading = False

    def on_load_progress(self, event: LoadProgress) -> None:
        if isinstance(self.screen, LoadingScreen):
            self.screen.set_stage(event.stage, event.done, event.total, determinate=True)

    def on_compared(self, event: Compared) -> None:
        self._show(event.result)

    def on_load_failed(self, event: LoadFailed) -> None:
        self.exit_code = event.exit_code
        self.failure = event.message
        if isinstance(self.screen, LoadingScreen):
            self.screen.fail(event.message)

    def _show(self, result: dict) -> None:
        from .screens.compare import CompareScreen

        self.result = result
        self.push_screen(CompareScreen(result))  # over the loading screen, which stays below

    # -- actions -----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters) -> bool | None:
        if action == "export":
            return self.result is not None
        return True

    async def action_quit(self) -> None:
        self.exit(self.exit_code, return_code=self.exit_code)

    def action_help(self) -> None:
        from .screens.compare import CompareScreen

        if isinstance(self.screen, (HelpScreen, ExportScreen)):
            return
        self.push_screen(CompareHelp(CompareScreen.HELP))

    def action_export(self) -> None:
        if self.result is None or isinstance(self.screen, ExportScreen):
            return
        self.push_screen(ExportScreen(self.export_dir / "gpuadvise-compare.md", cursor_blink=self.cursor_blink),
                         self.export_report)

    def export_report(self, path: Path | None) -> Path | None:
        """The comparison as markdown at `path`, its charts as SVG files beside it (each written atomically)."""
        if path is None or self.result is None:
            return None
        from gpuadvise.analyzer.report.compare import markdown_files

        from .export import export_files

        return export_files(self, path, lambda p: markdown_files(self.result, p), "Comparison written")


class CompareHelp(HelpScreen):
    """The help dialog with the compare screen's keys only (the viewer's screen keys do not apply)."""

    def compose(self):
        with VerticalScroll() as v:
            v.border_title = "Help · escape closes"
            yield Markdown(self.screen_help)

"""The `gpuadvise view` application: a loading screen first, then one Textual *mode* per screen
(Overview, Findings, Timeline, Kernels & ops, Copies & syncs, Memory, Job), all reading one `ViewData`.

It is built either from paths (read and analysed in a thread worker, with progress) or from ready
reports (tests, benchmarks), so its tests need neither torch nor a GPU.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.worker import get_current_worker

from typing import TYPE_CHECKING

from gpuadvise.analyzer.errors import EXIT_INPUT, EXIT_INTERNAL, InputError

from .ahead import AnalysisAhead, Cancelled
from .commands import ViewCommands
from .screens.loading import LoadingScreen
from .text import clean, short_source
from .widgets.chrome import SCREENS

# Only what the loading screen needs is imported up front: the analyzer (pandas, numpy) and the
# data screens load in the worker / after the analysis, so the first paint does not wait for them.
if TYPE_CHECKING:
    from gpuadvise.analyzer.model.report import TraceReport

    from .data import Jump, ViewData


def screen_classes() -> dict:
    from .screens.findings import FindingsScreen
    from .screens.job import JobScreen
    from .screens.memory import MemoryScreen
    from .screens.overview import OverviewScreen
    from .screens.tables import CopiesScreen, KernelsScreen
    from .screens.timeline import TimelineScreen

    return {"overview": OverviewScreen, "findings": FindingsScreen, "timeline": TimelineScreen,
            "kernels": KernelsScreen, "copies": CopiesScreen, "memory": MemoryScreen, "job": JobScreen}


def warm_highlighter() -> None:
    """Compile the code highlighter's Python lexer (pygments builds its regular expressions on first use:
    about 40 ms) so that the first finding's fix, a Python block, is drawn without that wait."""
    from textual.highlight import highlight

    highlight("x = 1", language="python")


PROGRESS_EVERY_S = 0.2  # the bar moves 5 times a second: each repaint is CPU time the analysis waits for

FIRST_SCREEN = "findings"  # the answer first; the overview is one key away


class LoadProgress(Message):
    """What the worker is doing; `done` of `total` files (fractional when bytes progress is known)."""

    def __init__(self, stage: str, done: float, total: int, fraction: bool = False):
        super().__init__()
        self.stage, self.done, self.total, self.fraction = stage, done, total, fraction


class Loaded(Message):
    def __init__(self, data: "ViewData"):
        super().__init__()
        self.data = data


class TimelineIndexed(Message):
    """The worker finished the timeline index of report `report`."""

    def __init__(self, report: int):
        super().__init__()
        self.report = report


class LoadFailed(Message):
    def __init__(self, message: str, exit_code: int):
        super().__init__()
        self.message, self.exit_code = message, exit_code


class GpuadviseApp(App[int]):
    TITLE = "gpuadvise"
    COMMANDS = App.COMMANDS | {ViewCommands}
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark,f1", "help", "Help"),
        Binding("e", "export", "Export"),
        *[Binding(key, f"show('{mode}')", title, show=False) for mode, title, key in SCREENS],
        Binding("less_than_sign", "trace(-1)", "Prev trace", show=False),
        Binding("greater_than_sign", "trace(1)", "Next trace", show=False),
    ]

    def __init__(self, paths: list[str] | None = None, reports: list["TraceReport"] | None = None, *,
                 export_dir: str | os.PathLike | None = None, cursor_blink: bool = True, first_screen: str = FIRST_SCREEN,
                 sources=None, ahead: AnalysisAhead | None = None):
        super().__init__()
        if paths is None and reports is None:
            raise ValueError("give paths to load or ready reports")
        self.paths = list(paths or [])
        self.sources = sources  # the paths as `run.resolve_inputs` made them, when the caller checked them
        self.ready_reports = reports
        self.export_dir = Path(export_dir) if export_dir is not None else Path.cwd()
        self.cursor_blink = cursor_blink
        self.first_screen = first_screen
        self.data: ViewData | None = None
        self.exit_code = 0
        self.failure: str | None = None  # the load error, printed again by the CLI after the screen closes
        self.last_export: Path | None = None
        self.waiting_for_index: set = set()  # timeline screens shown before their index was built
        self.loading = False  # True while the load worker runs (the CLI must not wait on it at exit)
        self._ahead = ahead  # the analysis of `paths`, when the command started it before importing the app
        self._first_screen_drawn = threading.Event()  # the timeline index waits for it (`_index_after_first_draw`)

    # -- start-up ----------------------------------------------------------------------------------
    def get_default_screen(self) -> LoadingScreen:
        labels = self.paths or [r.source for r in self.ready_reports or []]
        return LoadingScreen(labels)

    def on_mount(self) -> None:
        if self.ready_reports is not None:
            from .data import ViewData

            self._start(ViewData(self.ready_reports))
            self.index_timelines()
        else:
            self.loading = True
            self.load()

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load(self) -> None:
        """Read and analyse every input through the one analysis entry point (run/), then index the
        timelines; runs off the UI thread. The ranks stay in this process (`jobs=1`): the timeline
        needs their events. The job-level findings (straggler, comm overlap) come with the reports."""
        from .data import ViewData

        worker = get_current_worker()
        ahead = self.start_analysis()
        try:
            shown, finished, screens, posted = None, False, False, 0.0
            while not finished:  # relay the analysis' progress until it is done, its last step included
                finished = ahead.done.wait(0.05)
                if worker.is_cancelled:
                    ahead.cancelled.set()
                    return
                latest = ahead.latest
                if latest is not shown and (shown is None or latest[0] != shown[0] or finished
                                            or time.monotonic() - posted >= PROGRESS_EVERY_S):
                    shown, posted = latest, time.monotonic()
                    self.post_message(LoadProgress(*shown))
                if not screens and ahead.reading.is_set():
                    # the screens' modules (Textual's Markdown among them: about 0.1 s) are imported, and the
                    # highlighter compiled, while the reader's C scanner runs without the interpreter lock,
                    # not after the analysis
                    screens = bool(screen_classes())
                    warm_highlighter()
            if ahead.error is not None:
                raise ahead.error
            if worker.is_cancelled:
                return
            reports = ahead.reports
            data = ViewData(reports)
            self.post_message(Loaded(data))
            self._index_after_first_draw(data, worker)  # in the background, once the findings show
        except Cancelled:
            return
        except InputError as exc:
            self.post_message(LoadFailed(f"gpuadvise: error: {exc}", EXIT_INPUT))
        except Exception as exc:  # our bug: show it, don't crash the terminal
            self.post_message(LoadFailed(f"gpuadvise: internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL))
        finally:
            self.loading = False

    def start_analysis(self) -> AnalysisAhead | None:
        """Start analysing the paths now (once; nothing for ready reports): `run` does it before Textual
        starts, the load worker when the app was started otherwise (`run_test`)."""
        if self._ahead is None and self.ready_reports is None:
            self._ahead = AnalysisAhead(self.paths, self.sources)
        return self._ahead

    def run(self, *args, **kwargs):
        self.start_analysis()
        return super().run(*args, **kwargs)

    @property
    def analysing(self) -> bool:
        """The analysis thread still runs (the app was closed before it finished)."""
        return self._ahead is not None and not self._ahead.done.is_set()

    @work(thread=True, exclusive=True, group="index", exit_on_error=False)
    def index_timelines(self) -> None:
        self._index_after_first_draw(self.data, get_current_worker())

    def _index_after_first_draw(self, data: "ViewData", worker) -> None:
        """Index every report's timeline (in a worker thread), once the first screen is on the terminal:
        indexing while that screen is built and drawn, the two take turns for the interpreter lock and the
        findings show later (by about 0.1 s on a 1 GB trace)."""
        while not self._first_screen_drawn.wait(0.05):
            if worker.is_cancelled:
                return
        for i in range(len(data.reports)):
            if worker.is_cancelled:
                return
            data.timeline(i)
            self.post_message(TimelineIndexed(i))

    def on_timeline_indexed(self, event: TimelineIndexed) -> None:
        for screen in list(self.waiting_for_index):
            screen.index_ready()

    def on_load_progress(self, event: LoadProgress) -> None:
        screen = self.screen
        if isinstance(screen, LoadingScreen):
            screen.set_stage(event.stage, event.done, event.total, determinate=event.fraction or event.total > 1)

    def on_loaded(self, event: Loaded) -> None:
        self._start(event.data)

    def on_load_failed(self, event: LoadFailed) -> None:
        if self.data is not None:  # the findings are up; only the timeline index failed
            self.notify(clean(event.message), title="Timeline unavailable", severity="error", timeout=15, markup=False)
            return
        self.exit_code = event.exit_code
        self.failure = event.message
        screen = self.screen
        if isinstance(screen, LoadingScreen):
            screen.fail(event.message)

    def _start(self, data: "ViewData") -> None:
        self.data = data
        for mode, cls in screen_classes().items():
            self.add_mode(mode, cls)
        self.switch_mode(self.first_screen)
        self.call_after_refresh(self._first_screen_drawn.set)

    # -- actions -----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters) -> bool | None:
        if action in ("show", "export") and self.data is None:
            return False
        if action == "trace":
            return self.data is not None and len(self.data.reports) > 1
        return True

    def action_show(self, mode: str) -> None:
        if self.data is None or mode not in {m for m, _, _ in SCREENS}:
            return
        self.switch_mode(mode)

    async def action_quit(self) -> None:
        self.exit(self.exit_code, return_code=self.exit_code)

    def action_help(self) -> None:
        from .screens.dialogs import ExportScreen, HelpScreen

        if isinstance(self.screen, (HelpScreen, ExportScreen)):
            return
        self.push_screen(HelpScreen(getattr(self.screen, "HELP", "")))

    def action_export(self) -> None:
        from .screens.dialogs import ExportScreen

        if self.data is None or isinstance(self.screen, ExportScreen):
            return
        default = self.export_dir / "gpuadvise-report.md"
        self.push_screen(ExportScreen(default, cursor_blink=self.cursor_blink), self.export_report)

    def export_report(self, path: Path | None) -> Path | None:
        """Write the markdown report atomically to `path`; tell the user where it went."""
        if path is None or self.data is None:
            return None
        from gpuadvise.analyzer.report.markdown import render

        from .export import export_files

        return export_files(self, path, lambda p: [(p, render(self.data.reports))], "Report written")

    async def action_trace(self, delta: int) -> None:
        if self.data is not None and len(self.data.reports) > 1:
            await self.select_report((self.data.current + delta) % len(self.data.reports))

    async def select_report(self, i: int) -> None:
        self.data.current = i
        self.notify(clean(self.data.label(i)), title="Trace", timeout=3, markup=False)
        screen = self.screen
        if hasattr(screen, "after_recompose"):
            await screen.recompose()
            screen._shown_report = i
            screen.after_recompose()
            screen.focus_main()

    def jump_to(self, jump: "Jump") -> None:
        """Show a place in the timeline (from a finding, a table row or the palette)."""
        if self.data is None:
            return
        self.data.pending_jump = jump
        if jump.report != self.data.current:
            self.data.current = jump.report
        if self.current_mode == "timeline":
            screen = self.screen
            if screen._shown_report != self.data.current:
                self.call_later(screen.on_screen_resume)
            else:
                screen._apply_jump()
        else:
            self.switch_mode("timeline")

    def open_finding(self, i: int) -> None:
        self.switch_mode("findings")
        self.call_after_refresh(lambda: self.screen.select_finding(i) if self.current_mode == "findings" else None)

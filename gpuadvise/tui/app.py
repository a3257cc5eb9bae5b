"""The `gpuadvise view` application: a loading screen first, then one Textual *mode* per screen
(Overview, Findings, Timeline, Kernels & ops, Copies & syncs, Memory, Job), all reading one `ViewData`.

It is built either from paths (read and analysed in a thread worker, with progress) or from ready
reports (tests, benchmarks), so its tests need neither torch nor a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.worker import get_current_worker

from typing import TYPE_CHECKING

from gpuadvise.analyzer.errors import EXIT_INPUT, EXIT_INTERNAL, InputError

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


FIRST_SCREEN = "findings"  # the answer first; the overview is one key away


class _Cancelled(Exception):
    """The app closed while the load ran: the analysis stops at its next progress callback."""


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
                 sources=None):
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
        from gpuadvise.analyzer import run as analysis

        from .data import ViewData

        worker = get_current_worker()
        try:
            sources = self.sources if self.sources is not None else analysis.resolve_inputs(self.paths)
            progress, on_bytes = self._progress_hooks(worker)
            # the reader may fork its second-core decoder beside Textual's threads (read/forked.py says why)
            with analysis.beside_threads():
                reports = analysis.analyze(sources, jobs=1, progress=progress, bytes_progress=on_bytes)
            if worker.is_cancelled:
                return
            data = ViewData(reports)
            self.post_message(Loaded(data))
            for i in range(len(reports)):  # the timeline index: in the background, after the findings show
                if worker.is_cancelled:
                    return
                data.timeline(i)
                self.post_message(TimelineIndexed(i))
        except _Cancelled:
            return
        except InputError as exc:
            self.post_message(LoadFailed(f"gpuadvise: error: {exc}", EXIT_INPUT))
        except Exception as exc:  # our bug: show it, don't crash the terminal
            self.post_message(LoadFailed(f"gpuadvise: internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL))
        finally:
            self.loading = False

    def _progress_hooks(self, worker):
        """The analysis' callbacks: a step of the bar per file, and within a file the bytes decoded (at
        most every 2 %) so that the bar moves with the parse instead of pulsing. A cancelled load stops
        at the next callback."""
        current = {"label": "", "i": 0, "n": 1}
        last = [-1.0]

        def progress(i, n, src) -> None:
            if worker.is_cancelled:
                raise _Cancelled
            label = f"{short_source(str(src.path))}{_size(src.path)} ({i + 1} of {n})"
            current.update(label=label, i=i, n=n)
            last[0] = -1.0
            self.post_message(LoadProgress(f"Reading and analysing {label}", i, n))

        def on_bytes(done: int, total: int) -> None:
            frac = done / total if total else 0.0
            if frac - last[0] >= 0.02 or done >= total:
                last[0] = frac
                stage = "Analysing" if done >= total else "Reading"
                self.post_message(LoadProgress(f"{stage} {current['label']}", current["i"] + frac, current["n"],
                                               fraction=True))

        return progress, on_bytes

    @work(thread=True, exclusive=True, group="index", exit_on_error=False)
    def index_timelines(self) -> None:
        for i in range(len(self.data.reports)):
            self.data.timeline(i)
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


def _size(path: Path) -> str:
    try:
        n = path.stat().st_size
    except OSError:
        return ""
    return f", {n / 1e6:,.1f} MB" if n >= 1e5 else ""

"""The analysis behind `gpuadvise view`, in a thread of its own. No Textual here: the view's command
imports the analyzer, starts the analysis, and only then imports the app, so that Textual's imports run
while the reader's C scanner works without the interpreter lock (about 0.1 s sooner on screen for a 1 GB
trace, measured in turns against starting it from the app: docs/reading-traces-fast.md)."""

from __future__ import annotations

import threading
from pathlib import Path

from .text import short_source


def start_analysis(paths: list[str], sources) -> "AnalysisAhead":
    """The view's analysis of `paths` (as `resolve_inputs` made them: `sources`), started now. The analyzer
    is imported first, in this thread: imported beside Textual's imports instead, both would wait for the
    interpreter lock and the reading would start no sooner."""
    from gpuadvise.analyzer import run as analysis

    analysis.analyze  # noqa: B018 - the names are imported lazily: this imports the analysis, here

    return AnalysisAhead(paths, sources)


class Cancelled(Exception):
    """The app closed while the load ran: the analysis stops at its next progress callback."""


class AnalysisAhead:
    """The analysis of the app's inputs in a thread of its own, started by `gpuadvise view` before it imports
    Textual (`start_analysis`), else the moment the app is asked to run: it reads while Textual is imported,
    starts and draws the loading screen (the reader's C scanner and its forked second-core decoder need no
    interpreter lock), where a load worker started on mount would begin only after them. The load worker
    relays its progress to the screen and takes its reports. Closing the app stops it at its next progress
    callback."""

    def __init__(self, paths: list[str], sources=None):
        self.paths, self.sources = paths, sources
        self.cancelled = threading.Event()
        self.done = threading.Event()
        self.latest: tuple | None = None  # the newest LoadProgress arguments
        self.reading = threading.Event()  # set once the reader reports its first bytes
        self.reports: list | None = None
        self.error: BaseException | None = None
        self._file = {"label": "", "i": 0, "n": 1}
        self._last = -1.0
        self._thread = threading.Thread(target=self._run, name="gpuadvise-analysis", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            from gpuadvise.analyzer import run as analysis

            sources = self.sources if self.sources is not None else analysis.resolve_inputs(self.paths)
            # the reader may fork its second-core decoder beside Textual's threads (read/forked.py says why)
            with analysis.beside_threads():
                self.reports = analysis.analyze(sources, jobs=1, progress=self._progress, bytes_progress=self._bytes)
        except BaseException as exc:  # noqa: BLE001 - handed to the load worker, which reports it
            self.error = exc
        finally:
            self.done.set()

    def _progress(self, i, n, src) -> None:
        """A step of the bar per file."""
        if self.cancelled.is_set():
            raise Cancelled
        label = f"{short_source(str(src.path))}{_size(src.path)} ({i + 1} of {n})"
        self._file.update(label=label, i=i, n=n)
        self._last = -1.0
        self.latest = (f"Reading and analysing {label}", i, n, False)

    def _bytes(self, done: int, total: int) -> None:
        """Within a file, the bytes decoded (at most every 2 %), so that the bar moves with the parse."""
        if self.cancelled.is_set():
            raise Cancelled
        self.reading.set()
        frac = done / total if total else 0.0
        if frac - self._last >= 0.02 or done >= total:
            self._last = frac
            stage = "Analysing" if done >= total else "Reading"
            f = self._file
            self.latest = (f"{stage} {f['label']}", f["i"] + frac, f["n"], True)


def _size(path: Path) -> str:
    try:
        n = path.stat().st_size
    except OSError:
        return ""
    return f", {n / 1e6:,.1f} MB" if n >= 1e5 else ""

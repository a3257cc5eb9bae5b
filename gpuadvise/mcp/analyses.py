"""The analyses the server keeps, and how one runs for a tool call.

An assistant asks about the same run several times (its findings, then its steps, its kernels, a line of
code), so the reports of the last few inputs are kept, keyed by their files' paths, sizes and times: a
changed file is analysed again. An analysis runs through run/'s one way in (`run.analyze`, every rank in
this process, as `gpuadvise view` does: the tables need their events) in a worker thread, one at a time
(two would only share the same cores, and the reader may fork its second-core decoder only beside
threads that hold nothing it needs: the event loop's, the transport's and the waiting calls'). Its own
progress callbacks become the call's progress notifications, and they are where a cancelled call stops
it: the next one raises `AnalysisCancelled` (analyzer/errors.py) in the worker, which leaves at once.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict

import anyio
import anyio.from_thread
import anyio.to_thread

from gpuadvise.analyzer import run
from gpuadvise.analyzer.errors import AnalysisCancelled

log = logging.getLogger("gpuadvise.mcp")

# Reports kept (a big trace's model is large: the few runs an assistant compares and drills into).
KEEP = 2
# Of one input's share of the progress, what its decode takes; the rules and figures take the rest.
READING = 0.8


class Progress:
    """One tool call's progress: the worker thread's updates, relayed to the client as MCP progress
    notifications by `send(progress, total, message)` (a coroutine function, run on the event loop by
    `Analyses.reports`), values strictly increasing as the protocol asks. The worker never waits on the
    event loop's I/O: an update is handed over without blocking (`_handover`). Once the call is cancelled
    (`cancelled` set), the next update raises `AnalysisCancelled` in the worker instead."""

    def __init__(self, send, total: float | None = 1.0):
        self.send, self.total = send, total
        self.cancelled = threading.Event()
        self._sent, self._message = -1.0, None
        self._handover = None  # the relay's side of a stream, while a call relays

    def update(self, value: float, message: str) -> None:
        if self.cancelled.is_set():
            raise AnalysisCancelled
        if self.total is not None:
            value = min(value, self.total)
        if value <= self._sent or (value - self._sent < 0.01 * (self.total or 1.0) and message == self._message):
            return  # not forward, or too small a step to be worth a message
        self._sent, self._message = value, message
        if self._handover is not None:
            try:
                anyio.from_thread.run_sync(self._handover.send_nowait, (value, self.total, message))
            except Exception:  # noqa: BLE001 - the call is gone (its relay closed): the work goes on or stops above
                pass


class Analyses:
    """The last `keep` inputs' reports (`Reports`), and the lock that runs one analysis at a time."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._held: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    async def reports(self, path: str, progress: Progress, part: tuple[float, float] = (0.0, 1.0)):
        """The analysis of `path` (a trace, a run folder, a folder of rank traces, a snapshot), from those
        kept or made now; `part`: the (start, length) of the call's progress it takes. Bad input raises
        `InputError`, the CLI's one line; a cancelled call stops the worker at its next progress callback."""
        handover, updates = anyio.create_memory_object_stream(math.inf)

        async def relay():
            async with updates:
                async for value, total, message in updates:
                    await progress.send(value, total, message)

        reports = failure = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(relay)
            progress._handover = handover
            try:
                reports = await anyio.to_thread.run_sync(self._analyse, path, progress, part, abandon_on_cancel=True)
            except anyio.get_cancelled_exc_class():
                progress.cancelled.set()  # the call is answered no more: the worker stops at its next callback
                raise
            except Exception as exc:  # noqa: BLE001 - raised below, as itself (not in the task group's group)
                failure = exc
            finally:
                progress._handover = None
                handover.close()  # the relay sends what was handed over, then ends
        if failure is not None:
            raise failure
        return reports

    def _analyse(self, path: str, progress: Progress, part: tuple[float, float]):
        base, span = part
        sources = run.resolve_inputs([path])  # a missing or unreadable path fails here, before any wait
        key = _key(sources)
        if not self._lock.acquire(blocking=False):
            progress.update(base, f"waiting for another analysis to finish before {path}")
            while not self._lock.acquire(timeout=0.1):
                if progress.cancelled.is_set():
                    raise AnalysisCancelled
        try:
            if key in self._held:
                self._held.move_to_end(key)
                return self._held[key]
            reports = self._run(sources, path, progress, base, span)
            self._held[key] = reports
            while len(self._held) > self.keep:
                self._held.popitem(last=False)
        finally:
            self._lock.release()
        progress.update(base + span, f"analysed {path}")
        return reports

    def _run(self, sources, path: str, progress: Progress, base: float, span: float):
        n = max(len(sources), 1)
        now = {"i": 0, "name": path}

        def each_source(i, count, src):
            now.update(i=i, name=str(src.path))
            progress.update(base + span * i / n, f"reading {src.path}" + (f" ({i + 1} of {count})" if count > 1 else ""))

        def each_chunk(done, total):  # before each chunk is decoded; the rules that follow report nothing
            frac = done / total if total else 1.0
            progress.update(base + span * (now["i"] + READING * frac) / n, f"{100 * frac:.0f} % of {now['name']} read")

        log.info("analysing %s", path)
        try:
            with run.beside_threads():  # the reader may fork its decoder beside the server's threads (see above)
                reports = run.analyze(sources, jobs=1, progress=each_source, bytes_progress=each_chunk)
        except AnalysisCancelled:
            log.info("stopped analysing %s: the call was cancelled", path)
            raise
        log.info("analysed %s", path)
        return reports


def _key(sources) -> tuple:
    """What makes two analyses the same: each file read, with its size and modification time."""
    key = []
    for s in sources:
        for p in (s.path, getattr(s, "snapshot", None)):
            if p is None:
                continue
            try:
                st = os.stat(p)
                key.append((str(p), st.st_size, st.st_mtime_ns))
            except OSError:
                key.append((str(p), None, None))
    return tuple(key)

"""Capture requests that every rank of a job follows, through the run folder: `capture-requests.jsonl`.

A window asked for while the script runs (a signal to one rank, `gpuadvise trigger`, a slowdown one rank
noticed) must cover the same step numbers on every rank: a collective's wait on one rank is another
rank's compute. So a request names the step boundary where the window's warm-up begins, a few steps
ahead (`LEAD`), and is appended to one file in the run folder that every rank reads at its step
boundaries (an `os.stat` every `POLL_EVERY` steps; a line is read only when the file grew). Ranks of a
synchronous job are within a step or two of each other, so every rank reads it in time. A single
process (no `WORLD_SIZE` above 1) starts the window at the next step.

Lines, one JSON object each: `{"id": "…", "step": 130, "trigger": "signal", "detail": "…", "by": "rank 0
(pid 1234)", "at": unix time}`. `gpuadvise trigger --file` cannot know the job's step: it writes `"step":
null`, and the first rank that reads it appends the same id with a step. Every rank takes the first line
of an id that has a step, so all agree, even when two ranks resolve it at once (appends of one short
line are atomic, and every rank reads the file in the same order).

Kept in its own module, small, so that the job-level coordination elsewhere can use or replace it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass

REQUESTS = "capture-requests.jsonl"
POLL_EVERY = 4
LEAD = 2 * POLL_EVERY + 2  # a request names a step this far ahead when ranks must agree


@dataclass(frozen=True)
class Request:
    id: str
    step: int  # the step boundary where the window's warm-up begins
    trigger: str  # "signal", "trigger file", "slower", "stall"
    detail: str
    by: str


def distributed() -> bool:
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def who(rank: int | None) -> str:
    return f"{'rank ' + str(rank) if rank is not None else 'the process'} (pid {os.getpid()})"


def append(folder, entry: dict) -> None:
    """Append one request line (one write: concurrent appends from several ranks do not interleave)."""
    line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
    fd = os.open(os.path.join(folder, REQUESTS), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def new_id() -> str:
    return uuid.uuid4().hex[:12]


class Requests:
    """One rank's view of the request file: `post` a request, `poll` the ones to follow, each once."""

    def __init__(self, folder, rank: int | None, is_distributed: bool | None = None):
        self.folder = str(folder)
        self.path = os.path.join(self.folder, REQUESTS)
        self.rank = rank
        self.lead = LEAD if (distributed() if is_distributed is None else is_distributed) else 1
        self._offset = 0
        self._partial = b""
        self._size = -1
        self._resolved: dict[str, Request] = {}
        self._order: list[str] = []  # ids with a step, in file order
        self._unresolved: dict[str, dict] = {}
        self._claimed: set[str] = set()
        self._delivered: set[str] = set()

    def post(self, k: int, trigger: str, detail: str = "", step: int | None = None) -> str:
        """Ask every rank for a window starting `lead` steps after boundary k (or at `step`)."""
        rid = new_id()
        append(self.folder, {"id": rid, "step": step if step is not None else k + self.lead, "trigger": trigger,
                             "detail": detail, "by": who(self.rank), "at": round(time.time(), 3)})
        return rid

    def poll(self, k: int, force: bool = False) -> list[Request]:
        """The requests not yet returned, in file order (every `POLL_EVERY` boundaries unless `force`)."""
        if not force and k % POLL_EVERY:
            return []
        self._read()
        claimed = False
        for rid, entry in list(self._unresolved.items()):
            if rid not in self._resolved and rid not in self._claimed:
                self._claimed.add(rid)
                append(self.folder, dict(entry, step=k + self.lead, by=who(self.rank), at=round(time.time(), 3)))
                claimed = True
        if claimed:  # read back at once: the first line that gives the request a step is the one every rank takes
            self._read()
        out = [self._resolved[rid] for rid in self._order if rid not in self._delivered]
        self._delivered.update(r.id for r in out)
        return out

    def _read(self) -> None:
        """Read what was appended since the last read."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return
        if size == self._size:
            return
        self._size = size
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = self._partial + fh.read()
        self._offset = size
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                continue
            rid, step = entry["id"], entry.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                if rid not in self._resolved:
                    self._resolved[rid] = Request(rid, step, str(entry.get("trigger") or "request"),
                                                  str(entry.get("detail") or ""), str(entry.get("by") or ""))
                    self._order.append(rid)
                self._unresolved.pop(rid, None)
            elif step is None and rid not in self._resolved:
                self._unresolved[rid] = entry

"""One piece of work in a forked child, its picklable result sent back through a pipe.

Decoding is CPU-bound Python/C work under the GIL, so a second core needs a second process. A forked
child sees the parent's memory (the file's bytes, the open file) without a copy. The loader uses this
for the second half of a big trace, on both of its paths (streamed and whole-file).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from contextlib import contextmanager


_vouched = threading.local()  # per thread: whether its caller vouched for the process' other threads


def can_fork() -> bool:
    """Never fork a process that runs other threads (a lock held by one of them stays held forever), unless
    the forking thread runs inside `beside_threads()`."""
    return hasattr(os, "fork") and (threading.active_count() == 1 or getattr(_vouched, "others_safe", False))


@contextmanager
def beside_threads():
    """Inside this block, this thread may fork although other threads run: its caller vouches that they
    hold no lock the child needs. The child only reads the trace file and decodes it (msgspec, numpy), or
    runs rules on the analysis (run/rulequeue.py, with stdout and stderr sent to /dev/null), and writes
    one pickle to its own pipe, then leaves with os._exit: it never writes to the terminal, never logs,
    never flushes or closes what the parent opened. `gpuadvise view` reads in a worker thread
    beside Textual's (the event loop and the terminal's reader and writer, which hold nothing of that):
    without this it would decode on one core."""
    before = getattr(_vouched, "others_safe", False)
    _vouched.others_safe = True
    try:
        yield
    finally:
        _vouched.others_safe = before


class Forked:
    """Starts `work()` in a child at once; `result()` waits for it: `(True, value)`, or `(False, None)`
    when the child failed in any way (the caller then does the work itself)."""

    def __init__(self, work):
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: run, ship, leave without running the parent's cleanup
            code = 1
            try:
                os.close(read_fd)
                value = work()
                with os.fdopen(write_fd, "wb") as out:
                    pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)  # straight into the pipe
                code = 0
            except BaseException:  # noqa: BLE001 - anything: reported to the parent as a failure
                pass
            finally:
                os._exit(code)
        os.close(write_fd)
        self.read_fd = read_fd

    def result(self) -> tuple[bool, object]:
        with os.fdopen(self.read_fd, "rb") as inp:
            try:
                value, loaded = pickle.load(inp), True  # from the pipe: no second copy of the payload
            except (EOFError, pickle.UnpicklingError):
                value, loaded = None, False
        _, status = os.waitpid(self.pid, 0)
        return (True, value) if loaded and status == 0 else (False, None)

    def stop(self) -> None:
        """The parent gave up (an error of its own): end the child and reap it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(self.read_fd)
        os.waitpid(self.pid, 0)

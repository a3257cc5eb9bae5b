"""Keep the profiler's own chatter off the user's stderr, and nothing else.

- torch's Python warning "Profiler clears events at the end of each cycle…" is ignored by a warnings
  filter that matches that message *and* a warning raised from torch.profiler: the same text
  warned by the user's code still shows.
- kineto's C++ log lines (`USDT:… profiler_start`, `STAGE:… Completed Stage`, and on a CUDA build
  without a GPU `ERROR:… gpuGetDeviceCount failed with code 35`) are written straight to file
  descriptor 2, so fd 2 is pointed at a temporary file only while a profiler transition runs
  (start, stop, export: a few calls per run, never while the user's code runs on this thread);
  afterwards every line of it that is not such a log line is written back to the real stderr, and the
  log lines go to the run folder's `profiler.log` (`set_log`), where they are kept for a bug report.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings

# kineto's log format: KIND:YYYY-MM-DD HH:MM:SS pid:tid File.cpp:line] message
KINETO_LINE = re.compile(rb"^(USDT|STAGE|INFO|WARNING|ERROR):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [^\]\n]*\] [^\n]*(\n|$)", re.M)


def ignore_profiler_warnings() -> None:
    warnings.filterwarnings("ignore", message=r"Warning: Profiler clears events at the end of each cycle",
                            category=UserWarning, module=r"torch\.profiler")


_LOG: str | None = None  # where the lines kept off stderr go (the run folder's profiler.log)
_ERRORS_TO_STDERR = True


def set_log(path, errors_to_stderr: bool = True) -> None:
    """Keep the profiler's log lines in `path`. Its ERROR/WARNING lines also stay on stderr where they
    matter: with a usable GPU (a CUPTI error means a trace without kernels). Without one, kineto's
    failed GPU enumeration (`gpuGetDeviceCount failed with code 35`) is expected and only logged."""
    global _LOG, _ERRORS_TO_STDERR
    _LOG = str(path) if path is not None else None
    _ERRORS_TO_STDERR = errors_to_stderr


def strip_kineto(data: bytes, keep_errors: bool = True) -> bytes:
    if keep_errors:
        return KINETO_LINE.sub(lambda m: m.group(0) if m.group(1) in (b"ERROR", b"WARNING") else b"", data)
    return KINETO_LINE.sub(b"", data)


def _keep(data: bytes) -> None:
    """Append the profiler's own log lines to the run folder's log (never fails the run)."""
    lines = b"".join(m.group(0).rstrip(b"\n") + b"\n" for m in KINETO_LINE.finditer(data))
    if not lines or _LOG is None:
        return
    try:
        with open(_LOG, "ab") as fh:
            fh.write(lines)
    except OSError:
        pass


@contextlib.contextmanager
def quiet_fd2():
    """Run the body with fd 2 captured; write back all but kineto's log lines. If fd 2 cannot be
    swapped (closed, say), the body simply runs with stderr as it is."""
    try:
        _flush()
        saved = os.dup(2)
    except OSError:
        yield
        return
    tmp = None
    try:
        tmp = tempfile.TemporaryFile()
        os.dup2(tmp.fileno(), 2)
    except OSError:
        os.close(saved)
        if tmp is not None:
            tmp.close()
        yield
        return
    try:
        yield
    finally:
        _flush()
        os.dup2(saved, 2)
        os.close(saved)
        try:
            tmp.seek(0)
            data = tmp.read()
            _keep(data)
            rest = strip_kineto(data, keep_errors=_ERRORS_TO_STDERR)
            while rest:
                rest = rest[os.write(2, rest):]
        except OSError:
            pass
        finally:
            tmp.close()


def _flush() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass

"""Where a report goes: checks before the (possibly long) analysis, and an atomic write after it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.filemode import publish


def check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(path, "output is a folder")
    if not parent.is_dir():
        raise InputError(path, f"output folder {parent} does not exist")
    if not os.access(parent, os.W_OK) and not (path.exists() and os.access(path, os.W_OK)):
        raise InputError(path, "output is not writable")


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside the target, then rename: no half-written report, ever."""
    data = text.encode("utf-8")
    if path.exists() and not path.is_file():  # a device such as /dev/null or /dev/full: write in place
        try:
            with open(path, "wb") as fh:
                fh.write(data)
                fh.flush()
        except OSError as exc:
            raise InputError(path, f"cannot write: {exc.strerror or exc}") from None
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    except OSError as exc:
        raise InputError(path, f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            publish(fh.fileno())  # as `> report.md` would: the umask decides, not mkstemp's 0600
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InputError(path, f"cannot write: {exc.strerror or exc}") from None

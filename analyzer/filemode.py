"""The mode a new file gets: what `open(path, "w")` would give under the user's umask.

Files are written to a `mkstemp` temp file and renamed into place (never half-written); mkstemp makes
them 0600, which would turn a report meant for sharing into a private one. `publish` sets the mode an
ordinary write would have produced before the rename.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()


def umask() -> int:
    # the umask can only be read by setting it; the lock keeps the brief swap from racing another thread
    with _lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def publish(fd_or_path, mode: int = 0o666) -> None:
    """chmod a freshly made temp file (by fd or path) to `mode` minus the umask."""
    wanted = mode & ~umask()
    if isinstance(fd_or_path, int):
        os.fchmod(fd_or_path, wanted)
    else:
        os.chmod(fd_or_path, wanted)

"""The profiling session running in this process, if any (one at a time: torch's profiler is
process-wide). Kept on its own so that the framework integrations, which the session installs, can
reach it without importing the session."""

from __future__ import annotations

_ACTIVE = None


def active():
    """The running `Session`, or None."""
    return _ACTIVE


def set_active(session) -> None:
    global _ACTIVE
    _ACTIVE = session

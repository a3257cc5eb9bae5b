"""The user's traceback as `python train.py` would print it, without gpuadvise's own frames.

The script runs inside the bootstrap (runpy, `exec`) and some of its calls go through our hooks (the
patched `backward`, `CUDAGraph.replay`); those frames are noise to someone debugging their script.
They are cut out of the traceback chain (and of chained exceptions), then the usual hook prints it.
"""

from __future__ import annotations

import os
import sys

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gpuadvise/harness: the bootstrap and the hooks


def _is_ours(filename: str) -> bool:
    folder = os.path.dirname(os.path.abspath(filename))
    return filename.startswith("<frozen runpy>") or folder == _OURS or folder.startswith(_OURS + os.sep)


def strip_our_frames(tb):
    """The traceback chain `tb` with our frames unlinked (tb_next is writable)."""
    kept = []
    while tb is not None:
        if not _is_ours(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    for a, b in zip(kept, kept[1:] + [None]):
        a.tb_next = b
    return kept[0] if kept else None


def print_user_traceback(exc: BaseException) -> None:
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:  # chained exceptions carry their own tracebacks
        seen.add(id(e))
        e.__traceback__ = strip_our_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
    sys.excepthook(type(exc), exc, exc.__traceback__)

"""Big traces on the careful path are decoded by two processes: a forked worker (forked.py) decodes the
second half of the events array and sends back plain numpy columns and its string tables, which the
parent re-codes and appends.

Kept apart because it is an optimisation with its own failure modes (a split inside a string, a
worker that dies): each of them returns False and the caller decodes in one process instead.
"""

from __future__ import annotations

import os

import msgspec

from . import forked
from .chunks import BOUNDARY, Progress, array_chunks, array_interior, feed
from .columns import Builder

PARALLEL_MIN_BYTES = int(os.environ.get("GPUADVISE_PARALLEL_MIN_BYTES", 48 << 20))


def load_workers() -> int:
    env = os.environ.get("GPUADVISE_LOAD_WORKERS")
    if env and env.isdigit():
        return max(1, int(env))
    return min(2, os.cpu_count() or 1)


def parallel_parts(array):
    data = memoryview(array)
    if data.nbytes < PARALLEL_MIN_BYTES or load_workers() < 2 or not forked.can_fork():
        return None
    lo, hi = array_interior(data)
    m = BOUNDARY.search(data, lo + (hi - lo) // 2, hi)
    if m is None:
        return None
    return (lo, m.start() + 1), (m.end() - 1, hi)


def build_parallel(b: Builder, array, parts, progress: Progress | None = None) -> bool:
    (lo1, hi1), (lo2, hi2) = parts

    def second_half():
        child = Builder(b.meta)
        feed(child, array_chunks(array, lo2, hi2), retry=False)
        return child.export()

    worker = forked.Forked(second_half)
    try:
        feed(b, array_chunks(array, lo1, hi1), retry=False, progress=progress)
    except msgspec.DecodeError:
        worker.stop()
        return False  # the split fell inside a string: redo it in one process
    except BaseException:
        worker.stop()
        raise
    ok, share = worker.result()
    if not ok:
        return False
    b.merge(share)
    return True

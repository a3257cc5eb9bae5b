"""CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot` pickles), read safely.

A snapshot is a pickle, and a pickle can run code when loaded. This reader admits no globals at all:
the allocator writes only dicts, lists, strings, numbers and booleans, so anything that asks the
unpickler for a class or function is refused before it can run.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from .errors import InputError

MAX_SNAPSHOT_BYTES = 4 * 2**30


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a memory snapshot holds plain data only")


def load_snapshot(path: str | Path) -> dict:
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise InputError(path, f"snapshot is {size / 2**30:.1f} GiB, larger than any real allocator snapshot")
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except PermissionError:
        raise InputError(path, "permission denied") from None
    if not data:
        raise InputError(path, "empty file")
    try:
        obj = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise InputError(path, f"not a plain-data memory snapshot ({exc})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError, RecursionError) as exc:
        raise InputError(path, f"not a readable memory snapshot ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or "segments" not in obj:
        raise InputError(path, "pickle is not a CUDA memory snapshot (no 'segments')")
    return obj


def analyze_snapshot(src):
    from .engine import TraceReport

    snap = load_snapshot(src.path)
    segments = snap.get("segments") or []
    reserved = sum(int(s.get("total_size", 0) or 0) for s in segments if isinstance(s, dict))
    allocated = sum(int(s.get("allocated_size", 0) or 0) for s in segments if isinstance(s, dict))
    note = (f"memory snapshot: {len(segments)} segments, {reserved / 2**30:.2f} GiB reserved, "
            f"{allocated / 2**30:.2f} GiB allocated")
    return TraceReport(source=str(src.path), rank=src.rank, model=None, metrics=None, findings=[], notes=[note],
                       kind="snapshot")

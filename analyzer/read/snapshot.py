"""CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot` pickles), read safely.

A snapshot is a pickle, and a pickle can run code when loaded. This reader admits no globals at all:
the allocator writes only dicts, lists, strings, numbers and booleans, so anything that asks the
unpickler for a class or function is refused before it can run. The metrics are in `memory.py`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

from gpuadvise.analyzer.errors import InputError

MAX_SNAPSHOT_BYTES = 4 * 2**30


class _Refused(pickle.UnpicklingError):
    """The pickle asked for a global: code, a class or a function."""


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise _Refused(f"refusing to load {module}.{name}: a memory snapshot holds plain data only")


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
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    if not data:
        raise InputError(path, "empty file")
    try:
        obj = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise InputError(path, f"not a plain-data memory snapshot ({exc})") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError, RecursionError) as exc:
        raise InputError(path, f"not a readable memory snapshot ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise InputError(path, "pickle is not a CUDA memory snapshot (no 'segments' list)")
    return obj

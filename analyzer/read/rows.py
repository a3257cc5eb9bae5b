"""A chunk's events, as the column builder (columns.py) reads them: one interface, two sources.

- `StructRows`: the events decoded by msgspec into `Event` structs (events.py). The exact path: every
  trace can be read this way, damaged ones included (they are salvaged event by event, repair.py).
- `ScannedRows`: the flat columns of the compiled scanner (jsonscan.c), which reads a chunk's JSON
  straight into arrays with no object per event. Strings and other free-form values come back as the
  distinct raw JSON texts of the chunk, decoded here once each (by msgspec, as the struct path would).

The scanner answers only for chunks msgspec would decode without complaint and whose names and
categories are plain values; anything else (`scan_chunk` returns None) goes the struct way, so both
sources always give the builder the same values, and the builder the same columns.

Each source hands out, for its rows: the timestamps and durations, numeric args as float64 (a missing
value NaN), pid/tid as ids, names as interned codes, and the free-form args as Python values.
"""

from __future__ import annotations

import operator
import os
from collections import Counter
from itertools import repeat

import msgspec
import numpy as np
import pandas as pd

from . import events as ev

try:  # the compiled scanner; where it was not built (no C compiler at install) every chunk goes by structs
    from ._jsonscan import scan as _scan
except ImportError:  # pragma: no cover - depends on the install
    _scan = None
# GPUADVISE_SCAN=0 reads every chunk by structs (to compare the two, or to rule the scanner out)
SCAN = _scan is not None and os.environ.get("GPUADVISE_SCAN", "1") != "0"

_EMPTY_ARGS = ev.Args()
_TS, _DUR, _NAME, _PH, _CAT = (operator.attrgetter(f) for f in ("ts", "dur", "name", "ph", "cat"))
_ANY = msgspec.json.Decoder()


def f64(values) -> np.ndarray:
    """Floats, None → NaN (numpy converts None to NaN for float arrays)."""
    return np.asarray(values if isinstance(values, list) else list(values), dtype=np.float64)


def ids_of(a: np.ndarray) -> np.ndarray:
    """Integer ids from float64 (NaN: missing) → int64, missing -1; ids outside int64 (never written by
    Kineto) count as missing too."""
    bad = np.isnan(a) | (np.abs(a) >= 2.0**63)
    return np.where(bad, -1.0, a).astype(np.int64)


class StructRows:
    """Events decoded into msgspec structs, and their args (None where an event has none)."""

    def __init__(self, evs: list, args: list):
        self.evs, self.args = evs, args

    def __len__(self) -> int:
        return len(self.evs)

    def take(self, keep) -> "StructRows":
        """The rows at positions `keep` (an integer array), in that order."""
        keep = keep.tolist() if isinstance(keep, np.ndarray) else keep
        return StructRows(list(map(self.evs.__getitem__, keep)), list(map(self.args.__getitem__, keep)))

    def with_empty_args(self) -> "StructRows":
        """Events without args read as having all of them missing."""
        if None in self.args:
            self.args = [a if a is not None else _EMPTY_ARGS for a in self.args]
        return self

    def ts(self) -> np.ndarray:
        return f64(list(map(_TS, self.evs)))

    def dur(self) -> np.ndarray:
        return f64(list(map(_DUR, self.evs)))

    def num(self, field: str) -> np.ndarray:
        return f64(self.values(field))

    def values(self, field: str) -> list:
        """One args field of every row (attribute access in C, not a Python loop)."""
        return list(map(operator.attrgetter(field), self.args))

    def external(self) -> np.ndarray:
        """`External id` (new traces) or `external id` (2021 traces)."""
        ids = self.values("external_id")
        if ids.count(None):
            legacy = self.values("external_id_legacy")
            ids = [x if x is not None else y for x, y in zip(ids, legacy)]
        return ids_of(f64(ids))

    def idents(self, builder, field: str):
        return builder._idents(list(map(operator.attrgetter(field), self.evs)))

    def names(self, builder) -> np.ndarray:
        return builder._names(self.evs)

    def raw(self, field: str, picked: list) -> list:
        """The raw JSON texts (bytes) of a field kept raw (`Input type`, `Input Dims`) at rows `picked`."""
        get, args = operator.attrgetter(field), self.args
        return [bytes(get(args[i])) for i in picked]

    # the chunk as a whole: categories, and the events of uncategorised kinds (metadata, [memory])
    def is_meta(self) -> np.ndarray:
        return np.fromiter(map(operator.eq, map(_PH, self.evs), repeat("M")), bool, count=len(self.evs))

    def is_memory(self) -> np.ndarray:
        # operator.eq, not numpy object arrays: a name may be any JSON value (a list, in a broken trace)
        return np.fromiter(map(operator.eq, map(_NAME, self.evs), repeat("[memory]")), bool, count=len(self.evs))

    def metadata(self, i: int) -> tuple:
        """(name, pid, tid, the args' `name`) of a metadata event; the last None without args."""
        e, a = self.evs[i], self.args[i]
        return e.name, e.pid, e.tid, (a.name if a is not None else None)

    def unknown_categories(self) -> Counter:
        return Counter(map(str, map(_CAT, self.evs)))


class ScannedChunk:
    """One chunk as the compiled scanner left it: columns (numpy views of its arrays) and the distinct raw
    JSON texts they point at, decoded once each."""

    def __init__(self, n: int, cols: dict, raws: list, values: list):
        self.n, self.raws, self.values = n, raws, values
        self.cols = cols

    def column(self, name: str, dtype, missing) -> np.ndarray:
        data = self.cols.get(name)
        if data is None:
            return np.full(self.n, missing, dtype=dtype)
        return np.frombuffer(data, dtype=dtype)


_INT32, _INT64, _F64 = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float64)
# raw ids that must decode (msgspec would have decoded them as str or Any); `Input type`/`Input Dims` are
# kept raw by msgspec too, and decoded later (leniently) for matmuls only
_DECODED = ("ph", "cat", "name", "pid_raw", "tid_raw", "call_stack", "collective_name", "pg_name", "pg_desc",
            "pg_ranks", "dtype", "meta_name", "labels")


def scan_chunk(buf) -> "ScannedRows | None":
    """The chunk through the compiled scanner, or None where the struct path must read it: the scanner was
    not built, the chunk is not what msgspec would decode cleanly, one of its texts is not valid UTF-8, or a
    name or category is a list or an object (the struct path's fallbacks for those are its own)."""
    if not SCAN:
        return None
    out = _scan(buf)
    if out is None:
        return None
    n, cols, raws = out
    # each decoded column's distinct ids (-1: missing, -2 for pid/tid: an integer or missing)
    distinct = {name: pd.unique(np.frombuffer(cols[name], _INT32)).tolist() for name in _DECODED if name in cols}
    values: list = [None] * len(raws)
    for i in {i for ids in distinct.values() for i in ids if i >= 0}:
        try:
            values[i] = _ANY.decode(raws[i])
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            return None
    if any(i >= 0 and isinstance(values[i], (list, dict)) for name in ("cat", "name") for i in distinct.get(name, ())):
        return None
    chunk = ScannedChunk(n, cols, raws, values)
    return ScannedRows(chunk, np.arange(n))


class ScannedRows:
    """Some rows (`rows`, indices into the chunk, in event order) of a scanned chunk."""

    def __init__(self, chunk: ScannedChunk, rows: np.ndarray):
        self.chunk, self.rows = chunk, rows

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, keep) -> "ScannedRows":
        return ScannedRows(self.chunk, self.rows[np.asarray(keep, dtype=np.int64)])

    def with_empty_args(self) -> "ScannedRows":
        return self  # a missing column, or a row without args, already reads as missing

    def _col(self, name: str, dtype, missing) -> np.ndarray:
        return self.chunk.column(name, dtype, missing)[self.rows]

    def ts(self) -> np.ndarray:
        return self._col("ts", _F64, np.nan)

    def dur(self) -> np.ndarray:
        return self._col("dur", _F64, np.nan)

    def num(self, field: str) -> np.ndarray:
        return self._col(field, _F64, np.nan)

    def external(self) -> np.ndarray:
        ids = self.num("external_id")
        missing = np.isnan(ids)
        if missing.any():
            ids = np.where(missing, self.num("external_id_legacy"), ids)
        return ids_of(ids)

    def values(self, field: str) -> list:
        """Per row, the decoded value of a raw-id column (None where missing)."""
        if field not in self.chunk.cols:
            return [None] * len(self.rows)
        values = self.chunk.values
        return [values[i] if i >= 0 else None for i in self._col(field, _INT32, -1).tolist()]

    def idents(self, builder, field: str) -> np.ndarray:
        """pid/tid as ids: integers as they are, missing -1, strings through the builder's `_ident` in
        first-seen order (which is the order in which it numbers names it has not seen)."""
        kind = self._col(field + "_raw", _INT32, -2)
        out = np.where(kind == -2, -1, self._col(field, _INT64, 0))
        strings = kind >= 0
        if strings.any():
            where, distinct = pd.factorize(kind[strings])  # distinct values in first-seen order
            values = self.chunk.values
            out[strings] = np.array([builder._ident(values[i]) for i in distinct.tolist()], np.int64)[where]
        return out

    def _distinct_codes(self, field: str, missing, intern) -> np.ndarray:
        """A raw-id column turned into codes by `intern(value)`, called once per distinct value in first-seen
        order (`missing` stands for an absent one)."""
        if not len(self.rows):
            return np.zeros(0, np.int32)
        if field not in self.chunk.cols:
            return np.full(len(self.rows), intern(missing), np.int32)
        where, distinct = pd.factorize(self._col(field, _INT32, -1))  # distinct values in first-seen order
        values = self.chunk.values
        return np.array([intern(values[i] if i >= 0 else missing) for i in distinct.tolist()], np.int32)[where]

    def names(self, builder) -> np.ndarray:
        return self._distinct_codes("name", "", builder.names.__getitem__)

    def raw(self, field: str, picked: list) -> list:
        ids, raws = self.chunk.column(field, _INT32, -1)[self.rows[picked]].tolist(), self.chunk.raws
        return [raws[i] if i >= 0 else b"null" for i in ids]

    def categories(self) -> tuple[np.ndarray, list]:
        """Per row, the index of its category among the distinct ones, and those (decoded; "" if absent)."""
        where, distinct = pd.factorize(self._col("cat", _INT32, -1))
        values = self.chunk.values
        return where, [values[i] if i >= 0 else "" for i in distinct.tolist()]

    def is_meta(self) -> np.ndarray:
        return self._matches("ph", "M")

    def is_memory(self) -> np.ndarray:
        return self._matches("name", "[memory]")

    def _matches(self, field: str, text: str) -> np.ndarray:
        ids = self._col(field, _INT32, -1)
        values = self.chunk.values
        hits = [i for i in pd.unique(ids).tolist() if (values[i] if i >= 0 else "") == text]
        return np.isin(ids, hits)

    def metadata(self, i: int) -> tuple:
        one = ScannedRows(self.chunk, self.rows[i : i + 1])
        name_id = int(one._col("name", _INT32, -1)[0])
        name = self.chunk.values[name_id] if name_id >= 0 else ""  # the struct's default: ""
        has_args = bool(one._col("has_args", np.int8, 0)[0])
        return name, one._one_ident("pid"), one._one_ident("tid"), (one.values("meta_name")[0] if has_args else None)

    def _one_ident(self, field: str):
        """The raw pid/tid of a single row as msgspec gives it (int, str or None)."""
        kind = int(self._col(field + "_raw", _INT32, -2)[0])
        if kind == -2:
            return None
        if kind == -1:
            return int(self._col(field, _INT64, 0)[0])
        return self.chunk.values[kind]

    def unknown_categories(self) -> Counter:
        where, cats = self.categories()
        counts = np.bincount(where, minlength=len(cats))
        out: Counter = Counter()
        for cat, k in zip(cats, counts.tolist()):
            if k:
                out[str(cat)] += k
        return out

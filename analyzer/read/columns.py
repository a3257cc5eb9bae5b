"""Typed events → numpy columns, one table per kind of event (gpu, runtime, cpu, python, memory, syncs,
GPU annotations), strings interned into pandas categorical codes.

This is the hot loop of every load, shared by the careful path, the streamed path and the forked
worker (which exports its columns and string tables for the parent to merge). It knows nothing about
files, damage or processes, so it is kept on its own.
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter
from itertools import repeat

import msgspec
import numpy as np
import pandas as pd

from . import events as ev
from gpuadvise.analyzer.model import collectives
from gpuadvise.analyzer.model.trace import TraceMeta

# Ops whose input shapes/dtypes the rules read (Tensor Core eligibility, fp16 alignment).
MATMUL_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|conv|convolution|cudnn_conv|_convolution)")

_EMPTY_ARGS = ev.Args()
_ARGS = operator.attrgetter("args")
ROLES = (collectives.KERNEL, collectives.HOST, collectives.CALL)  # the comms table's `role` codes
_TS, _DUR = operator.attrgetter("ts"), operator.attrgetter("dur")
_ANY = msgspec.json.Decoder()


MAX_NAME = 4096


class Interner(dict):
    """str → small int code, in first-seen order (pandas categorical codes). Keys that are not strings
    (a null or numeric name in a broken trace) share the code of their string form."""

    def __init__(self):
        super().__init__()
        self.cats: list[str] = []

    def __missing__(self, key):
        if isinstance(key, str) and len(key) > MAX_NAME:
            code = self[key[: MAX_NAME - 1] + "…"]  # a 50 MB "kernel name" is an attack or a bug, not a name
        elif isinstance(key, str):
            code = len(self.cats)
            self.cats.append(key)
        else:
            code = self["" if key is None else str(key)]
        self[key] = code
        return code

    def categories(self) -> list:
        return list(self.cats)



# Events → columns


class _Columns:
    """Per-table column chunks, concatenated once at the end."""

    def __init__(self):
        self.parts: dict[str, list[np.ndarray]] = {}

    def add(self, name: str, values, dtype) -> None:
        self.parts.setdefault(name, []).append(np.asarray(values, dtype=dtype))

    def frame(self, columns: dict[str, object]) -> dict[str, np.ndarray]:
        out = {}
        for name, dtype in columns.items():
            chunks = self.parts.get(name)
            out[name] = np.concatenate(chunks) if chunks else np.empty(0, dtype=dtype)
        return out


def _f(values) -> np.ndarray:
    """Floats, None → NaN (numpy converts None to NaN for float arrays)."""
    return np.asarray(values if isinstance(values, list) else list(values), dtype=np.float64)


def _i(values) -> np.ndarray:
    """Integer ids, None → -1; ids outside int64 (never written by Kineto) count as missing too."""
    a = _f(values)
    bad = np.isnan(a) | (np.abs(a) >= 2.0**63)
    return np.where(bad, -1.0, a).astype(np.int64)


_INSPECT = -3  # empty or instant category: look at ph/name (metadata, [memory])
_IGNORED = -9  # a known category that no table keeps (flows, the profiler span)
_NEW = -100  # not in the category cache yet
_CAT = operator.attrgetter("cat")
_TEXT_OR_NONE = {str, type(None)}
_NAME, _PID, _TID, _PH = (operator.attrgetter(f) for f in ("name", "pid", "tid", "ph"))


class Builder:
    def __init__(self, meta: TraceMeta):
        self.meta = meta
        self.names = Interner()
        self.matmul_names: set[int] = set()
        self.names_checked = 0
        self.stacks = Interner()
        self.stacks[""]  # code 0 = no stack
        self.types = Interner()
        self.types[""]
        self.raw_type_codes: dict[bytes, int] = {}  # matmuls' raw `Input type` / `Input Dims` → code in `types`
        self.raw_dims_codes: dict[bytes, int] = {}
        self.thread_codes = Interner()  # non-numeric pid/tid strings → negative ids
        self.ident_cache: dict = {}
        self.tables = {k: _Columns() for k in ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations",
                                                "comms")}
        self.comm_roles: dict = {}  # (is_kernel, name code) → role code in ROLES, -1: not a collective
        self.cat_cache: dict = {}
        self.unknown = Counter()
        self.total = 0
        self.skipped = 0
        self.tabulated = 0  # events that made it into a table
        self.min_ts = math.inf

    # -- helpers --------------------------------------------------------------------------------
    def _learn(self, cat) -> int:
        """The table code of a category: -1 unknown, _IGNORED known but not tabulated."""
        key = cat.lower() if isinstance(cat, str) else ""
        if key in ("", "cpu_instant_event"):
            code = _INSPECT
        else:
            code = ev.CATEGORY.get(key)
            if code is None:
                code = _IGNORED if key in ev.IGNORED_CATEGORIES else -1
        try:
            self.cat_cache[cat] = code
        except TypeError:  # an unhashable category (a list, say): treat as unknown
            return -1
        return code

    def _codes(self, events: list) -> np.ndarray:
        """Each event's table code (int16). Looked up in C; a category not seen before (the first chunks
        only) is learnt once, and only the events that carry one are looked up again."""
        get, n = self.cat_cache.get, len(events)
        try:
            codes = np.fromiter(map(get, map(_CAT, events), repeat(_NEW, n)), np.int16, count=n)
            new = np.flatnonzero(codes == _NEW)
            if len(new):
                picked = list(map(events.__getitem__, new.tolist()))
                for cat in dict.fromkeys(map(_CAT, picked)):
                    if cat not in self.cat_cache:
                        self._learn(cat)
                codes[new] = np.fromiter(map(get, map(_CAT, picked), repeat(_NEW, len(picked))), np.int16,
                                         count=len(picked))
            return codes
        except TypeError:
            return np.array([self._learn(e.cat) if isinstance(e.cat, (str, int, float, type(None))) else -1
                             for e in events], dtype=np.int16)

    def _ident(self, value) -> int:
        if type(value) is int and -(2**63) <= value < 2**63:
            return value
        try:
            return self.ident_cache[value]
        except (KeyError, TypeError):
            pass
        if value is None:
            return -1
        s = str(value)
        if s.isdigit() and int(s) < 2**63:
            out = int(s)
        elif s.startswith("stream ") and s[7:].strip().isdigit() and int(s[7:].strip()) < 2**63:
            out = int(s[7:].strip())
        else:
            out = -2 - self.thread_codes[s]
        try:
            self.ident_cache[value] = out
        except TypeError:
            pass
        return out

    def _idents(self, values: list):
        if values and type(values[0]) is int:  # the common case: plain integer ids, converted in C
            ids = np.array(values)
            if ids.dtype == np.int64:
                return ids
        ident = self._ident
        try:
            table = {v: ident(v) for v in dict.fromkeys(values)}  # distinct values, first-seen order
        except TypeError:
            return [v if type(v) is int and -(2**63) <= v < 2**63 else ident(v) for v in values]
        return list(map(table.__getitem__, values))

    def _names(self, evs) -> np.ndarray:
        names = self.names
        try:
            return np.fromiter(map(names.__getitem__, map(_NAME, evs)), dtype=np.int32, count=len(evs))
        except TypeError:
            return np.array([names[n if isinstance(n, str) else str(n)] for n in (e.name for e in evs)], dtype=np.int32)

    # -- per chunk ------------------------------------------------------------------------------
    def add_chunk(self, events: list) -> None:
        """One chunk's events into the tables: the events grouped by table with one stable sort, each
        column built in one pass over its group (attribute access and conversions in C)."""
        if not events:
            return
        codes = self._codes(events)
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        present, starts = np.unique(ordered, return_index=True)
        ends = np.append(starts[1:], len(ordered))
        picked = list(map(events.__getitem__, order.tolist())) if len(present) > 1 else events
        groups = {}
        for code, lo, hi in zip(present.tolist(), starts.tolist(), ends.tolist()):
            if code != _IGNORED:
                groups[code] = picked[lo:hi]
        del picked
        buckets: dict[int, tuple] = {}
        for code, evs in groups.items():
            if code == -1:
                self.unknown.update(map(str, map(_CAT, evs)))
                continue
            if code == _INSPECT:  # metadata (ph M) and [memory] instants, told apart in C, not event by event
                # operator.eq, not numpy object arrays: a name may be any JSON value (a list, in a broken trace)
                meta = np.fromiter(map(operator.eq, map(_PH, evs), repeat("M")), bool, count=len(evs))
                memory = np.fromiter(map(operator.eq, map(_NAME, evs), repeat("[memory]")), bool, count=len(evs))
                for i in np.flatnonzero(meta).tolist():
                    self._metadata(evs[i], evs[i].args)
                mem = np.flatnonzero(~meta & memory).tolist()
                if mem:
                    picked = [evs[i] for i in mem]
                    buckets[ev.MEMORY] = (picked, list(map(_ARGS, picked)))
                continue
            buckets[code] = (evs, list(map(_ARGS, evs)))
        for code, (evs, args) in buckets.items():
            evs, args, ts, dur = self._valid(evs, args)
            if not evs:
                continue
            args = [a if a is not None else _EMPTY_ARGS for a in args] if None in args else args
            self.tabulated += len(evs)
            if code in (ev.KERNEL, ev.MEMCPY, ev.MEMSET):
                self._gpu(evs, args, ts, dur, code)
            elif code == ev.RUNTIME:
                self._runtime(evs, args, ts, dur)
            elif code in (ev.CPU_OP, ev.ANNOTATION):
                self._cpu(evs, args, ts, dur, code == ev.ANNOTATION)
            elif code == ev.PYTHON:
                self._python(evs, args, ts, dur)
            elif code == ev.MEMORY:
                self._memory(evs, args, ts)
            elif code == ev.SYNC:
                self._span("syncs", evs, args, ts, dur)
            elif code == ev.GPU_ANNOTATION:
                self._span("gpu_annotations", evs, args, ts, dur)
            elif code == ev.RANGE:
                self.meta.profiler_ranges += len(evs)
            elif code == ev.OVERHEAD:
                self.meta.overhead_events += len(evs)

    def _valid(self, evs: list, args: list):
        """Drop events without a usable timestamp or with a negative duration (counted, not fatal).
        Returns the events kept, their args and their ts and dur columns (dur NaN → 0)."""
        ts = _f(list(map(_TS, evs)))
        dur = _f(list(map(_DUR, evs)))
        bad = np.isnan(ts) | (dur < 0) | np.isinf(ts) | np.isinf(dur)
        if bad.any():
            self.skipped += int(bad.sum())
            keep = np.flatnonzero(~bad).tolist()
            evs, args = [evs[i] for i in keep], [args[i] for i in keep]
            ts, dur = ts[~bad], dur[~bad]
        if ts.size:
            self.min_ts = min(self.min_ts, float(ts.min()))
        return evs, args, ts, np.nan_to_num(dur, nan=0.0)

    def _metadata(self, e, a) -> None:
        if a is None or not isinstance(a.name, str):
            return
        if e.name == "process_name":
            self.meta.process_names[self._ident(e.pid)] = a.name
        elif e.name == "thread_name":
            self.meta.thread_names[(self._ident(e.pid), self._ident(e.tid))] = a.name

    def _base(self, t: _Columns, evs, ts, dur) -> None:
        t.add("name", self._names(evs), np.int32)
        t.add("ts", ts, np.float64)
        t.add("dur", dur, np.float64)

    def _gpu(self, evs, args, ts, dur, code) -> None:
        t = self.tables["gpu"]
        self._base(t, evs, ts, dur)
        device = self._arg_or(_get(args, "device"), evs, _PID)
        stream = self._arg_or(_get(args, "stream"), evs, _TID)
        correlation = _i(_get(args, "correlation"))
        t.add("kind", np.full(len(evs), code, np.int8), np.int8)
        t.add("device", device, np.int64)
        t.add("stream", stream, np.int64)
        t.add("correlation", correlation, np.int64)
        t.add("external_id", _external(args), np.int64)
        t.add("bytes", _f(_get(args, "nbytes")), np.float64)
        if code == ev.KERNEL:
            self._comms(t.parts["name"][-1], True, evs, args, ts, dur, device, stream, correlation)

    def _comms(self, names: np.ndarray, is_kernel: bool, evs, args, ts, dur, pid, tid, correlation) -> None:
        """The rows that are collectives (model/collectives.py), with their metadata, into `comms`."""
        where, distinct = pd.factorize(names)  # once per distinct name, not per event
        roles = np.array([self._role(is_kernel, int(c)) for c in distinct], dtype=np.int8)[where]
        rows = np.flatnonzero(roles >= 0)
        if not len(rows):
            return
        pick = rows.tolist()
        a = [args[i] for i in pick]
        t, types = self.tables["comms"], self.types
        t.add("name", names[rows], np.int32)
        t.add("ts", ts[rows], np.float64)
        t.add("dur", dur[rows], np.float64)
        t.add("role", roles[rows], np.int8)
        t.add("pid", np.asarray(pid)[rows], np.int64)
        t.add("tid", np.asarray(tid)[rows], np.int64)
        t.add("external_id", _external(a), np.int64)
        t.add("correlation", np.asarray(correlation)[rows], np.int64)
        t.add("collective", [types[_text(x.collective_name)] for x in a], np.int32)
        t.add("pg", [types[_text(x.pg_name)] for x in a], np.int32)
        t.add("group_size", _i([x.group_size for x in a]), np.int64)
        t.add("in_nelems", _f([x.in_nelems for x in a]), np.float64)
        t.add("out_nelems", _f([x.out_nelems for x in a]), np.float64)
        t.add("dtype", [types[_text(x.dtype)] for x in a], np.int32)
        t.add("seq", _i([x.comm_seq for x in a]), np.int64)

    def _role(self, is_kernel: bool, code: int) -> int:
        key = (is_kernel, code)
        role = self.comm_roles.get(key)
        if role is None:
            name = self.names.cats[code]
            r = collectives.role(name if isinstance(name, str) else str(name), is_kernel)
            role = self.comm_roles[key] = ROLES.index(r) if r is not None else -1
        return role

    def _arg_or(self, values: list, evs: list, field) -> np.ndarray:
        """An id from args (device, stream), else from the event's pid/tid (`field`; old traces: pid 0,
        tid "stream 7")."""
        ids = _i(values)
        missing = ids < 0
        if missing.any():
            ids = np.where(missing, np.array(self._idents(list(map(field, evs))), dtype=np.int64), ids)
        return ids

    def _runtime(self, evs, args, ts, dur) -> None:
        t = self.tables["runtime"]
        self._base(t, evs, ts, dur)
        t.add("pid", self._idents(list(map(_PID, evs))), np.int64)
        t.add("tid", self._idents(list(map(_TID, evs))), np.int64)
        t.add("correlation", _i(_get(args, "correlation")), np.int64)
        t.add("external_id", _external(args), np.int64)

    def _cpu(self, evs, args, ts, dur, annotation: bool) -> None:
        t = self.tables["cpu"]
        names = self._names(evs)
        t.add("name", names, np.int32)
        t.add("ts", ts, np.float64)
        t.add("dur", dur, np.float64)
        t.add("pid", self._idents(list(map(_PID, evs))), np.int64)
        t.add("tid", self._idents(list(map(_TID, evs))), np.int64)
        t.add("is_annotation", np.full(len(evs), annotation), bool)
        t.add("external_id", _external(args), np.int64)
        t.add("seq", _i(_get(args, "sequence_number")), np.int64)
        stacks = self.stacks
        calls = _get(args, "call_stack")
        if calls.count(None) == len(calls):  # the common case: no legacy call stacks recorded
            t.add("call_stack", np.zeros(len(calls), np.int32), np.int32)
        elif set(map(type, calls)) <= _TEXT_OR_NONE:  # interned in C (None gets the code of "", 0)
            t.add("call_stack", np.fromiter(map(stacks.__getitem__, calls), np.int32, count=len(calls)), np.int32)
        else:
            t.add("call_stack", [stacks[c] if type(c) is str else 0 for c in calls], np.int32)
        # shapes and dtypes only for matmul/conv ops: checked once per distinct name
        for name, code in list(self.names.items())[self.names_checked:]:
            if isinstance(name, str) and MATMUL_OPS.match(name):
                self.matmul_names.add(code)
        self.names_checked = len(self.names)
        typ = np.zeros(len(evs), np.int32)
        dims = np.zeros(len(evs), np.int32)
        if self.matmul_names:
            type_codes, dims_codes = self.raw_type_codes, self.raw_dims_codes  # raw JSON → code, decoded once
            for i in np.flatnonzero(np.isin(names, list(self.matmul_names))).tolist():
                a = args[i]
                raw = bytes(a.input_type)
                code = type_codes.get(raw)
                if code is None:
                    kinds = _raw_json(raw)
                    code = type_codes[raw] = self.types[",".join(map(str, kinds))] if isinstance(kinds, list) else 0
                typ[i] = code
                raw = bytes(a.input_dims)
                code = dims_codes.get(raw)
                if code is None:
                    code = dims_codes[raw] = self.types[raw.decode("utf-8", "replace")]
                dims[i] = code
        t.add("input_type", typ, np.int32)
        t.add("input_dims", dims, np.int32)
        self._comms(names, False, evs, args, ts, dur, t.parts["pid"][-1], t.parts["tid"][-1],
                    np.full(len(evs), -1, np.int64))

    def _python(self, evs, args, ts, dur) -> None:
        t = self.tables["python"]
        self._base(t, evs, ts, dur)
        t.add("tid", self._idents(list(map(_TID, evs))), np.int64)
        t.add("python_id", _i(_get(args, "python_id")), np.int64)
        t.add("parent_id", _i(_get(args, "python_parent_id")), np.int64)

    def _memory(self, evs, args, ts) -> None:
        t = self.tables["memory"]
        t.add("ts", ts, np.float64)
        t.add("bytes", _f([a.mem_bytes for a in args]), np.float64)
        t.add("total_allocated", _f([a.total_allocated for a in args]), np.float64)
        t.add("total_reserved", _f([a.total_reserved for a in args]), np.float64)
        t.add("device_type", _i([a.device_type for a in args]), np.int64)
        t.add("device", _i([a.device_id for a in args]), np.int64)
        t.add("addr", _f([a.addr for a in args]), np.float64)

    def _span(self, table: str, evs, args, ts, dur) -> None:
        t = self.tables[table]
        self._base(t, evs, ts, dur)
        t.add("device", self._arg_or(_get(args, "device"), evs, _PID), np.int64)
        t.add("stream", self._arg_or(_get(args, "stream"), evs, _TID), np.int64)
        t.add("correlation", _i(_get(args, "correlation")), np.int64)

    # -- merging a forked worker's share -----------------------------------------------------------
    def export(self) -> dict:
        tables = {name: {col: np.concatenate(parts) for col, parts in t.parts.items()} for name, t in self.tables.items()}
        m = self.meta
        return {"tables": tables, "names": self.names.categories(), "stacks": self.stacks.categories(),
                "types": self.types.categories(), "threads": self.thread_codes.categories(), "total": self.total,
                "skipped": self.skipped, "tabulated": self.tabulated, "min_ts": self.min_ts, "unknown": dict(self.unknown),
                "process_names": m.process_names, "thread_names": m.thread_names,
                "profiler_ranges": m.profiler_ranges, "overhead_events": m.overhead_events}

    def merge(self, other: dict) -> None:
        """Append a worker's columns, translating its string codes into this builder's."""
        names = np.array([self.names[n] for n in other["names"]], dtype=np.int32)
        stacks = np.array([self.stacks[x] for x in other["stacks"]], dtype=np.int32)
        types = np.array([self.types[x] for x in other["types"]], dtype=np.int32)
        threads = np.array([-2 - self.thread_codes[x] for x in other["threads"]], dtype=np.int64)
        recode = {"name": names, "call_stack": stacks, "input_type": types, "input_dims": types, "collective": types,
                  "pg": types, "dtype": types}
        for table, cols in other["tables"].items():
            t = self.tables[table]
            for col, values in cols.items():
                if col in recode and len(values):
                    values = recode[col][values]
                elif col in ("pid", "tid", "device", "stream") and len(threads):
                    coded = values <= -2
                    if coded.any():
                        values = values.copy()
                        values[coded] = threads[-2 - values[coded]]
                t.parts.setdefault(col, []).append(values)
        self.total += other["total"]
        self.skipped += other["skipped"]
        self.tabulated += other["tabulated"]
        self.min_ts = min(self.min_ts, other["min_ts"])
        self.unknown.update(other["unknown"])
        for pid, name in other["process_names"].items():
            self.meta.process_names.setdefault(pid, name)
        for key, name in other["thread_names"].items():
            self.meta.thread_names.setdefault(key, name)
        self.meta.profiler_ranges += other["profiler_ranges"]
        self.meta.overhead_events += other["overhead_events"]

    # -- frames ---------------------------------------------------------------------------------
    def frames(self) -> dict[str, pd.DataFrame]:
        base = 0.0 if self.min_ts == math.inf else self.min_ts
        self.meta.base_ts_us = base
        names = self.names.categories()
        specs = {
            "gpu": dict(name=np.int32, ts=np.float64, dur=np.float64, kind=np.int8, device=np.int64, stream=np.int64,
                        correlation=np.int64, external_id=np.int64, bytes=np.float64),
            "runtime": dict(name=np.int32, ts=np.float64, dur=np.float64, pid=np.int64, tid=np.int64,
                            correlation=np.int64, external_id=np.int64),
            "cpu": dict(name=np.int32, ts=np.float64, dur=np.float64, pid=np.int64, tid=np.int64, is_annotation=bool,
                        external_id=np.int64, seq=np.int64, call_stack=np.int32, input_type=np.int32, input_dims=np.int32),
            "python": dict(name=np.int32, ts=np.float64, dur=np.float64, tid=np.int64, python_id=np.int64, parent_id=np.int64),
            "memory": dict(ts=np.float64, bytes=np.float64, total_allocated=np.float64, total_reserved=np.float64,
                           device_type=np.int64, device=np.int64, addr=np.float64),
            "syncs": dict(name=np.int32, ts=np.float64, dur=np.float64, device=np.int64, stream=np.int64, correlation=np.int64),
            "gpu_annotations": dict(name=np.int32, ts=np.float64, dur=np.float64, device=np.int64, stream=np.int64, correlation=np.int64),
            "comms": dict(name=np.int32, ts=np.float64, dur=np.float64, role=np.int8, pid=np.int64, tid=np.int64,
                          external_id=np.int64, correlation=np.int64, collective=np.int32, pg=np.int32,
                          group_size=np.int64, in_nelems=np.float64, out_nelems=np.float64, dtype=np.int32, seq=np.int64),
        }
        kinds = np.array(["kernel", "memcpy", "memset"], dtype=object)
        out = {}
        for table, spec in specs.items():
            cols = self.tables[table].frame(spec)
            self.tables[table] = None  # release chunk arrays as we go
            cols["ts"] = cols["ts"] - base
            if "name" in cols:
                cols["name"] = pd.Categorical.from_codes(cols["name"], categories=names)
            if "dur" in cols:
                cols["end"] = cols["ts"] + cols["dur"]
            if table == "gpu":
                cols["kind"] = pd.Categorical.from_codes(cols["kind"].astype(np.int64), categories=kinds.tolist())
            if table == "cpu":
                cols["call_stack"] = _decode_codes(cols["call_stack"], self.stacks)
                cols["input_type"] = _decode_codes(cols["input_type"], self.types)
                cols["input_dims"] = _decode_codes(cols["input_dims"], self.types)
            if table == "comms":
                cols["role"] = pd.Categorical.from_codes(cols["role"].astype(np.int64), categories=list(ROLES))
                for col in ("collective", "pg", "dtype"):
                    cols[col] = _decode_codes(cols[col], self.types)
            df = pd.DataFrame(cols)
            if "name" in df:
                df["name"] = df["name"].cat.remove_unused_categories()
            out[table] = df if df["ts"].is_monotonic_increasing else df.sort_values("ts", kind="stable", ignore_index=True)
        return out


def _raw_json(raw):
    """A lazily kept (msgspec.Raw) field, decoded; None when it is not valid JSON."""
    try:
        return _ANY.decode(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError, TypeError):
        return None


def _text(value) -> str:
    """A metadata arg as text ("" when absent): process group names are "0" in one trace and 0 in another."""
    return "" if value is None else value if isinstance(value, str) else str(value)


def _get(args: list, field: str) -> list:
    """One field of every args struct (attribute access in C, not a Python loop)."""
    return list(map(operator.attrgetter(field), args))


def _external(args) -> np.ndarray:
    """`External id` (new traces) or `external id` (2021 traces)."""
    ids = _get(args, "external_id")
    if ids.count(None):
        legacy = _get(args, "external_id_legacy")
        ids = [x if x is not None else y for x, y in zip(ids, legacy)]
    return _i(ids)


def _decode_codes(codes: np.ndarray, interner: Interner) -> pd.Categorical:
    return pd.Categorical.from_codes(codes.astype(np.int64), categories=interner.categories())


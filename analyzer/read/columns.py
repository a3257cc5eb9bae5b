"""A chunk's events → numpy columns, one table per kind of event (gpu, runtime, cpu, python, memory,
syncs, GPU annotations), strings interned into pandas categorical codes. The events come as msgspec
structs (`add_chunk`) or as the compiled scanner's columns (`add_scanned`); rows.py gives both one
interface, so one code path builds the tables from either.

This is the hot loop of every load, shared by the careful path, the streamed path and the forked
worker (which exports its columns and string tables for the parent to merge). It knows nothing about
files, damage or processes, so it is kept on its own.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from itertools import repeat

import msgspec
import numpy as np
import pandas as pd

from . import events as ev
from .rows import ScannedRows, StructRows, ids_of
from gpuadvise.analyzer.model import collectives, flopops
from gpuadvise.analyzer.model.trace import TraceMeta


_ARGS = operator.attrgetter("args")
ROLES = (collectives.KERNEL, collectives.HOST, collectives.CALL)  # the comms table's `role` codes
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


_INSPECT = -3  # empty or instant category: look at ph/name (metadata, [memory])
_IGNORED = -9  # a known category that no table keeps (flows, the profiler span)
_NEW = -100  # not in the category cache yet
_CAT = operator.attrgetter("cat")
_TEXT_OR_NONE = {str, type(None)}
_NAME = operator.attrgetter("name")


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
        # shaped ops' raw `Input type` / `Input Dims` / `Concrete Inputs` → code in `types`
        self.raw_type_codes: dict[bytes, int] = {}
        self.raw_dims_codes: dict[bytes, int] = {}
        self.raw_concrete_codes: dict[bytes, int] = {}
        self.concrete = Interner()  # `Concrete Inputs` texts, apart from `types`: the comms columns share its categories
        self.concrete[""]
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
        self.scanned = 0  # chunks read by the compiled scanner (the rest by msgspec structs)
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
        """One chunk's msgspec-decoded events into the tables."""
        if events:
            self._add(StructRows(events, list(map(_ARGS, events))), self._codes(events))

    def add_scanned(self, rows: ScannedRows) -> None:
        """One chunk read by the compiled scanner (rows.py) into the tables: the same columns as
        `add_chunk` would build from the same bytes."""
        self.scanned += 1
        if len(rows):
            where, cats = rows.categories()
            get = self.cat_cache.get
            table = np.array([c if (c := get(cat)) is not None else self._learn(cat) for cat in cats], np.int16)
            self._add(rows, table[where])

    def _add(self, rows, codes: np.ndarray) -> None:
        """The events grouped by table with one stable sort, each column built in one pass over its group
        (attribute access and conversions in C, or straight from the scanner's arrays)."""
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        present, starts = np.unique(ordered, return_index=True)
        ends = np.append(starts[1:], len(ordered))
        groups = {}
        for code, lo, hi in zip(present.tolist(), starts.tolist(), ends.tolist()):
            if code != _IGNORED:
                groups[code] = rows.take(order[lo:hi]) if len(present) > 1 else rows
        buckets: dict = {}
        for code, sub in groups.items():
            if code == -1:
                self.unknown.update(sub.unknown_categories())
                continue
            if code == _INSPECT:  # metadata (ph M) and [memory] instants, told apart in C, not event by event
                meta, memory = sub.is_meta(), sub.is_memory()
                for i in np.flatnonzero(meta).tolist():
                    self._metadata(*sub.metadata(i))
                mem = np.flatnonzero(~meta & memory)
                if len(mem):
                    buckets[ev.MEMORY] = sub.take(mem)
                continue
            buckets[code] = sub
        for code, sub in buckets.items():
            sub, ts, dur = self._valid(sub)
            if not len(sub):
                continue
            sub = sub.with_empty_args()
            self.tabulated += len(sub)
            if code in (ev.KERNEL, ev.MEMCPY, ev.MEMSET):
                self._gpu(sub, ts, dur, code)
            elif code == ev.RUNTIME:
                self._runtime(sub, ts, dur)
            elif code in (ev.CPU_OP, ev.ANNOTATION):
                self._cpu(sub, ts, dur, code == ev.ANNOTATION)
            elif code == ev.PYTHON:
                self._python(sub, ts, dur)
            elif code == ev.MEMORY:
                self._memory(sub, ts)
            elif code == ev.SYNC:
                self._span("syncs", sub, ts, dur)
            elif code == ev.GPU_ANNOTATION:
                self._span("gpu_annotations", sub, ts, dur)
            elif code == ev.RANGE:
                self.meta.profiler_ranges += len(sub)
            elif code == ev.OVERHEAD:
                self.meta.overhead_events += len(sub)

    def _valid(self, rows):
        """Drop events without a usable timestamp or with a negative duration (counted, not fatal).
        Returns the rows kept and their ts and dur columns (dur NaN → 0)."""
        ts, dur = rows.ts(), rows.dur()
        bad = np.isnan(ts) | (dur < 0) | np.isinf(ts) | np.isinf(dur)
        if bad.any():
            self.skipped += int(bad.sum())
            rows = rows.take(np.flatnonzero(~bad))
            ts, dur = ts[~bad], dur[~bad]
        if ts.size:
            self.min_ts = min(self.min_ts, float(ts.min()))
        return rows, ts, np.nan_to_num(dur, nan=0.0)

    def _metadata(self, name, pid, tid, value) -> None:
        """A metadata event (ph M): `value` is its args' `name` (None without args)."""
        if not isinstance(value, str):
            return
        if name == "process_name":
            self.meta.process_names[self._ident(pid)] = value
        elif name == "thread_name":
            self.meta.thread_names[(self._ident(pid), self._ident(tid))] = value

    def _base(self, t: _Columns, rows, ts, dur) -> np.ndarray:
        names = rows.names(self)
        t.add("name", names, np.int32)
        t.add("ts", ts, np.float64)
        t.add("dur", dur, np.float64)
        return names

    def _gpu(self, rows, ts, dur, code) -> None:
        t = self.tables["gpu"]
        names = self._base(t, rows, ts, dur)
        device = self._arg_or(rows, "device", "pid")
        stream = self._arg_or(rows, "stream", "tid")
        correlation = ids_of(rows.num("correlation"))
        t.add("kind", np.full(len(rows), code, np.int8), np.int8)
        t.add("device", device, np.int64)
        t.add("stream", stream, np.int64)
        t.add("correlation", correlation, np.int64)
        t.add("external_id", rows.external(), np.int64)
        t.add("bytes", rows.num("nbytes"), np.float64)
        t.add("graph_node", ids_of(rows.num("graph_node_id")), np.int64)
        if code == ev.KERNEL:
            self._comms(names, True, rows, ts, dur, device, stream, correlation)

    def _comms(self, names: np.ndarray, is_kernel: bool, rows, ts, dur, pid, tid, correlation) -> None:
        """The rows that are collectives (model/collectives.py), with their metadata, into `comms`."""
        where, distinct = pd.factorize(names)  # once per distinct name, not per event
        roles = np.array([self._role(is_kernel, int(c)) for c in distinct], dtype=np.int8)[where]
        picked = np.flatnonzero(roles >= 0)
        if not len(picked):
            return
        a = rows.take(picked)
        t, types = self.tables["comms"], self.types
        t.add("name", names[picked], np.int32)
        t.add("ts", ts[picked], np.float64)
        t.add("dur", dur[picked], np.float64)
        t.add("role", roles[picked], np.int8)
        t.add("pid", np.asarray(pid)[picked], np.int64)
        t.add("tid", np.asarray(tid)[picked], np.int64)
        t.add("external_id", a.external(), np.int64)
        t.add("correlation", np.asarray(correlation)[picked], np.int64)
        t.add("collective", [types[_text(x)] for x in a.values("collective_name")], np.int32)
        t.add("pg", [types[_text(x)] for x in a.values("pg_name")], np.int32)
        t.add("group_size", ids_of(a.num("group_size")), np.int64)
        t.add("in_nelems", a.num("in_nelems"), np.float64)
        t.add("out_nelems", a.num("out_nelems"), np.float64)
        t.add("dtype", [types[_text(x)] for x in a.values("dtype")], np.int32)
        t.add("seq", ids_of(a.num("comm_seq")), np.int64)
        for col in ("pg_desc", "pg_ranks"):
            t.add(col, [types[_text(x)] for x in a.values(col)], np.int32)
        # kept as its raw text: a 64-bit id written as a number may fit neither an int64 nor a double
        t.add("comms_id", [types[_raw_text(x)] for x in a.raw("comms_id", list(range(len(a))))], np.int32)

    def _role(self, is_kernel: bool, code: int) -> int:
        key = (is_kernel, code)
        role = self.comm_roles.get(key)
        if role is None:
            name = self.names.cats[code]
            r = collectives.role(name if isinstance(name, str) else str(name), is_kernel)
            role = self.comm_roles[key] = ROLES.index(r) if r is not None else -1
        return role

    def _arg_or(self, rows, field: str, fallback: str) -> np.ndarray:
        """An id from args (device, stream), else from the event's pid/tid (`fallback`; old traces: pid 0,
        tid "stream 7")."""
        ids = ids_of(rows.num(field))
        missing = ids < 0
        if missing.any():
            ids = np.where(missing, np.asarray(rows.idents(self, fallback), dtype=np.int64), ids)
        return ids

    def _runtime(self, rows, ts, dur) -> None:
        t = self.tables["runtime"]
        self._base(t, rows, ts, dur)
        t.add("pid", rows.idents(self, "pid"), np.int64)
        t.add("tid", rows.idents(self, "tid"), np.int64)
        t.add("correlation", ids_of(rows.num("correlation")), np.int64)
        t.add("external_id", rows.external(), np.int64)

    def _cpu(self, rows, ts, dur, annotation: bool) -> None:
        t = self.tables["cpu"]
        names = self._base(t, rows, ts, dur)
        t.add("pid", rows.idents(self, "pid"), np.int64)
        t.add("tid", rows.idents(self, "tid"), np.int64)
        t.add("is_annotation", np.full(len(rows), annotation), bool)
        t.add("external_id", rows.external(), np.int64)
        t.add("seq", ids_of(rows.num("sequence_number")), np.int64)
        stacks = self.stacks
        calls = rows.values("call_stack")
        if calls.count(None) == len(calls):  # the common case: no legacy call stacks recorded
            t.add("call_stack", np.zeros(len(calls), np.int32), np.int32)
        elif set(map(type, calls)) <= _TEXT_OR_NONE:  # interned in C (None gets the code of "", 0)
            t.add("call_stack", np.fromiter(map(stacks.__getitem__, calls), np.int32, count=len(calls)), np.int32)
        else:
            t.add("call_stack", [stacks[c] if type(c) is str else 0 for c in calls], np.int32)
        # shapes, dtypes and scalar arguments only for the ops whose math is counted or checked
        # (model/flopops.py): checked once per distinct name
        for name, code in list(self.names.items())[self.names_checked:]:
            if isinstance(name, str) and flopops.shaped(name):
                self.matmul_names.add(code)
        self.names_checked = len(self.names)
        typ = np.zeros(len(rows), np.int32)
        dims = np.zeros(len(rows), np.int32)
        concrete = np.zeros(len(rows), np.int32)
        if self.matmul_names:
            type_codes, dims_codes = self.raw_type_codes, self.raw_dims_codes  # raw JSON → code, decoded once
            concrete_codes = self.raw_concrete_codes
            picked = np.flatnonzero(np.isin(names, list(self.matmul_names))).tolist()
            for i, raw_type, raw_dims, raw_concrete in zip(picked, rows.raw("input_type", picked),
                                                          rows.raw("input_dims", picked),
                                                          rows.raw("input_concrete", picked)):
                code = type_codes.get(raw_type)
                if code is None:
                    kinds = _raw_json(raw_type)
                    code = type_codes[raw_type] = self.types[",".join(map(str, kinds))] if isinstance(kinds, list) else 0
                typ[i] = code
                code = dims_codes.get(raw_dims)
                if code is None:
                    code = dims_codes[raw_dims] = self.types[raw_dims.decode("utf-8", "replace")]
                dims[i] = code
                code = concrete_codes.get(raw_concrete)
                if code is None:
                    code = concrete_codes[raw_concrete] = (self.concrete[raw_concrete.decode("utf-8", "replace")]
                                                           if raw_concrete != b"null" else 0)
                concrete[i] = code
        t.add("input_type", typ, np.int32)
        t.add("input_dims", dims, np.int32)
        t.add("input_concrete", concrete, np.int32)
        self._comms(names, False, rows, ts, dur, t.parts["pid"][-1], t.parts["tid"][-1],
                    np.full(len(rows), -1, np.int64))

    def _python(self, rows, ts, dur) -> None:
        t = self.tables["python"]
        self._base(t, rows, ts, dur)
        t.add("tid", rows.idents(self, "tid"), np.int64)
        t.add("python_id", ids_of(rows.num("python_id")), np.int64)
        t.add("parent_id", ids_of(rows.num("python_parent_id")), np.int64)

    def _memory(self, rows, ts) -> None:
        t = self.tables["memory"]
        t.add("ts", ts, np.float64)
        t.add("bytes", rows.num("mem_bytes"), np.float64)
        t.add("total_allocated", rows.num("total_allocated"), np.float64)
        t.add("total_reserved", rows.num("total_reserved"), np.float64)
        t.add("device_type", ids_of(rows.num("device_type")), np.int64)
        t.add("device", ids_of(rows.num("device_id")), np.int64)
        t.add("addr", rows.num("addr"), np.float64)

    def _span(self, table: str, rows, ts, dur) -> None:
        t = self.tables[table]
        self._base(t, rows, ts, dur)
        t.add("device", self._arg_or(rows, "device", "pid"), np.int64)
        t.add("stream", self._arg_or(rows, "stream", "tid"), np.int64)
        t.add("correlation", ids_of(rows.num("correlation")), np.int64)

    # -- merging a forked worker's share -----------------------------------------------------------
    def export(self) -> dict:
        tables = {name: {col: np.concatenate(parts) for col, parts in t.parts.items()} for name, t in self.tables.items()}
        m = self.meta
        return {"tables": tables, "names": self.names.categories(), "stacks": self.stacks.categories(),
                "types": self.types.categories(), "concrete": self.concrete.categories(),
                "threads": self.thread_codes.categories(), "total": self.total,
                "skipped": self.skipped, "tabulated": self.tabulated, "min_ts": self.min_ts, "unknown": dict(self.unknown),
                "process_names": m.process_names, "thread_names": m.thread_names,
                "profiler_ranges": m.profiler_ranges, "overhead_events": m.overhead_events}

    def merge(self, other: dict) -> None:
        """Append a worker's columns, translating its string codes into this builder's."""
        names = np.array([self.names[n] for n in other["names"]], dtype=np.int32)
        stacks = np.array([self.stacks[x] for x in other["stacks"]], dtype=np.int32)
        types = np.array([self.types[x] for x in other["types"]], dtype=np.int32)
        concrete = np.array([self.concrete[x] for x in other["concrete"]], dtype=np.int32)
        threads = np.array([-2 - self.thread_codes[x] for x in other["threads"]], dtype=np.int64)
        recode = {"name": names, "call_stack": stacks, "input_type": types, "input_dims": types, "input_concrete": concrete,
                  "collective": types, "pg": types, "pg_desc": types, "pg_ranks": types, "comms_id": types, "dtype": types}
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
                        correlation=np.int64, external_id=np.int64, bytes=np.float64, graph_node=np.int64),
            "runtime": dict(name=np.int32, ts=np.float64, dur=np.float64, pid=np.int64, tid=np.int64,
                            correlation=np.int64, external_id=np.int64),
            "cpu": dict(name=np.int32, ts=np.float64, dur=np.float64, pid=np.int64, tid=np.int64, is_annotation=bool,
                        external_id=np.int64, seq=np.int64, call_stack=np.int32, input_type=np.int32, input_dims=np.int32,
                        input_concrete=np.int32),
            "python": dict(name=np.int32, ts=np.float64, dur=np.float64, tid=np.int64, python_id=np.int64, parent_id=np.int64),
            "memory": dict(ts=np.float64, bytes=np.float64, total_allocated=np.float64, total_reserved=np.float64,
                           device_type=np.int64, device=np.int64, addr=np.float64),
            "syncs": dict(name=np.int32, ts=np.float64, dur=np.float64, device=np.int64, stream=np.int64, correlation=np.int64),
            "gpu_annotations": dict(name=np.int32, ts=np.float64, dur=np.float64, device=np.int64, stream=np.int64, correlation=np.int64),
            "comms": dict(name=np.int32, ts=np.float64, dur=np.float64, role=np.int8, pid=np.int64, tid=np.int64,
                          external_id=np.int64, correlation=np.int64, collective=np.int32, pg=np.int32,
                          group_size=np.int64, in_nelems=np.float64, out_nelems=np.float64, dtype=np.int32, seq=np.int64,
                          pg_desc=np.int32, pg_ranks=np.int32, comms_id=np.int32),
        }
        kinds = np.array(["kernel", "memcpy", "memset"], dtype=object)
        name_index = pd.Index(names)
        out = {}
        for table, spec in specs.items():
            cols = self.tables[table].frame(spec)
            self.tables[table] = None  # release chunk arrays as we go
            cols["ts"] = cols["ts"] - base
            if "name" in cols:  # the names this table uses, in the interner's order (no unused category)
                codes = cols["name"]
                used = np.bincount(codes, minlength=len(names)) > 0
                kept = np.flatnonzero(used)
                cols["name"] = pd.Categorical.from_codes((np.cumsum(used) - 1)[codes], categories=name_index[kept])
            if "dur" in cols:
                cols["end"] = cols["ts"] + cols["dur"]
            if table == "gpu":
                cols["kind"] = pd.Categorical.from_codes(cols["kind"].astype(np.int64), categories=kinds.tolist())
            if table == "cpu":
                cols["call_stack"] = _decode_codes(cols["call_stack"], self.stacks)
                cols["input_type"] = _decode_codes(cols["input_type"], self.types)
                cols["input_dims"] = _decode_codes(cols["input_dims"], self.types)
                cols["input_concrete"] = _decode_codes(cols["input_concrete"], self.concrete)
            if table == "comms":
                cols["role"] = pd.Categorical.from_codes(cols["role"].astype(np.int64), categories=list(ROLES))
                for col in ("collective", "pg", "dtype", "pg_desc", "pg_ranks", "comms_id"):
                    cols[col] = _decode_codes(cols[col], self.types)
            df = pd.DataFrame(cols, copy=False)  # a block per column: no copy to consolidate, and faster row picks
            out[table] = df if df["ts"].is_monotonic_increasing else df.sort_values("ts", kind="stable", ignore_index=True)
        return out


def _raw_json(raw):
    """A lazily kept (msgspec.Raw) field, decoded; None when it is not valid JSON."""
    try:
        return _ANY.decode(raw)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError, TypeError):
        return None


def _raw_text(raw: bytes) -> str:
    """A raw JSON value as text: a string's contents, a number's digits, "" for null."""
    raw = bytes(raw).strip()
    if raw in (b"", b"null"):
        return ""
    if raw[:1] == b'"':
        value = _raw_json(raw)
        return value if isinstance(value, str) else ""
    return raw.decode("utf-8", "replace")


def _text(value) -> str:
    """A metadata arg as text ("" when absent): process group names are "0" in one trace and 0 in another."""
    return "" if value is None else value if isinstance(value, str) else str(value)


def _decode_codes(codes: np.ndarray, interner: Interner) -> pd.Categorical:
    return pd.Categorical.from_codes(codes.astype(np.int64), categories=interner.categories())


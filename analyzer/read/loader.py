"""Kineto trace (.json / .json.gz) → `TraceModel`, decoded by msgspec straight into columns.

Why not `json.load`: it builds a dict per event (about 1 KB each) before any analysis starts. Here the
events array is cut at `},{` into ~8 MB sub-arrays that are decoded into typed structs, turned into numpy
columns and dropped. Big regular files (plain or .gz) are streamed window by window (stream.py), so
memory holds one window plus the columns; everything else — pipes, small files, and files that are cut
off, damaged or oddly laid out — takes the careful path below, which reads the whole file, validates it
and salvages what it can. A chunk that fails typed decoding is decoded event by event; events that
cannot be read are counted and skipped, never fatal.
"""

from __future__ import annotations

import gc
import math
import operator
import os
import re
import stat
import zlib
from collections import Counter
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from . import events as ev
from . import forked, stream
from gpuadvise.analyzer.errors import InputError, human_size
from gpuadvise.analyzer.model.trace import Device, TraceMeta, TraceModel

CHUNK_EVENTS = 50_000
# Real traces top out at a few GB; a .gz that inflates past this is refused rather than risking the
# user's machine (override with GPUADVISE_MAX_TRACE_BYTES).
MAX_TRACE_BYTES = int(os.environ.get("GPUADVISE_MAX_TRACE_BYTES", 16 * 2**30))

# Ops whose input shapes/dtypes the rules read (Tensor Core eligibility, fp16 alignment).
MATMUL_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|conv|convolution|cudnn_conv|_convolution)")

_EMPTY_ARGS = ev.Args()
_RAW_ARGS = {"Input type", "Input Dims"}
_TS, _DUR = operator.attrgetter("ts"), operator.attrgetter("dur")
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[ev.Event])
_ONE_EVENT = msgspec.json.Decoder(ev.Event)
_ANY = msgspec.json.Decoder()


MAX_NAME = 4096


class _Interner(dict):
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


def read_trace_bytes(path: Path) -> tuple[bytes, bool]:
    """The decompressed bytes of a trace file, and whether a .gz stream was cut short.

    Works on pipes and devices too (no seek), and never reads or inflates past MAX_TRACE_BYTES."""
    try:
        with open(path, "rb", buffering=0) as fh:  # unbuffered: one exact-size buffer for regular files
            magic = fh.read(2)
            if magic == b"\x1f\x8b":
                return _gunzip(path, fh, magic)
            st = os.fstat(fh.fileno())
            if stat.S_ISREG(st.st_mode):
                if st.st_size > MAX_TRACE_BYTES:
                    raise InputError(path, f"trace is {human_size(st.st_size)}, above the {human_size(MAX_TRACE_BYTES)} limit "
                                           "(GPUADVISE_MAX_TRACE_BYTES)")
                fh.seek(0)  # regular files seek; re-reading beats `magic + rest`, a second 1 GB copy
                return fh.readall(), False
            buf = bytearray(magic)  # a pipe or a device: read in blocks up to the limit
            while True:
                block = fh.read(1 << 20)
                if not block:
                    return buf, False
                buf += block
                if len(buf) > MAX_TRACE_BYTES:
                    raise InputError(path, f"input is larger than the {human_size(MAX_TRACE_BYTES)} limit (GPUADVISE_MAX_TRACE_BYTES)")
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "is a folder, not a trace file") from None
    except PermissionError:
        raise InputError(path, "permission denied") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def _gunzip(path: Path, fh, head: bytes) -> tuple[bytes, bool]:
    # Streamed so that a truncated or corrupt .gz still yields what it held, and a bomb is stopped while
    # it inflates: each step inflates at most up to the limit.
    out = bytearray()
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    truncated = False
    pending = head
    try:
        while True:
            block = pending or fh.read(1 << 20)
            pending = b""
            if not block:
                truncated = not inflater.eof
                break
            while block:
                room = MAX_TRACE_BYTES + 1 - len(out)
                out += inflater.decompress(block, room)
                if len(out) > MAX_TRACE_BYTES:
                    raise InputError(path, f"gzip inflates to more than {human_size(MAX_TRACE_BYTES)}; refusing to read it "
                                           "(GPUADVISE_MAX_TRACE_BYTES)")
                block = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:  # concatenated gzip members
                    block = inflater.unused_data
                    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                elif inflater.eof:
                    block = b""
    except zlib.error:
        if not out:
            raise InputError(path, "corrupt gzip data") from None
        truncated = True
    if truncated and not out:
        raise InputError(path, "gzip stream cut off before any data")
    return out, truncated  # a bytearray: msgspec reads it in place, no second copy


def load_trace(path: str | Path, progress=None, cache: bool | None = None) -> TraceModel:
    """Load a trace. `progress(done, total)` (bytes) is called as chunks are decoded, if given.

    With `cache` (default: on unless GPUADVISE_NO_CACHE is set) a parsed model of a big trace is
    kept beside it and reused while the file is unchanged (see cache.py).
    """
    from . import cache as cache_mod

    path = Path(path)
    use_cache = cache_mod.enabled() if cache is None else cache
    if use_cache:
        cached = cache_mod.load(path)
        if cached is not None:
            cached.meta.path = str(path)
            return cached
    model = _load_uncached(path, progress)
    if use_cache:
        cache_mod.save(path, model)
    return model


def _load_uncached(path: Path, progress) -> TraceModel:
    # Millions of short-lived objects, none in a reference cycle: the cyclic GC would only rescan them.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        src = stream.eligible(path, MAX_TRACE_BYTES)
        model = _load_streaming(src, path, progress) if src is not None else None
        if model is not None:
            return model
        # The bytes travel in a one-slot list so the parser can drop the last reference (1 GB for a 1 GB
        # trace) as soon as the events are decoded, before the frames are assembled.
        holder = list(read_trace_bytes(path))
        return parse_trace_bytes(holder, path, progress=progress)
    finally:
        if was_enabled:
            gc.enable()


def _load_streaming(src, path: Path, progress) -> TraceModel | None:
    """A big, well-formed file in windows (stream.py); None sends it down the careful path."""
    scratch = TraceMeta(path=str(path))
    try:
        def feed(b, chunks, share=None):  # share: the part of the file this process decodes (1, ½), if shown
            _feed(b, chunks, retry=True, progress=_Progress(progress, src.size, share) if progress and share else None)

        b, header = stream.stream_events(src, lambda: _Builder(scratch), feed, _load_workers(), PARALLEL_MIN_BYTES)
    except stream.NotStreamable:
        return None
    meta = _meta_from_header(header, path)
    for key in ("process_names", "thread_names", "profiler_ranges", "overhead_events"):  # filled while decoding
        setattr(meta, key, getattr(scratch, key))
    meta.bytes_total = src.size
    b.meta = meta
    return _finish(b, meta, path)


def parse_trace_bytes(data, path: Path, gz_truncated: bool = False, progress=None) -> TraceModel:
    """Parse trace bytes; `data` may be a [bytes, gz_truncated] holder whose bytes are released early."""
    if isinstance(data, list):
        data, gz_truncated = data.pop(0), data.pop(0)
    # Strip only when needed: lstrip copies the whole buffer, which matters at 1 GB.
    body = bytes(data).lstrip(_SPACE) if bytes(data[:1]) in _SPACE_STARTS else data
    if not body:
        raise InputError(path, "empty file")
    header = ev.Header()
    body = _nan_tokens_to_null(body)
    if body[:1] == b"[":
        raws, cut = _decode_event_list(body, path)
    elif body[:1] == b"{":
        header, raws, cut = _decode_document(body, path)
    else:
        raise InputError(path, "not a JSON trace (expected '{' or '[' at the start)")
    total = len(data)
    del body, data
    meta = _meta_from_header(header, path)
    meta.bytes_total = total
    if isinstance(cut, tuple):  # damaged in the middle, read up to the damage
        meta.damaged_at = cut[1]
    meta.truncated = bool(gz_truncated or cut)
    box = [raws]  # _build takes the only reference, so the file's bytes die with the events
    del raws
    return _build(box, meta, path, progress)


# Python's json.dumps writes NaN/Infinity, which is not JSON; such values become null (and the event is
# then skipped and counted). Only outside strings: a token must follow ':', ',' or '[' and end a value.
_NAN_TOKEN = re.compile(rb"(?<=[:,\[])(\s*)(?:NaN|-?Infinity)(?=\s*[,\]\}])")


_LONE_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})|(?<![0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


class _Replaced(bytes):
    """Bytes already re-encoded with U+FFFD for invalid UTF-8 (so we retry only once)."""

    _replaced = True


def _nan_tokens_to_null(body):
    if b"NaN" in body or b"Infinity" in body:
        if _NAN_TOKEN.search(body):
            body = _NAN_TOKEN.sub(rb"\1null", bytes(body))
    if b"\\ud" in body or b"\\uD" in body:  # lone UTF-16 surrogates are invalid JSON strings for msgspec
        if _LONE_SURROGATE.search(body):
            body = _LONE_SURROGATE.sub(rb"\\ufffd", bytes(body))
    return body


_SPACE = b"\xef\xbb\xbf \t\r\n"
_SPACE_STARTS = {bytes([c]) for c in _SPACE}


def _decode_document(body: bytes, path: Path):
    try:
        header = ev.HEADER.decode(body)
    except msgspec.ValidationError as exc:
        if "traceEvents" in str(exc):
            raise InputError(path, "'traceEvents' is not a list of events") from None
        raise InputError(path, f"not a Kineto trace ({_short(exc)})") from None
    except msgspec.DecodeError as exc:
        damage = _damage_offset(exc, len(body))
        if damage is not None and damage < len(body) and body[damage] >= 0x80 and not getattr(body, "_replaced", False):
            return _decode_document(_Replaced(bytes(body).decode("utf-8", "replace").encode()), path)
        return _salvage_document(body, path, damage)
    except UnicodeDecodeError:
        if not getattr(body, "_replaced", False):  # invalid UTF-8 in the header: read it as U+FFFD, once
            return _decode_document(_Replaced(bytes(body).decode("utf-8", "replace").encode()), path)
        raise InputError(path, "not valid UTF-8 text") from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply to be a trace") from None
    events = header.traceEvents
    head = bytes(memoryview(events)[:64]).lstrip()
    if head.startswith(b"null"):
        raise InputError(path, "JSON has no 'traceEvents' list: not a PyTorch profiler trace")
    if not head.startswith(b"["):
        raise InputError(path, "'traceEvents' is not a list of events")
    header.traceEvents = msgspec.Raw(b"null")
    return header, events, False


def _decode_event_list(body: bytes, path: Path):
    try:
        msgspec.json.decode(body, type=msgspec.Raw)  # validate once; events are decoded in chunks later
        return body, False
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        damage = _damage_offset(exc, len(body))
        raws = _salvage_events(body, 0, damage)
        if raws is None:
            raise InputError(path, "not valid JSON") from None
        return raws, ("damaged", damage) if damage is not None else True


def _damage_offset(exc, size: int) -> int | None:
    """Where msgspec found the JSON malformed (byte N), or None when the input was merely cut off
    (msgspec says "truncated", or the bad byte is within the last few bytes: a cut inside a literal)."""
    if isinstance(exc, (UnicodeDecodeError, RecursionError)):
        return None
    m = re.search(r"\(byte (\d+)\)", str(exc))
    if not m or "truncated" in str(exc):
        return None
    offset = int(m.group(1))
    return None if offset >= size - 64 else offset


def _salvage_document(body: bytes, path: Path, damage: int | None = None):
    """A document cut off mid-write (or damaged at byte `damage`): keep the header fields we can and
    every complete event before the cut or the damage."""
    key = body.find(b'"traceEvents"')
    if key < 0:
        raise InputError(path, "not valid JSON and no 'traceEvents' found")
    bracket = body.find(b"[", key)
    if bracket < 0:
        raise InputError(path, "not valid JSON: 'traceEvents' has no list")
    raws = _salvage_events(body, bracket, damage)
    if raws is None:
        where = f" (damaged at byte {damage})" if damage is not None else ""
        raise InputError(path, f"not valid JSON{where}: no complete event could be read")
    header = ev.Header()
    # Header keys written before the events (rare) are lost; keys after the cut are gone anyway.
    tail = body[:key].rstrip().rstrip(b",") + b"}"
    try:
        header = ev.HEADER.decode(tail)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        pass
    return header, raws, ("damaged", damage) if damage is not None else True


def _salvage_events(body: bytes, bracket: int, damage: int | None = None, max_tries: int = 200):
    """Cut the list after the last complete event that still parses, walking back from the end (or
    from the damage: everything before it parsed, so the first boundary before it usually works)."""
    pos = len(body) if damage is None else min(len(body), damage)
    for _ in range(max_tries):
        pos = body.rfind(b"}", bracket, pos)
        if pos < 0:
            return [] if body.find(b"{", bracket) < 0 else None
        try:
            return _RAW_LIST.decode(body[bracket : pos + 1] + b"]")
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            continue
    return None


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:120]


# ----------------------------------------------------------------------------------------------------
# Header facts


def _meta_from_header(h: ev.Header, path: Path) -> TraceMeta:
    meta = TraceMeta(path=str(path))
    props = h.deviceProperties if isinstance(h.deviceProperties, list) else h.computeProperties
    if isinstance(props, list):
        for i, p in enumerate(props):
            if not isinstance(p, dict):
                continue
            meta.devices.append(Device(
                id=_int(p.get("id"), i),
                name=str(p.get("name") or ""),
                compute_major=_int(p.get("computeMajor"), None),
                compute_minor=_int(p.get("computeMinor"), None),
                total_memory=_int(p.get("totalGlobalMem"), None),
                num_sms=_int(p.get("numSms"), None),
            ))
    if isinstance(h.distributedInfo, dict):
        meta.rank = _int(h.distributedInfo.get("rank"), None)
        meta.world_size = _int(h.distributedInfo.get("world_size"), None)
    for key in ("schemaVersion", "cupti_version", "cuda_runtime_version", "cuda_driver_version",
                "hip_runtime_version", "roctracer_version"):
        value = getattr(h, key)
        if isinstance(value, (int, float, str)):
            meta.versions[key] = value
    for key in ("record_shapes", "profile_memory", "with_stack"):
        value = getattr(h, key)
        if isinstance(value, (int, bool)):
            meta.flags[key] = bool(value)
    if "hip_runtime_version" in meta.versions or "roctracer_version" in meta.versions:
        meta.platform = "rocm"
    elif "cuda_runtime_version" in meta.versions or "cupti_version" in meta.versions:
        meta.platform = "cuda"
    return meta


def _int(value, default):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default


# ----------------------------------------------------------------------------------------------------
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


class _Builder:
    def __init__(self, meta: TraceMeta):
        self.meta = meta
        self.names = _Interner()
        self.matmul_names: set[int] = set()
        self.names_checked = 0
        self.stacks = _Interner()
        self.stacks[""]  # code 0 = no stack
        self.types = _Interner()
        self.types[""]
        self.thread_codes = _Interner()  # non-numeric pid/tid strings → negative ids
        self.ident_cache: dict = {}
        self.tables = {k: _Columns() for k in ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations")}
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

    def _codes(self, events: list) -> list:
        get = self.cat_cache.get
        try:
            codes = [get(c, _NEW) for c in map(_CAT, events)]
            if _NEW in codes:  # categories not seen before (the first chunks only)
                cache, learn = self.cat_cache, self._learn
                codes = [c if c != _NEW else cache[e.cat] if e.cat in cache else learn(e.cat) for c, e in zip(codes, events)]
            return codes
        except TypeError:
            return [self._learn(e.cat) if isinstance(e.cat, (str, int, float, type(None))) else -1 for e in events]

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
        ids = np.array(values)
        if ids.dtype == np.int64:  # the common case: plain integer ids, converted in C
            return ids
        ident = self._ident
        return [v if type(v) is int and -(2**63) <= v < 2**63 else ident(v) for v in values]

    def _names(self, evs) -> np.ndarray:
        names = self.names
        try:
            return np.fromiter(map(names.__getitem__, [e.name for e in evs]), dtype=np.int32, count=len(evs))
        except TypeError:
            return np.array([names[n if isinstance(n, str) else str(n)] for n in (e.name for e in evs)], dtype=np.int32)

    # -- per chunk ------------------------------------------------------------------------------
    def add_chunk(self, events: list) -> None:
        codes = np.array(self._codes(events), dtype=np.int16)
        buckets: dict[int, list] = {}
        for code in np.unique(codes).tolist():
            if code == _IGNORED:
                continue
            idx = np.flatnonzero(codes == code).tolist()
            evs = [events[i] for i in idx]
            if code == -1:
                for e in evs:
                    self.unknown[str(e.cat)] += 1
                continue
            if code == _INSPECT:
                for e in evs:
                    if e.ph == "M":
                        self._metadata(e)
                    elif e.name == "[memory]":
                        buckets.setdefault(ev.MEMORY, []).append(e)
                continue
            buckets[code] = evs
        for code, evs in buckets.items():
            evs, ts, dur = self._valid(evs)
            if not evs:
                continue
            self.tabulated += len(evs)
            if code in (ev.KERNEL, ev.MEMCPY, ev.MEMSET):
                self._gpu(evs, ts, dur, code)
            elif code == ev.RUNTIME:
                self._runtime(evs, ts, dur)
            elif code in (ev.CPU_OP, ev.ANNOTATION):
                self._cpu(evs, ts, dur, code == ev.ANNOTATION)
            elif code == ev.PYTHON:
                self._python(evs, ts, dur)
            elif code == ev.MEMORY:
                self._memory(evs, ts)
            elif code == ev.SYNC:
                self._span("syncs", evs, ts, dur)
            elif code == ev.GPU_ANNOTATION:
                self._span("gpu_annotations", evs, ts, dur)
            elif code == ev.RANGE:
                self.meta.profiler_ranges += len(evs)
            elif code == ev.OVERHEAD:
                self.meta.overhead_events += len(evs)

    def _valid(self, evs: list):
        """Drop events without a usable timestamp or with a negative duration (counted, not fatal).
        Returns the events kept with their ts and dur columns (dur NaN → 0)."""
        ts = _f(list(map(_TS, evs)))
        dur = _f(list(map(_DUR, evs)))
        bad = np.isnan(ts) | (dur < 0) | np.isinf(ts) | np.isinf(dur)
        if bad.any():
            self.skipped += int(bad.sum())
            evs = [e for e, b in zip(evs, bad.tolist()) if not b]
            ts, dur = ts[~bad], dur[~bad]
        if ts.size:
            self.min_ts = min(self.min_ts, float(ts.min()))
        return evs, ts, np.nan_to_num(dur, nan=0.0)

    def _metadata(self, e) -> None:
        a = e.args
        if a is None or not isinstance(a.name, str):
            return
        if e.name == "process_name":
            self.meta.process_names[self._ident(e.pid)] = a.name
        elif e.name == "thread_name":
            self.meta.thread_names[(self._ident(e.pid), self._ident(e.tid))] = a.name

    def _base(self, t: _Columns, evs, ts, dur) -> list:
        t.add("name", self._names(evs), np.int32)
        t.add("ts", ts, np.float64)
        t.add("dur", dur, np.float64)
        return [e.args or _EMPTY_ARGS for e in evs]

    def _gpu(self, evs, ts, dur, code) -> None:
        t = self.tables["gpu"]
        args = self._base(t, evs, ts, dur)
        t.add("kind", np.full(len(evs), code, np.int8), np.int8)
        t.add("device", self._arg_or([a.device for a in args], [e.pid for e in evs]), np.int64)
        t.add("stream", self._arg_or([a.stream for a in args], [e.tid for e in evs]), np.int64)
        t.add("correlation", _i([a.correlation for a in args]), np.int64)
        t.add("external_id", _external(args), np.int64)
        t.add("bytes", _f([a.nbytes for a in args]), np.float64)

    def _arg_or(self, values: list, fallback: list) -> np.ndarray:
        """An id from args (device, stream), else from pid/tid (old traces: pid 0, tid "stream 7")."""
        ids = _i(values)
        missing = ids < 0
        if missing.any():
            ids = np.where(missing, np.array(self._idents(fallback), dtype=np.int64), ids)
        return ids

    def _runtime(self, evs, ts, dur) -> None:
        t = self.tables["runtime"]
        args = self._base(t, evs, ts, dur)
        t.add("pid", self._idents([e.pid for e in evs]), np.int64)
        t.add("tid", self._idents([e.tid for e in evs]), np.int64)
        t.add("correlation", _i([a.correlation for a in args]), np.int64)
        t.add("external_id", _external(args), np.int64)

    def _cpu(self, evs, ts, dur, annotation: bool) -> None:
        t = self.tables["cpu"]
        names = self._names(evs)
        t.add("name", names, np.int32)
        t.add("ts", ts, np.float64)
        t.add("dur", dur, np.float64)
        args = [e.args or _EMPTY_ARGS for e in evs]
        t.add("pid", self._idents([e.pid for e in evs]), np.int64)
        t.add("tid", self._idents([e.tid for e in evs]), np.int64)
        t.add("is_annotation", np.full(len(evs), annotation), bool)
        t.add("external_id", _external(args), np.int64)
        t.add("seq", _i([a.sequence_number for a in args]), np.int64)
        stacks = self.stacks
        t.add("call_stack", [stacks[c] if type(c) is str else 0 for c in [a.call_stack for a in args]], np.int32)
        # shapes and dtypes only for matmul/conv ops: checked once per distinct name
        for name, code in list(self.names.items())[self.names_checked:]:
            if isinstance(name, str) and MATMUL_OPS.match(name):
                self.matmul_names.add(code)
        self.names_checked = len(self.names)
        typ = np.zeros(len(evs), np.int32)
        dims = np.zeros(len(evs), np.int32)
        if self.matmul_names:
            for i in np.flatnonzero(np.isin(names, list(self.matmul_names))).tolist():
                a = args[i]
                typ[i] = self.types[",".join(map(str, kinds))] if isinstance(kinds := _raw_json(a.input_type), list) else 0
                dims[i] = self.types[bytes(a.input_dims).decode("utf-8", "replace")]
        t.add("input_type", typ, np.int32)
        t.add("input_dims", dims, np.int32)

    def _python(self, evs, ts, dur) -> None:
        t = self.tables["python"]
        args = self._base(t, evs, ts, dur)
        t.add("tid", self._idents([e.tid for e in evs]), np.int64)
        t.add("python_id", _i([a.python_id for a in args]), np.int64)
        t.add("parent_id", _i([a.python_parent_id for a in args]), np.int64)

    def _memory(self, evs, ts) -> None:
        t = self.tables["memory"]
        t.add("ts", ts, np.float64)
        args = [e.args or _EMPTY_ARGS for e in evs]
        t.add("bytes", _f([a.mem_bytes for a in args]), np.float64)
        t.add("total_allocated", _f([a.total_allocated for a in args]), np.float64)
        t.add("total_reserved", _f([a.total_reserved for a in args]), np.float64)
        t.add("device_type", _i([a.device_type for a in args]), np.int64)
        t.add("device", _i([a.device_id for a in args]), np.int64)
        t.add("addr", _f([a.addr for a in args]), np.float64)

    def _span(self, table: str, evs, ts, dur) -> None:
        t = self.tables[table]
        args = self._base(t, evs, ts, dur)
        t.add("device", self._arg_or([a.device for a in args], [e.pid for e in evs]), np.int64)
        t.add("stream", self._arg_or([a.stream for a in args], [e.tid for e in evs]), np.int64)
        t.add("correlation", _i([a.correlation for a in args]), np.int64)

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
        recode = {"name": names, "call_stack": stacks, "input_type": types, "input_dims": types}
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


def _external(args) -> np.ndarray:
    """`External id` (new traces) or `external id` (2021 traces)."""
    return _i([a.external_id if a.external_id is not None else a.external_id_legacy for a in args])


def _decode_codes(codes: np.ndarray, interner: _Interner) -> pd.Categorical:
    return pd.Categorical.from_codes(codes.astype(np.int64), categories=interner.categories())


def _build(events: list, meta: TraceMeta, path: Path, progress=None) -> TraceModel:
    """`events`: a one-slot list holding the JSON events array (bytes) or raw event slices (salvage)."""
    events = events.pop()
    b = _Builder(meta)
    if isinstance(events, list):
        _feed(b, _raw_list_chunks(events), retry=False)
    else:
        total = memoryview(events).nbytes
        parts = _parallel_parts(events)
        # the parent decodes half of the bytes while the worker decodes the other half
        half = _Progress(progress, total, scale=2) if progress else None
        if parts is None or not _build_parallel(b, events, parts, half):
            b = _Builder(meta)
            _feed(b, _array_chunks(events), retry=True, progress=_Progress(progress, total) if progress else None)
    del events  # the last reference to the file's bytes: free them before the frames
    return _finish(b, meta, path)


def _finish(b: "_Builder", meta: TraceMeta, path: Path) -> TraceModel:
    if b.total and b.skipped >= b.total and not b.tabulated:
        raise InputError(path, f"none of its {b.total} events is a trace event: not a PyTorch profiler trace")
    meta.events_total = b.total
    meta.events_skipped = b.skipped
    meta.unknown_categories = dict(b.unknown)
    frames = b.frames()
    _platform_from_names(meta, frames["runtime"])
    return TraceModel(meta=meta, **frames)


class _Progress:
    """`callback(done, total)` as chunks are handed to the decoder; a process that decodes half of the
    file reports its bytes twice over (`scale` 2), as the other half goes at the same pace."""

    def __init__(self, callback, total: int, scale: int = 1):
        self.callback, self.total, self.scale, self.done = callback, total, scale, 0

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        try:
            self.callback(min(self.done * self.scale, self.total), self.total)
        except Exception:  # a progress display must never break loading
            pass


def _feed(b: "_Builder", chunks, retry: bool, progress: _Progress | None = None) -> None:
    """Decode chunk after chunk into the builder; a chunk cut inside a string asks for a longer one."""
    buf = next(chunks, None)
    while buf is not None:
        if progress is not None:
            progress.add(len(buf))
        try:
            decoded = _decode_chunk(b, buf)
        except msgspec.DecodeError:
            if not retry:
                raise
            buf = chunks.send(True)
            continue
        b.add_chunk(decoded)
        del decoded
        buf = next(chunks, None)


def _decode_chunk(b: "_Builder", buf, repaired: bool = False) -> list:
    try:
        try:
            decoded = _EVENTS.decode(buf)
        except (msgspec.ValidationError, UnicodeDecodeError, RecursionError):
            raws = _RAW_LIST.decode(buf)
            b.total += len(raws)
            return _decode_leniently(raws, b)
        b.total += len(decoded)
        return decoded
    except msgspec.DecodeError:
        # NaN tokens or lone surrogates (streamed files skip the whole-document pass that removes them)
        fixed = buf if repaired else _nan_tokens_to_null(buf)
        if fixed is buf:
            raise
        return _decode_chunk(b, fixed, repaired=True)


# -- two processes on big traces ------------------------------------------------------------------
# A forked worker (forked.py) decodes the second half of the events and sends back plain numpy columns
# and its string tables, which the parent re-codes and appends.

PARALLEL_MIN_BYTES = int(os.environ.get("GPUADVISE_PARALLEL_MIN_BYTES", 48 << 20))


def _load_workers() -> int:
    env = os.environ.get("GPUADVISE_LOAD_WORKERS")
    if env and env.isdigit():
        return max(1, int(env))
    return min(2, os.cpu_count() or 1)


def _parallel_parts(array):
    data = memoryview(array)
    if data.nbytes < PARALLEL_MIN_BYTES or _load_workers() < 2 or not forked.can_fork():
        return None
    lo, hi = _array_interior(data)
    m = _BOUNDARY.search(data, lo + (hi - lo) // 2, hi)
    if m is None:
        return None
    return (lo, m.start() + 1), (m.end() - 1, hi)


def _array_interior(data: memoryview) -> tuple[int, int]:
    """Offsets just inside the array's brackets."""
    end = data.nbytes
    while end > 0 and bytes(data[end - 1 : end]) in b" \t\r\n":
        end -= 1
    start = 0
    while start < end and bytes(data[start : start + 1]) != b"[":
        start += 1
    return start + 1, end - 1


def _build_parallel(b: "_Builder", array, parts, progress: _Progress | None = None) -> bool:
    (lo1, hi1), (lo2, hi2) = parts

    def second_half():
        child = _Builder(b.meta)
        _feed(child, _array_chunks(array, lo2, hi2), retry=False)
        return child.export()

    worker = forked.Forked(second_half)
    try:
        _feed(b, _array_chunks(array, lo1, hi1), retry=False, progress=progress)
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


CHUNK_BYTES = 8 << 20
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_OPEN = re.compile(rb"\{")


def _raw_list_chunks(raws: list):
    for start in range(0, len(raws), CHUNK_EVENTS):
        yield b"[" + b",".join(raws[start : start + CHUNK_EVENTS]) + b"]"


def _array_chunks(array, lo: int | None = None, hi: int | None = None):
    """Split a JSON array of objects (or its [lo, hi) byte range) into ~8 MB sub-arrays at `},{`
    without parsing it first.

    A cut can only go wrong inside a string that itself contains `},{`; such a piece fails to parse,
    and the caller asks for a longer one (`send(True)`), so the pieces are always exact.
    """
    data = memoryview(array)  # zero-copy: the array stays inside the file's bytes
    if lo is None:
        lo, end = _array_interior(data)
    else:
        end = hi
    pos = lo
    first = True
    while True:
        m = _OPEN.search(data, pos, end)
        if m is None:
            if first and bytes(data[lo:end]).strip():  # entries that are not objects: let the decoder judge
                yield b"".join((b"[", data[lo:end], b"]"))
            return
        first = False
        pos = m.start()
        reach = pos + CHUNK_BYTES
        while True:
            m = _BOUNDARY.search(data, reach, end) if end - reach > CHUNK_BYTES // 4 else None
            cut = m.start() + 1 if m else end
            retry = yield b"".join((b"[", data[pos:cut], b"]"))
            if not retry or cut == end:
                break
            reach = cut + 1  # the cut fell inside a string: extend to the next boundary
        pos = cut


def _decode_leniently(chunk: list, b: _Builder) -> list:
    """Decode a chunk event by event; repair ill-typed fields where possible, skip the rest."""
    out = []
    for raw in chunk:
        try:
            out.append(_ONE_EVENT.decode(raw))
            continue
        except (msgspec.MsgspecError, RecursionError):
            pass
        except UnicodeDecodeError:  # invalid UTF-8 inside a string: keep the event with U+FFFD in it
            try:
                out.append(_ONE_EVENT.decode(bytes(raw).decode("utf-8", "replace").encode()))
                continue
            except (msgspec.MsgspecError, RecursionError):
                pass
        try:
            obj = _ANY.decode(bytes(raw).decode("utf-8", "replace").encode())
        except (msgspec.MsgspecError, RecursionError):
            b.skipped += 1
            continue
        event = _repair(obj)
        if event is None:
            b.skipped += 1
        else:
            out.append(event)
    return out


def _repair(obj) -> ev.Event | None:
    if not isinstance(obj, dict):
        return None
    args = obj.get("args")
    if isinstance(args, dict):  # the fields kept as raw JSON must be handed over as raw JSON
        for key in _RAW_ARGS & args.keys():
            try:
                args[key] = msgspec.Raw(msgspec.json.encode(args[key]))
            except (msgspec.MsgspecError, TypeError, ValueError, OverflowError):
                del args[key]
    try:
        return msgspec.convert(obj, ev.Event, strict=False)
    except msgspec.MsgspecError:
        pass
    args = obj.get("args")
    clean = {k: v for k, v in obj.items() if k != "args"}
    if isinstance(args, dict):
        good = {}
        for key, value in args.items():
            try:
                msgspec.convert({key: value}, ev.Args, strict=False)
                good[key] = value
            except msgspec.MsgspecError:
                continue
        clean["args"] = good
    for key in ("ts", "dur"):
        value = clean.get(key)
        if isinstance(value, str):
            try:
                clean[key] = float(value)
            except ValueError:
                return None
    for key in ("ph", "cat", "name", "pid", "tid"):
        if key in clean and not isinstance(clean[key], (str, int)) or isinstance(clean.get(key), bool):
            clean[key] = str(clean[key])
    try:
        return msgspec.convert(clean, ev.Event, strict=False)
    except msgspec.MsgspecError:
        return None


def _platform_from_names(meta: TraceMeta, runtime: pd.DataFrame) -> None:
    if meta.platform != "unknown" or runtime.empty:
        return
    names = runtime["name"].cat.categories
    if any(str(n).startswith("hip") for n in names):
        meta.platform = "rocm"
    elif any(str(n).startswith("cu") for n in names):
        meta.platform = "cuda"

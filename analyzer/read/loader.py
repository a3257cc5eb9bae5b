"""Kineto trace (.json / .json.gz) → `TraceModel`, decoded straight into columns.

Why not `json.load`: it builds a dict per event (about 1 KB each) before any analysis starts. Here the
events array is cut at `},{` into ~8 MB sub-arrays that the compiled scanner reads into flat columns
(msgspec decodes those it declines into typed structs), turned into numpy columns and dropped. Big
regular files (plain or .gz) are streamed window by window (stream.py), so memory holds one window plus
the columns; everything else — pipes, small files, and files that are cut off, damaged or oddly laid
out — takes the careful path below, which reads the whole file, validates it and salvages what it can.
A chunk that fails typed decoding is decoded event by event; events that cannot be read are counted and
skipped, never fatal.

The steps live in their own modules: filebytes.py (reading, gzip, size limit), repair.py (damaged JSON),
chunks.py (cutting the array and feeding chunks), rows.py (a chunk's events, scanned or as structs),
columns.py (events → columns), parallel.py (the two-process split), header.py (TraceMeta from the
header). This module chooses the path and joins them.
"""

from __future__ import annotations

import gc
from pathlib import Path

from . import events as ev
from . import filebytes, parallel, stream
from .chunks import Progress, array_chunks, feed, raw_list_chunks
from .columns import Builder
from .filebytes import read_trace_bytes
from .header import meta_from_header, platform_from_names
from .repair import SPACE, SPACE_STARTS, decode_document, decode_event_list, nan_tokens_to_null
from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.model.trace import TraceMeta, TraceModel


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
        src = stream.eligible(path, filebytes.MAX_TRACE_BYTES)
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
        def feed_share(b, chunks, share=None):  # share: the part of the file this process decodes (1, ½), if shown
            feed(b, chunks, retry=True, progress=Progress(progress, src.size, share) if progress and share else None)

        b, header = stream.stream_events(src, lambda: Builder(scratch), feed_share, parallel.load_workers(),
                                          parallel.PARALLEL_MIN_BYTES)
    except stream.NotStreamable:
        return None
    meta = meta_from_header(header, path)
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
    body = bytes(data).lstrip(SPACE) if bytes(data[:1]) in SPACE_STARTS else data
    if not body:
        raise InputError(path, "empty file")
    header = ev.Header()
    body = nan_tokens_to_null(body)
    if body[:1] == b"[":
        raws, cut = decode_event_list(body, path)
    elif body[:1] == b"{":
        header, raws, cut = decode_document(body, path)
    else:
        raise InputError(path, "not a JSON trace (expected '{' or '[' at the start)")
    total = len(data)
    del body, data
    meta = meta_from_header(header, path)
    meta.bytes_total = total
    if isinstance(cut, tuple):  # damaged in the middle, read up to the damage
        meta.damaged_at = cut[1]
    meta.truncated = bool(gz_truncated or cut)
    box = [raws]  # _build takes the only reference, so the file's bytes die with the events
    del raws
    return _build(box, meta, path, progress)


def _build(events: list, meta: TraceMeta, path: Path, progress=None) -> TraceModel:
    """`events`: a one-slot list holding the JSON events array (bytes) or raw event slices (salvage)."""
    events = events.pop()
    b = Builder(meta)
    if isinstance(events, list):
        feed(b, raw_list_chunks(events), retry=False)
    else:
        total = memoryview(events).nbytes
        parts = parallel.parallel_parts(events)
        # the parent decodes half of the bytes while the worker decodes the other half
        half = Progress(progress, total, scale=2) if progress else None
        if parts is None or not parallel.build_parallel(b, events, parts, half):
            b = Builder(meta)
            feed(b, array_chunks(events), retry=True, progress=Progress(progress, total) if progress else None)
    del events  # the last reference to the file's bytes: free them before the frames
    return _finish(b, meta, path)


def _finish(b: "Builder", meta: TraceMeta, path: Path) -> TraceModel:
    if b.total and b.skipped >= b.total and not b.tabulated:
        raise InputError(path, f"none of its {b.total} events is a trace event: not a PyTorch profiler trace")
    meta.events_total = b.total
    meta.events_skipped = b.skipped
    meta.unknown_categories = dict(b.unknown)
    frames = b.frames()
    platform_from_names(meta, frames["runtime"])
    return TraceModel(meta=meta, **frames)

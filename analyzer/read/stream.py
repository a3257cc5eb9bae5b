"""Big trace files read as a stream of windows: never the whole JSON text of a big file in memory at once.

A regular file (plain or .gz) of at least STREAM_MIN_BYTES is read in ~8 MB windows. The events array
is found from its two ends instead of by validating the whole document first: its opening bracket
after `"traceEvents":` in the first window, its closing bracket in the last window (the bytes after it
must complete the document's header). Each window is cut at `},{` into a sub-array that the loader
decodes into columns and drops, so memory holds one window plus the columns, whatever the file size.

A plain file is mapped (copy-on-write) instead of read: the decoder reads the page cache in place. Each
piece is framed as a JSON array by writing '[' and ']' over the separators around it (restored once it
is decoded), and the pages behind the decoded pieces are handed back (MADV_DONTNEED), so the file's
resident pages stay about one window, whatever its size. Reading it into windows cost each byte three
or four copies (read, joined to the window's rest, framed, the decoded part sliced off): 0.9 of 5.6 s
of CPU on a 965 MB trace. Where a file cannot be mapped, its windows are read as before.

Anything unexpected (a cut-off or damaged file, an odd layout) raises `NotStreamable` and the caller
reads the file the old way, which knows how to salvage and explain. On two cores the events are split
at a `},{` boundary near the middle; a forked worker (forked.py) decodes the second half, reading the
file itself (a .gz worker inflates from the start and drops the first half), and ships its columns back.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import zlib
from pathlib import Path

import msgspec

from . import forked
from gpuadvise.analyzer.errors import InputError, human_size

STREAM_MIN_BYTES = int(os.environ.get("GPUADVISE_STREAM_MIN_BYTES", 16 << 20))
WINDOW = 8 << 20
# Plain files are mapped, not read. A mapped file cut shorter while it is decoded (another program
# rewriting it in place) ends the process with SIGBUS instead of the salvage a read gives:
# GPUADVISE_MAP_FILES=0 reads them instead.
MAP_FILES = hasattr(mmap, "ACCESS_COPY") and os.environ.get("GPUADVISE_MAP_FILES", "1") != "0"
_PAGE = mmap.PAGESIZE
TAIL_RESERVE = 4 << 20  # the header keys after the events array (traceName, INFO logs) fit in this
HEAD_LIMIT = 64 << 20  # "traceEvents" must open within this many bytes
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPACE = b"\xef\xbb\xbf \t\r\n"


class NotStreamable(Exception):
    """The fast path gives up; the caller falls back to reading the whole file."""


# -- byte sources ------------------------------------------------------------------------------------


class _Source:
    """The (decompressed) bytes of a regular file, as blocks from an offset."""

    def __init__(self, path: Path, max_bytes: int):
        self.path = path
        self.max_bytes = max_bytes
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise NotStreamable("not a regular file")
        self.disk_size = st.st_size
        with open(path, "rb") as fh:
            self.gz = fh.read(2) == b"\x1f\x8b"
            self.size = self._gz_size(fh) if self.gz else st.st_size

    def _gz_size(self, fh) -> int:
        """An estimate of the inflated size: the gzip trailer holds it modulo 4 GiB."""
        fh.seek(-4, os.SEEK_END)
        size = int.from_bytes(fh.read(4), "little")
        while size < 2 * self.disk_size:  # traces compress 5-20×: add back the wrapped 4 GiB
            size += 1 << 32
        return size

    def eligible(self) -> bool:
        return (self.disk_size * 8 if self.gz else self.disk_size) >= STREAM_MIN_BYTES

    def window(self, start: int = 0) -> "_Window":
        """A window on the stream from `start`: the whole plain file mapped, else blocks read from it."""
        if self.gz:
            return _Window(self._inflate(start), start)
        mapped = self._map() if MAP_FILES else None
        if mapped is not None:
            return _Window(iter((mapped,)), 0, len(mapped), mapped=True)
        return _Window(self._read(start), start, self.size)

    def _map(self) -> "mmap.mmap | None":
        """The file mapped copy-on-write (the framing brackets never reach the file), or None where it
        cannot be (an empty file, a file system without mmap)."""
        try:
            with open(self.path, "rb") as fh:
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)  # the size it has now
        except (OSError, ValueError):
            return None
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        return mapped

    def _read(self, start: int):
        with open(self.path, "rb", buffering=0) as fh:
            fd, off = fh.fileno(), start
            while True:
                block = os.pread(fd, WINDOW, off)
                if not block:
                    return
                off += len(block)
                yield block

    def _inflate(self, start: int):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pos = 0  # inflated bytes so far
        with open(self.path, "rb") as fh:
            while True:
                data = fh.read(1 << 20)
                if not data:
                    if not inflater.eof:
                        raise NotStreamable("gzip stream cut off")
                    return
                while data:
                    try:
                        out = inflater.decompress(data, WINDOW)
                    except zlib.error:
                        raise NotStreamable("corrupt gzip data") from None
                    data = inflater.unconsumed_tail
                    if inflater.eof:
                        data = inflater.unused_data  # concatenated members
                        if data:
                            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    pos += len(out)
                    if pos > self.max_bytes:
                        raise InputError(self.path, f"gzip inflates to more than {human_size(self.max_bytes)}; refusing "
                                                    "to read it (GPUADVISE_MAX_TRACE_BYTES)")
                    if pos > start:
                        yield out if pos - len(out) >= start else out[start - (pos - len(out)):]


class _Window:
    """A sliding view over the byte stream: `buf` holds bytes [off, off + len(buf)). A mapped file is one
    block, the whole file: nothing is sliced off it, its pages behind the reader are handed back."""

    def __init__(self, blocks, start: int, size: int | None = None, mapped: bool = False):
        self.blocks = blocks
        self.size = size  # the stream's length when known (plain files)
        self.mapped = mapped
        self.released = 0  # a mapped file's pages before this offset were handed back
        self.buf = b""
        self.off = start
        self.eof = False

    @property
    def end(self) -> int:
        return self.off + len(self.buf)

    def more(self) -> bool:
        block = next(self.blocks, None)
        if block is None:
            self.eof = True
            return False
        self.buf = self.buf + block if self.buf else block
        return True

    def drop_before(self, pos: int) -> None:
        if self.mapped:
            upto = pos // _PAGE * _PAGE
            if upto > self.released and hasattr(mmap, "MADV_DONTNEED"):
                # a private mapping's pages read back from the file if touched again (the decoded events'
                # raw fields point into them)
                self.buf.madvise(mmap.MADV_DONTNEED, self.released, upto - self.released)
                self.released = upto
        elif pos > self.off:
            self.buf = self.buf[pos - self.off:]
            self.off = pos

    def framed(self, lo: int, hi: int):
        """Bytes [lo, hi) (whole events) as a JSON array, and what `unframe` needs to undo it. A mapped
        file's separators around them become the brackets in place (no copy); else a framed copy."""
        if self.mapped and lo >= 1 and hi < len(self.buf):
            b = self.buf
            saved = (b[lo - 1], b[hi])
            b[lo - 1], b[hi] = 0x5B, 0x5D  # '[', ']'
            return memoryview(b)[lo - 1: hi + 1], (lo, hi, saved)
        return b"".join((b"[", self.slice(lo, hi), b"]")), None

    def unframe(self, undo) -> None:
        if undo is not None:
            lo, hi, (before, after) = undo
            self.buf[lo - 1], self.buf[hi] = before, after

    def slice(self, lo: int, hi: int) -> memoryview:
        return memoryview(self.buf)[lo - self.off: hi - self.off]

    def find(self, pattern: re.Pattern, pos: int, anchor: bytes | None = None):
        """(start, end) of the first match at or after absolute offset `pos`, reading on as needed; None
        at the end of the stream. `anchor` is the byte every match starts with: a match cut off by the
        end of the buffer can only begin at its last occurrence, so the search resumes there (exact,
        which matters: two processes must agree on where the events are split)."""
        scan = pos
        while True:
            m = pattern.search(self.buf, max(0, scan - self.off))
            if m is not None:
                return m.start() + self.off, m.end() + self.off
            last = self.buf.rfind(anchor, max(0, scan - self.off)) if anchor else -1
            scan = max(scan, self.off + last if last >= 0 else self.end)
            if not self.more():
                return None


# -- finding the events array -----------------------------------------------------------------------


def _array_start(w: _Window) -> tuple[bytes | None, int]:
    """(document prefix before the array, or None for a bare list; offset just after '[')."""
    while len(w.buf) < 4096 and w.more():
        pass
    start = bytes(w.buf[:4096])  # a mapped file's buffer is the whole file
    head = start.lstrip(_SPACE)
    if head[:1] == b"[":
        return None, len(start) - len(head) + 1
    if head[:1] != b"{":
        raise NotStreamable("not a JSON object or list")
    while True:
        m = _EVENTS_KEY.search(w.buf, 0, HEAD_LIMIT)
        if m is not None:
            return bytes(w.buf[: m.end() - 1]), m.end()
        if w.end > HEAD_LIMIT or not w.more():
            raise NotStreamable("no traceEvents key near the start")


def _array_ends(w: _Window, prefix: bytes | None, after: int):
    """At the end of the stream, the candidates (offset of the array's ']', decoded header), last first.
    A candidate ']' follows an event's '}' (log lists after the array end in strings) and the bytes
    after it complete the document that `prefix` began. Re-saved traces may put lists of objects
    (deviceProperties) after the events: the reader tries the next candidate when the last piece of
    events does not parse."""
    from . import events as ev

    tail_start = max(after, w.end - TAIL_RESERVE, w.off)
    tail = bytes(w.slice(tail_start, w.end))
    idx = len(tail)
    for _ in range(4096):
        idx = tail.rfind(b"]", 0, idx)
        if idx < 0:
            return
        j = idx - 1
        while j >= 0 and tail[j] in _SPACE:
            j -= 1
        if j < 0 or tail[j] != 0x7D:  # '}'
            continue
        suffix = tail[idx + 1:]
        if prefix is None:
            if not suffix.strip(_SPACE):
                yield tail_start + idx, ev.Header()
            continue
        try:
            header = ev.HEADER.decode(prefix + b"null" + suffix)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            continue
        yield tail_start + idx, header


# -- chunks ----------------------------------------------------------------------------------------


class _Range:
    """Cuts the events from `start` into sub-arrays up to where the array ends (found at the end of the
    stream) or, for the first of two processes, up to the first `},{` at or after `split`."""

    def __init__(self, w: _Window, start: int, prefix: bytes | None, split: int | None = None):
        self.w, self.start, self.prefix, self.split = w, start, prefix, split
        self.header = None
        self.array_end: int | None = None
        self.reached_end = False  # the last piece ended at the array's end (not at the split)
        self._ends = None

    def _next_end(self) -> int | None:
        """Settle on the next candidate for the array's end (reads to the end of the stream first)."""
        while self.w.more():
            pass
        if self._ends is None:
            self._ends = _array_ends(self.w, self.prefix, self.start)
        self.array_end, self.header = next(self._ends, (None, None))
        return self.array_end

    def _boundary(self, pos: int) -> int | None:
        """Offset just after the '}' of the first `},{` at or after `pos` inside the array, or None."""
        w = self.w
        found = w.find(_BOUNDARY, pos, b"}")
        # A `},{` this close to the end may sit in the header keys after the array: read on to be sure.
        # (A plain file's size is known, so only its last TAIL_RESERVE bytes need that.)
        while (found is not None and not w.eof and w.end < found[0] + TAIL_RESERVE
               and (w.size is None or found[0] >= w.size - TAIL_RESERVE)):
            w.more()
        if w.eof and self._ends is None:
            self._next_end()
        if found is None or (self.array_end is not None and found[0] >= self.array_end):
            return None
        if w.eof and self.array_end is None:
            raise NotStreamable("end of the events array not found")
        return found[0] + 1

    def end(self) -> int:
        if self._ends is None:
            self._next_end()
        if self.array_end is None:
            raise NotStreamable("end of the events array not found")
        return self.array_end

    def chunks(self):
        """Yield sub-arrays; `send(True)` says the last one did not parse (cut inside a string)."""
        w, pos, split = self.w, self.start, self.split
        while True:
            target = pos + WINDOW if split is None else min(pos + WINDOW, split)
            cut = self._boundary(target)
            # the first `},{` at or after the split ends the first process's share
            last = cut is None or (split is not None and cut - 1 >= split)
            if cut is None:
                cut = self.end()
            while True:
                piece, undo = w.framed(pos, cut)
                try:
                    retry = yield piece
                finally:
                    w.unframe(undo)
                if not retry:
                    break
                if last and cut == self.array_end:  # the ']' taken for the end was not: try the one before
                    end = self._next_end()
                    if end is None or end <= pos:
                        raise NotStreamable("an event could not be read")
                    cut = end
                    continue
                # the cut fell inside a string: at least twice as long a piece (names made of `},{`
                # would otherwise cost one retry per boundary)
                nxt = None if last else self._boundary(max(cut + 1, pos + 2 * (cut - pos)))
                if last or (nxt is not None and split is not None and nxt - 1 >= split):
                    raise NotStreamable("an event could not be read")
                cut = self.end() if nxt is None else nxt
                last = nxt is None
            if last:
                self.reached_end = cut == self.array_end
                return
            m = w.find(_OPEN, cut)
            if m is None:
                raise NotStreamable("events array ends early")
            pos = m[0]
            w.drop_before(pos)


_OPEN = re.compile(rb"\{")
_FIRST = re.compile(rb"\{|\]")


# -- the load -------------------------------------------------------------------------------------------


def eligible(path: Path, max_bytes: int) -> "_Source | None":
    """A regular file big enough to stream (plain files over the size limit are left to the careful path,
    which refuses them)."""
    try:
        src = _Source(path, max_bytes)
    except (OSError, NotStreamable):
        return None
    if not src.gz and src.size > max_bytes:
        return None
    return src if src.eligible() else None


def stream_events(src: _Source, make_builder, feed, workers: int, parallel_min: int):
    """Decode every event of `src`: returns (builder, document header). `feed(builder, chunks, share)` is
    the loader's chunk decoder (`share`: 1 or 2 when this process shows progress for the whole file or
    half of it). Raises NotStreamable when the file needs the careful path."""
    w = src.window()
    prefix, lo = _array_start(w)
    first = w.find(_FIRST, lo)
    if first is None or w.buf[first[0] - w.off] != 0x7B:  # '{'
        raise NotStreamable("empty events array")
    start = first[0]
    if workers >= 2 and src.size >= parallel_min and forked.can_fork():
        builder = make_builder()
        split = start + (src.size - start) // 2
        header = _two_processes(src, builder, feed, w, start, prefix, split)
        if header is not None:
            return builder, header
        w = src.window()  # e.g. the split fell inside a string: start over in one process
    builder = make_builder()
    rng = _Range(w, start, prefix)
    feed(builder, rng.chunks(), 1)
    return builder, rng.header


def _two_processes(src, builder, feed, w, start, prefix, split):
    """The parent decodes up to the first `},{` after `split`, a forked worker the rest. Returns the
    header, or None when the split did not work out (the caller redoes it in one process)."""

    def second_half():  # in the worker: from the first boundary after `split` to the end
        cw = src.window(split)
        found = cw.find(_BOUNDARY, split, b"}")
        if found is None:
            return None
        rng = _Range(cw, found[1] - 1, prefix)
        child = type(builder)(builder.meta)
        feed(child, rng.chunks())
        return {"builder": child.export(), "header": rng.header}

    worker = forked.Forked(second_half)
    rng = _Range(w, start, prefix, split=split)
    try:
        feed(builder, rng.chunks(), 2)
    except (msgspec.DecodeError, NotStreamable):
        worker.stop()
        return None
    except BaseException:
        worker.stop()
        raise
    ok, share = worker.result()
    if not ok:
        return None
    if share is None:  # no boundary after the split: the parent must have read to the end
        return rng.header if rng.reached_end else None
    if rng.reached_end:  # the parent read to the end too: the two disagree, do it again
        return None
    builder.merge(share["builder"])
    return share["header"]

"""The events array, cut into ~8 MB sub-arrays at `},{` and fed to the column builder chunk by chunk: read
by the compiled scanner (rows.py), or decoded by msgspec where the scanner declines.

Cutting without parsing first is what keeps memory at one chunk plus the columns. The
cutter, the feeding loop (which asks for a longer chunk when a cut fell inside a string) and the
progress callback are shared by the careful path, the streamed path and both halves of the parallel
split, so they live apart from each of them.
"""

from __future__ import annotations

import re

import msgspec

from . import events as ev
from .columns import Builder
from .repair import decode_leniently, nan_tokens_to_null
from .rows import scan_chunk

CHUNK_EVENTS = 50_000  # raw events per chunk when a salvaged list is fed
CHUNK_BYTES = 8 << 20
BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_OPEN = re.compile(rb"\{")

_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[ev.Event])


class Progress:
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


def feed(b: Builder, chunks, retry: bool, progress: Progress | None = None) -> None:
    """Decode chunk after chunk into the builder; a chunk cut inside a string asks for a longer one."""
    buf = next(chunks, None)
    while buf is not None:
        if progress is not None:
            progress.add(len(buf))
        scanned = scan_chunk(buf)  # the compiled scanner, where built and the chunk is plain; else msgspec
        if scanned is not None:
            b.total += len(scanned)
            b.add_scanned(scanned)
            del scanned
            buf = next(chunks, None)
            continue
        try:
            decoded = decode_chunk(b, buf)
        except msgspec.DecodeError:
            if not retry:
                raise
            buf = chunks.send(True)
            continue
        b.add_chunk(decoded)
        del decoded
        buf = next(chunks, None)


def decode_chunk(b: Builder, buf, repaired: bool = False) -> list:
    try:
        try:
            decoded = _EVENTS.decode(buf)
        except (msgspec.ValidationError, UnicodeDecodeError, RecursionError):
            raws = _RAW_LIST.decode(buf)
            b.total += len(raws)
            return decode_leniently(raws, b)
        b.total += len(decoded)
        return decoded
    except msgspec.DecodeError:
        # NaN tokens or lone surrogates (streamed files skip the whole-document pass that removes them)
        fixed = buf if repaired else nan_tokens_to_null(buf)
        if fixed is buf:
            raise
        return decode_chunk(b, fixed, repaired=True)




def raw_list_chunks(raws: list):
    for start in range(0, len(raws), CHUNK_EVENTS):
        yield b"[" + b",".join(raws[start : start + CHUNK_EVENTS]) + b"]"


def array_chunks(array, lo: int | None = None, hi: int | None = None):
    """Split a JSON array of objects (or its [lo, hi) byte range) into ~8 MB sub-arrays at `},{`
    without parsing it first.

    A cut can only go wrong inside a string that itself contains `},{`; such a piece fails to parse,
    and the caller asks for a longer one (`send(True)`), so the pieces are always exact.
    """
    data = memoryview(array)  # zero-copy: the array stays inside the file's bytes
    if lo is None:
        lo, end = array_interior(data)
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
            m = BOUNDARY.search(data, reach, end) if end - reach > CHUNK_BYTES // 4 else None
            cut = m.start() + 1 if m else end
            retry = yield b"".join((b"[", data[pos:cut], b"]"))
            if not retry or cut == end:
                break
            reach = cut + 1  # the cut fell inside a string: extend to the next boundary
        pos = cut


def array_interior(data: memoryview) -> tuple[int, int]:
    """Offsets just inside the array's brackets."""
    end = data.nbytes
    while end > 0 and bytes(data[end - 1 : end]) in b" \t\r\n":
        end -= 1
    start = 0
    while start < end and bytes(data[start : start + 1]) != b"[":
        start += 1
    return start + 1, end - 1

"""A trace file's bytes: plain or gzip, from a regular file, a pipe or a device, never past a size limit.

Separate from the decoding because it is the only part that touches the file system and the only
guard against inputs too big to hold (a 16 GB file, a gzip bomb); the streaming reader (stream.py)
uses the same limit.
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from gpuadvise.analyzer.errors import InputError, human_size

# Real traces top out at a few GB; a .gz that inflates past this is refused rather than risking the
# user's machine (override with GPUADVISE_MAX_TRACE_BYTES).
MAX_TRACE_BYTES = int(os.environ.get("GPUADVISE_MAX_TRACE_BYTES", 16 * 2**30))


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

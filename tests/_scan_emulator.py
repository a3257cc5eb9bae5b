"""The compiled scanner's output (`_jsonscan.scan`: n, columns, distinct raw texts), made in Python from
msgspec's decode of the same bytes. It lets the column builder's scanned path be checked on machines where
the scanner was not built, against the struct path, on any trace; tests/test_jsonscan.py checks the real
scanner against msgspec itself.
"""

from __future__ import annotations

import msgspec
import numpy as np

from gpuadvise.analyzer.read import events as ev

_EVENTS = msgspec.json.Decoder(list[ev.Event])
NUMERIC = ("correlation", "external_id", "external_id_legacy", "stream", "device", "nbytes", "mem_bytes",
           "total_allocated", "total_reserved", "device_type", "device_id", "addr", "python_id", "python_parent_id",
           "sequence_number", "group_size", "in_nelems", "out_nelems", "comm_seq", "graph_id", "graph_node_id")
ANY = ("call_stack", "collective_name", "pg_name", "pg_desc", "pg_ranks", "dtype", "meta_name", "labels")
RAW = ("input_type", "input_dims", "input_concrete", "comms_id")
_ARG_ATTR = {"meta_name": "name"}


def emulated_scan(buf):
    """What `scan(buf)` returns, or None where it would decline (msgspec fails, or a value the scanner
    leaves to the struct path: a pid that is neither an integer nor a string, a number out of its range)."""
    try:
        events = _EVENTS.decode(buf)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return None
    raws: dict[bytes, int] = {}

    def raw_id(text: bytes) -> int:
        return raws.setdefault(text, len(raws))

    n = len(events)
    cols = {k: np.full(n, -1, np.int32) for k in ("ph", "cat", "name") + ANY + RAW}
    for k in ("pid", "tid"):
        cols[k] = np.zeros(n, np.int64)
        cols[k + "_raw"] = np.full(n, -2, np.int32)
    for k in ("ts", "dur") + NUMERIC:
        cols[k] = np.full(n, np.nan)
    cols["has_args"] = np.zeros(n, np.int8)
    for i, e in enumerate(events):
        cols["ph"][i] = raw_id(msgspec.json.encode(e.ph))
        cols["cat"][i] = raw_id(msgspec.json.encode(e.cat))
        cols["name"][i] = raw_id(msgspec.json.encode(e.name))
        for k in ("pid", "tid"):
            v = getattr(e, k)
            if isinstance(v, int) and not isinstance(v, bool):
                if abs(v) >= 10**18:
                    return None
                cols[k][i], cols[k + "_raw"][i] = v, -1
            elif isinstance(v, str):
                cols[k + "_raw"][i] = raw_id(msgspec.json.encode(v))
        for k in ("ts", "dur"):
            v = getattr(e, k)
            if v is not None:
                cols[k][i] = v
        a = e.args
        if a is None:
            continue
        cols["has_args"][i] = 1
        for k in NUMERIC:
            v = getattr(a, k)
            if v is not None:
                if isinstance(v, int) and abs(v) >= 10**18:
                    return None
                cols[k][i] = float(v)
        for k in ANY:
            v = getattr(a, _ARG_ATTR.get(k, k))
            if v is not None:
                cols[k][i] = raw_id(msgspec.json.encode(v))
        for k in RAW:
            cols[k][i] = raw_id(bytes(getattr(a, k)))
    return n, {k: v.tobytes() for k, v in cols.items()}, list(raws)

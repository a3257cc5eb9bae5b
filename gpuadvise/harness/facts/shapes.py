"""The shapes of the ops whose math the analysis counts, without paying for `record_shapes` on every op
of the recorded window.

`record_shapes=True` makes the profiler collect the shapes, dtypes, strides and scalar values of
every op's inputs, which slows the recorded steps. The analysis only reads them for the matmul,
convolution and attention ops (analyzer/model/flopops.py: their FLOPs and MFU, `matmul-alignment`'s
shapes, `cudnn-benchmark`'s convolutions; the scalars say a convolution's stride and padding and whether
attention was causal). So by default the window is recorded without shapes, and one step *before* it is
recorded by a second, CPU-only profiler with shapes on (the "probe"). When the window is written, each
such op's event in it gets the shape arguments of the probe's op at the same position: the n-th of them
on a thread in a recorded step is matched with the n-th on that thread in the probe. This is only done
for a thread whose recorded ops are exactly the probe's, by name and order, repeated once per recorded
step (a loop whose structure changes between steps gets no shapes, rather than wrong ones).

Both files are only scanned for these events (a regex over the mapped file, then a JSON decode of each
one), so a large trace costs one pass at C speed plus a copy.
"""

from __future__ import annotations

import json
import mmap
import re
from collections import defaultdict

from gpuadvise.analyzer.model.flopops import ATTENTION_CALLS, SIGNATURES

OPS = tuple(SIGNATURES) + ATTENTION_CALLS
SHAPE_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
_NAME = re.compile(rb'"name":\s*"(' + b"|".join(re.escape(o.encode()) for o in OPS) + rb')"')
_DECODER = json.JSONDecoder()


def scan(mm) -> list[tuple[int, int, dict]]:
    """(start, end, event) of each shaped op's cpu_op event (OPS) in a mapped chrome trace, in file order."""
    found = []
    for m in _NAME.finditer(mm):
        start = mm.rfind(b"{", 0, m.start())  # the event's own brace: no key before "name" holds one
        if start < 0:
            continue
        ev, end = _decode_at(mm, start)
        if isinstance(ev, dict) and ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and ev.get("name") in OPS:
            found.append((start, end, ev))
    return found


def _decode_at(mm, start: int, window: int = 1 << 12):  # an event is a few hundred bytes
    while True:
        chunk = mm[start:start + window]
        try:
            text = chunk.decode("utf-8")
            ev, n = _DECODER.raw_decode(text)
            return ev, start + len(text[:n].encode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            if start + window >= len(mm):
                return None, start
            window *= 4


def _by_thread(events) -> dict:
    threads = defaultdict(list)
    for item in events:
        ev = item[-1]
        threads[ev.get("tid")].append(item)
    for items in threads.values():
        items.sort(key=lambda it: float(it[-1].get("ts", 0)))
    return threads


def plan(probe: list, window: list, steps: int) -> tuple[dict, dict]:
    """Which window event (by start offset) gets which shape arguments, and a report for run.json."""
    probe_t, window_t = _by_thread(probe), _by_thread(window)
    chosen: dict[int, dict] = {}
    skipped = []
    for tid, items in window_t.items():
        ref = probe_t.get(tid, [])
        names = [it[-1]["name"] for it in items]
        if not ref or names != [it[-1]["name"] for it in ref] * steps:
            skipped.append(tid)
            continue
        for i, (start, _end, _ev) in enumerate(items):
            args = ref[i % len(ref)][-1].get("args") or {}
            shape_args = {k: args[k] for k in SHAPE_KEYS if k in args}
            if shape_args:
                chosen[start] = shape_args
    total = sum(len(v) for v in window_t.values())
    state = ("no matmuls in the window" if total == 0 else "annotated" if len(chosen) == total
             else "partial: some threads' matmuls differ from the probe step" if chosen
             else "not annotated: the window's matmuls differ from the probe step")
    return chosen, {"state": state, "matmuls": total, "annotated": len(chosen), "probe_matmuls": len(probe)}


def probe_events(path) -> list:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return scan(mm)


def annotate_copy(src_path, dst, probe: list, steps: int) -> dict:
    """Copy the trace at src_path into the binary stream dst, adding the probe's shape arguments to
    the window's matmul events. Returns the report."""
    with open(src_path, "rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return {"state": "empty trace"}
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            window = scan(mm)
            chosen, report = plan(probe, window, steps)
            pos = 0
            for start, end, ev in window:
                if start not in chosen:
                    continue
                _copy(mm, dst, pos, start)
                ev = dict(ev, args=dict(ev.get("args") or {}, **chosen[start]))
                dst.write(json.dumps(ev).encode("utf-8"))
                pos = end
            _copy(mm, dst, pos, len(mm))
    return report


def _copy(mm, dst, a: int, b: int, chunk: int = 1 << 22) -> None:
    while a < b:
        n = min(chunk, b - a)
        dst.write(mm[a:a + n])
        a += n

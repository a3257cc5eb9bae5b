"""Where in the user's code a call came from: the CPU op around it and the innermost user frame of its
stack (legacy `Call stack` strings, or `with_stack` python_function events)."""

from __future__ import annotations

import functools
import os

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model import frames
from gpuadvise.analyzer.model.trace import TraceModel

def attribute(model: TraceModel, calls: pd.DataFrame) -> tuple[list, list]:
    """For each call: the innermost CPU op around it, and the user source line when the trace has one."""
    cpu = model.cpu
    ops, sources = [], []
    if cpu.empty:
        return [""] * len(calls), [""] * len(calls)
    real = ~cpu["is_annotation"].to_numpy(dtype=bool)
    c_tid, c_ts, c_end = (cpu[k].to_numpy() for k in ("tid", "ts", "end"))
    names, stacks = _Strings(cpu["name"]), _Strings(cpu["call_stack"])
    # per thread that has calls: its ops' rows (in the frame's order, which is by start), starts, ends and
    # the longest op, which bounds how far back an op around a call can start
    by_tid = {}
    for tid in pd.unique(calls["tid"].to_numpy()).tolist():
        rows = np.flatnonzero(real & (c_tid == tid))
        if len(rows):
            g_ts, g_end = c_ts[rows], c_end[rows]
            by_tid[tid] = (rows, g_ts, g_end, float(np.max(g_end - g_ts)), bool(np.all(g_ts[1:] >= g_ts[:-1])))
    for ts, end, tid in zip(calls["ts"].to_numpy(), calls["end"].to_numpy(), calls["tid"].to_numpy()):
        g = by_tid.get(tid)
        op, src = "", ""
        if g is not None:
            rows, g_ts, g_end, longest, ordered = g
            # only ops that start at most the longest op's length (and a µs of rounding) before the call can
            # reach its end: the same ops as testing them all
            lo = int(np.searchsorted(g_ts, ts - longest - 1.0, "left")) if ordered else 0
            hi = int(np.searchsorted(g_ts, ts, "right")) if ordered else len(g_ts)
            inside = lo + np.flatnonzero((g_ts[lo:hi] <= ts) & (g_end[lo:hi] >= end))
            if len(inside):
                # innermost = latest start; nested ops often share a start µs, then the shorter one is inner
                # (a stable sort by start, then longest first: ties keep the frame's order)
                nest = inside[np.lexsort((-g_end[inside], g_ts[inside]))]
                op = names[rows[nest[-1]]]
                src = next((x for x in (user_frame_from_stack(stacks[rows[j]]) for j in nest[::-1]) if x), "")
        if not src:
            src = python_source(model, ts, end, tid)
        ops.append(op)
        sources.append(src)
    return ops, sources


class _Strings:
    """A column's values as `str()` writes each (a categorical's category, "nan" for a missing one), made
    only for the rows asked for: `col[j]` is row j's (by position)."""

    def __init__(self, col: pd.Series) -> None:
        if isinstance(col.dtype, pd.CategoricalDtype):
            self._codes = col.cat.codes.to_numpy()
            self._cats = col.cat.categories
        else:
            self._codes, self._cats = None, col.to_numpy()
        self._made: dict[int, str] = {}

    def __getitem__(self, j) -> str:
        code = int(self._codes[j]) if self._codes is not None else int(j)
        text = self._made.get(code)
        if text is None:
            text = self._made[code] = "nan" if code < 0 else str(self._cats[code])
        return text


def user_frame_from_stack(stack: str) -> str:
    """Innermost user frame of a legacy `Call stack` string ("file(line): func;…", innermost first), as
    the stack wrote it; "" when every frame is library code (frames.py judges)."""
    return _user_frame(stack, os.environ.get(frames.ENV, ""))


@functools.lru_cache(maxsize=1 << 14)
def _user_frame(stack: str, configured: str) -> str:
    """user_frame_from_stack, kept per stack (the ops of one line share it) and per configured library
    paths (frames.ENV: what counts as library code)."""
    user = frames.from_stack_string(stack).user
    return user.text if user is not None else ""


def python_source(model: TraceModel, ts: float, end: float, tid: int) -> str:
    """Innermost user python_function frame (with_stack=True) enclosing [ts, end] on thread tid."""
    py = model.python
    if py.empty:
        return ""
    p_ts = py["ts"].to_numpy()
    inside = np.flatnonzero((p_ts <= ts) & (py["end"].to_numpy() >= end))
    p_tid = py["tid"].to_numpy()[inside]
    if tid in set(p_tid.tolist()):
        inside = inside[p_tid == tid]
    # outermost first (the order pandas' sort_values("ts") gives): the last user frame met is the innermost one
    order = inside[np.argsort(p_ts[inside], kind="quicksort")]
    names = _Strings(py["name"])
    user = frames.pick([names[j] for j in order.tolist()], innermost_first=False).user
    return user.text if user is not None else ""

"""Where in the user's code a call came from: the CPU op around it and the innermost user frame of its
stack (legacy `Call stack` strings, or `with_stack` python_function events)."""

from __future__ import annotations

import pandas as pd

from gpuadvise.analyzer.model import frames
from gpuadvise.analyzer.model.trace import TraceModel

def attribute(model: TraceModel, calls: pd.DataFrame) -> tuple[list, list]:
    """For each call: the innermost CPU op around it, and the user source line when the trace has one."""
    cpu = model.cpu
    ops, sources = [], []
    if cpu.empty:
        return [""] * len(calls), [""] * len(calls)
    real = cpu[~cpu["is_annotation"]]
    by_tid = {tid: g for tid, g in real.groupby("tid")}
    for ts, end, tid in zip(calls["ts"].to_numpy(), calls["end"].to_numpy(), calls["tid"].to_numpy()):
        g = by_tid.get(tid)
        op, src = "", ""
        if g is not None:
            inside = g[(g["ts"] <= ts) & (g["end"] >= end)]
            if len(inside):
                # innermost = latest start; nested ops often share a start µs, then the shorter one is inner
                nest = inside.sort_values(["ts", "end"], ascending=[True, False])
                op = str(nest["name"].iloc[-1])
                stacks = [user_frame_from_stack(str(x)) for x in nest["call_stack"].iloc[::-1]]
                src = next((x for x in stacks if x), "")
        if not src:
            src = python_source(model, ts, end, tid)
        ops.append(op)
        sources.append(src)
    return ops, sources


def user_frame_from_stack(stack: str) -> str:
    """Innermost user frame of a legacy `Call stack` string ("file(line): func;…", innermost first), as
    the stack wrote it; "" when every frame is library code (frames.py judges)."""
    user = frames.from_stack_string(stack).user
    return user.text if user is not None else ""


def python_source(model: TraceModel, ts: float, end: float, tid: int) -> str:
    """Innermost user python_function frame (with_stack=True) enclosing [ts, end] on thread tid."""
    py = model.python
    if py.empty:
        return ""
    inside = py[(py["ts"] <= ts) & (py["end"] >= end)]
    if tid in set(inside["tid"]):
        inside = inside[inside["tid"] == tid]
    # outermost first: the last user frame met is the innermost one
    user = frames.pick(inside.sort_values("ts")["name"].astype(str), innermost_first=False).user
    return user.text if user is not None else ""

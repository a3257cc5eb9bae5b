"""One-time costs inside the profiled window: work a job pays once (first-call CUDA module loading,
cuDNN autotuning or compilation on an op's first call, the allocator reserving memory for the first time,
a first step that waits for DataLoader workers to start) and that a steady-state step never sees.

A window that holds them describes the job's start, not its steps: the capture-problem rule reports them
and says how to capture steady state.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.model.calls import ALLOC_CALLS, LAUNCH_CALLS

from . import intervals as iv
from .metrics import Metrics

SLOW_LAUNCH_US = 50_000.0  # a launch call takes microseconds; 50 ms is module loading, not launching
FIRST_CALL_X = 20.0  # an op's first call this many times its later median is a one-time cost
FIRST_CALL_MIN_US = 50_000.0
ALLOCATOR_SHARE = 0.10  # cudaMalloc covering a tenth of the window is the cache being filled
FIRST_STEP_X = 3.0


def one_time_costs(model, metrics: Metrics) -> list[dict]:
    """Each one-time cost found: kind, what (in words), ms, and where (ms from the trace start)."""
    out: list[dict] = []
    rt = model.runtime
    if len(rt):
        slow = rt[rt["name"].isin(LAUNCH_CALLS) & (rt["dur"] >= SLOW_LAUNCH_US)]
        for r in slow.nlargest(3, "dur").itertuples():
            if _waits_for_gpu(metrics, r.ts, r.end):
                continue
            out.append({"kind": "module-loading", "ms": round(r.dur / 1e3, 1), "at_ms": round(r.ts / 1e3, 1),
                        "what": f"one {r.name} took {r.dur / 1e3:.0f} ms (first-call CUDA module loading)"})
        malloc = rt[rt["name"].isin(ALLOC_CALLS)]
        total = float(malloc["dur"].sum())
        if metrics.window_us > 0 and total >= ALLOCATOR_SHARE * metrics.window_us:
            out.append({"kind": "allocator-warm-up", "ms": round(total / 1e3, 1),
                        "at_ms": round(float(malloc["ts"].min()) / 1e3, 1),
                        "what": f"{len(malloc)} cudaMalloc calls took {total / 1e3:.0f} ms "
                                f"({100 * total / metrics.window_us:.0f} % of the window): the allocator filling its cache"})
    out += _slow_first_calls(model, metrics)
    out += _slow_first_step(metrics)
    return out


def _waits_for_gpu(metrics: Metrics, lo: float, hi: float) -> bool:
    """The GPU was busy for most of [lo, hi]: a call that long was waiting for it (a blocking copy or sync),
    not paying a one-time cost of its own."""
    if hi <= lo:
        return False
    span = iv.union([lo], [hi])
    busy = iv.total(*iv.intersect(metrics.gpu_union, span))
    # a blocking call inside it (sync, synchronous memcpy) waits on GPU work the trace may not show
    sy = metrics.syncs
    blocked = iv.total(*iv.intersect(iv.union(sy["ts"], sy["end"]), span)) if len(sy) else 0.0
    return max(busy, blocked) >= 0.5 * (hi - lo)


def _slow_first_calls(model, metrics: Metrics) -> list[dict]:
    """Ops whose first call is far slower than their later ones (cuDNN autotuning, compilation, lazy init)."""
    cpu = model.cpu
    if not len(cpu):
        return []
    top = cpu[cpu["dur"] >= FIRST_CALL_MIN_US]
    found = []
    for name in top["name"].unique():
        calls = cpu[cpu["name"] == name].sort_values("ts")
        if len(calls) < 3:
            continue
        first, later = float(calls["dur"].iloc[0]), float(np.median(calls["dur"].iloc[1:]))
        if first >= FIRST_CALL_MIN_US and first >= FIRST_CALL_X * max(later, 1.0) \
                and not _waits_for_gpu(metrics, float(calls["ts"].iloc[0]), float(calls["end"].iloc[0])):
            found.append({"kind": "first-call", "ms": round(first / 1e3, 1), "at_ms": round(float(calls["ts"].iloc[0]) / 1e3, 1),
                          "what": f"the first {name} took {first / 1e3:.0f} ms, the later ones a median {later / 1e3:.2f} ms "
                                  "(autotuning, compilation or lazy initialisation)"})
    found.sort(key=lambda r: -r["ms"])
    # nested ops repeat the same cost (a module and the convolution inside it): the outermost is enough
    return found[:1]


def _slow_first_step(metrics: Metrics) -> list[dict]:
    ps = metrics.per_step
    if len(metrics.steps) < 3:
        return []
    durs = ps["dur_us"].to_numpy(dtype=float)
    rest = float(np.median(durs[1:]))
    if durs[0] >= FIRST_STEP_X * rest and durs[0] - rest >= 10_000.0:
        return [{"kind": "first-step", "ms": round(durs[0] / 1e3, 1), "at_ms": round(float(ps["start_us"].iloc[0]) / 1e3, 1),
                 "what": f"the first step (#{metrics.steps[0].number}) took {durs[0] / 1e3:.0f} ms, the others a median "
                         f"{rest / 1e3:.0f} ms (e.g. DataLoader workers starting, first-call initialisation)"}]
    return []

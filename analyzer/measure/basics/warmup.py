"""One-time costs inside the profiled window: work a job pays once (first-call CUDA module loading,
cuDNN autotuning or compilation on an op's first call, the allocator reserving memory for the first time,
a first step that waits for DataLoader workers to start, torch.compile compiling and autotuning) and that a
steady-state step never sees.

They are kept out of the step figures (`plan`, applied by `metrics.compute`): a step that holds one is
left out when a step without one remains; when none remains (one step, or no ProfilerStep marks), the
costs' time ranges are cut out of the window figures instead. The warm-up-capture rule reports them and
says how to capture steady state. One cost is often seen several ways (the slow launch, the first op
that contains it, the first step that contains both): each cost keeps its time ranges, nested costs say
which one they sit in, and totals are the union of the ranges, never a sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.calls import ALLOC_CALLS, LAUNCH_CALLS

from . import intervals as iv

SLOW_LAUNCH_US = 50_000.0  # a launch call takes microseconds; 50 ms is module loading, not launching
FIRST_CALL_X = 20.0  # an op's first call this many times its later median is a one-time cost
FIRST_CALL_MIN_US = 50_000.0
ALLOCATOR_SHARE = 0.10  # cudaMalloc covering a tenth of the window is the cache being filled
FIRST_STEP_X = 3.0
# a step whose time is a tenth or more one-time cost describes the start, not the steady state; a
# smaller cost moves its figures less than step-to-step noise does
STEP_SHARE = 0.10


@dataclass
class OneTimeCost:
    kind: str  # "module-loading", "first-call", "allocator-warm-up", "first-step", "compilation"
    label: str  # what it is, short: "one cudaLaunchKernel", "the first aten::conv2d", "step #0"
    what: str  # the sentence the finding quotes
    starts: np.ndarray  # its time ranges (merged, µs on the trace clock)
    ends: np.ndarray
    step: int | None = None  # the ProfilerStep it started in (None: outside every step)
    within: str = ""  # the label of the larger cost it lies inside ("": none)

    @property
    def us(self) -> float:
        return iv.total(self.starts, self.ends)

    def item(self) -> dict:
        """The evidence row: the same keys for every kind."""
        return {"kind": self.kind, "what": self.what, "ms": round(self.us / 1e3, 1),
                "at_ms": round(float(self.starts[0]) / 1e3, 1), "step": self.step, "within": self.within}


@dataclass
class SteadyPlan:
    """How the step figures keep the one-time costs out."""

    costs: list[OneTimeCost] = field(default_factory=list)
    left_out: dict[int, str] = field(default_factory=dict)  # step number → why it was left out
    cut: tuple[np.ndarray, np.ndarray] | None = None  # ranges cut out of the window figures (no steady step)

    @property
    def union(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.costs:
            return np.empty(0), np.empty(0)
        return iv.union(np.concatenate([c.starts for c in self.costs]), np.concatenate([c.ends for c in self.costs]))


def plan(model, metrics, compile_only: bool = False) -> SteadyPlan:
    """The one-time costs of a trace (found on its full metrics) and how to keep them out of the figures:
    leave out the steps they make up a tenth of (and that are slower for it), if a step without one
    remains; else (no steps, or every step holds them) cut their ranges out instead. `compile_only`
    (a trace without a GPU timeline) looks for torch.compile's compiling only."""
    costs = _compilation(metrics) if compile_only else one_time_costs(model, metrics)
    if not costs:
        return SteadyPlan()
    out = SteadyPlan(costs=costs)
    steps = metrics.steps
    spans = out.union
    reasons: dict[int, str] = {}
    for st in steps:
        lo, hi = min(st.start, st.window[0]), max(st.end, st.window[1])
        inside = float(iv.covered(*spans, [lo], [hi])[0])
        others = [o.dur for o in steps if o is not st]
        # and the step is slower for it: a step no slower than the others pays nothing they do not
        excess = st.dur - float(np.median(others)) if others else np.inf
        if st.dur > 0 and inside >= STEP_SHARE * st.dur and excess >= 0.5 * inside:
            reasons[st.number] = _reason(costs, lo, hi, st.dur)
    if steps and len(reasons) < len(steps):
        out.left_out = reasons
    else:  # no steps, or every step holds them: nothing steady to keep, so their time is cut out
        out.cut = spans
    return out


def _reason(costs: list[OneTimeCost], lo: float, hi: float, dur: float) -> str:
    """Why a step is left out: the outermost costs in it that name a cause, and how much of the step they
    take; a slow first step with no cause found is said as such."""
    first = {c.label for c in costs if c.kind == "first-step"}
    here = [c for c in costs if c.kind != "first-step" and float(iv.covered(c.starts, c.ends, [lo], [hi])[0]) > 0]
    named = [c for c in here if not c.within or c.within in first]
    if not named:
        return next(c.what for c in costs if c.kind == "first-step" and float(iv.covered(c.starts, c.ends, [lo], [hi])[0]) > 0)
    s, e = iv.union(np.concatenate([c.starts for c in named]), np.concatenate([c.ends for c in named]))
    inside = float(iv.covered(s, e, [lo], [hi])[0])
    return f"{inside / 1e3:.0f} ms of its {dur / 1e3:.0f} ms are one-time costs: " + "; ".join(c.label for c in named)


def one_time_costs(model, metrics) -> list[OneTimeCost]:
    """Each one-time cost found, largest first, with the costs that lie inside another marked `within`."""
    out: list[OneTimeCost] = []
    rt = model.runtime
    if len(rt):
        slow = rt[rt["name"].isin(LAUNCH_CALLS) & (rt["dur"] >= SLOW_LAUNCH_US)]
        for r in slow.nlargest(3, "dur").itertuples():
            if _waits_for_gpu(metrics, r.ts, r.end):
                continue
            out.append(_cost(metrics, "module-loading", f"one {r.name} ({r.dur / 1e3:.0f} ms)",
                             f"one {r.name} took {r.dur / 1e3:.0f} ms (first-call CUDA module loading)", [r.ts], [r.end]))
        out += _allocator_warm_up(rt, metrics)
    out += _slow_first_calls(model, metrics)
    out += _slow_first_step(metrics)
    out += _compilation(metrics)
    out.sort(key=lambda c: -c.us)
    for i, c in enumerate(out):  # the smallest larger cost holding all of this one's time
        outer = next((o for o in reversed(out[:i]) if float(iv.covered(o.starts, o.ends, c.starts, c.ends).sum()) >= 0.99 * c.us), None)
        if outer is not None:
            c.within = outer.label
    return out


def _cost(metrics, kind: str, label: str, what: str, starts, ends) -> OneTimeCost:
    s, e = iv.union(starts, ends)
    return OneTimeCost(kind, label, what, s, e, step=_step_of(metrics, float(s[0])))


def _step_of(metrics, ts: float) -> int | None:
    return next((st.number for st in metrics.steps if st.start <= ts < st.end), None)


def _allocator_warm_up(rt, metrics) -> list[OneTimeCost]:
    """cudaMalloc filling the cache: a tenth of the window, paid in the first steps only. cudaMalloc time
    that every step pays (the cache emptied each step, fragmentation) is churn, which allocator-churn
    reports: it is no one-time cost and leaving steps out for it would hide it."""
    malloc = rt[rt["name"].isin(ALLOC_CALLS)]
    total = float(malloc["dur"].sum())
    if metrics.window_us <= 0 or total < ALLOCATOR_SHARE * metrics.window_us:
        return []
    s, e = iv.union(malloc["ts"], malloc["end"])
    if len(metrics.steps) >= 2:
        per = np.array([float(iv.covered(s, e, [st.start], [st.end])[0]) for st in metrics.steps])
        durs = np.array([max(st.dur, 1e-9) for st in metrics.steps])
        if float(np.median(per / durs)) >= ALLOCATOR_SHARE:
            return []
    return [_cost(metrics, "allocator-warm-up", f"{len(malloc)} cudaMalloc calls ({total / 1e3:.0f} ms)",
                  f"{len(malloc)} cudaMalloc calls took {total / 1e3:.0f} ms ({100 * total / metrics.window_us:.0f} % "
                  "of the window): the allocator filling its cache", s, e)]


def _waits_for_gpu(metrics, lo: float, hi: float) -> bool:
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


def _slow_first_calls(model, metrics) -> list[OneTimeCost]:
    """Ops whose first call is far slower than their later ones (cuDNN autotuning, compilation, lazy init)."""
    cpu = model.cpu
    if not len(cpu):
        return []
    op = cpu["name"] if isinstance(cpu["name"].dtype, pd.CategoricalDtype) else cpu["name"].astype("category")
    codes, names = op.cat.codes.to_numpy(), op.cat.categories
    c_ts, c_end, c_dur = (cpu[k].to_numpy(dtype=np.float64) for k in ("ts", "end", "dur"))
    long_ones = [c for c in pd.unique(codes[c_dur >= FIRST_CALL_MIN_US]).tolist() if c >= 0]  # first seen first
    # every call of those ops, grouped by op (each group in the frame's order)
    picked = np.flatnonzero(np.isin(codes, long_ones))
    picked = picked[np.argsort(codes[picked], kind="stable")]
    grouped = codes[picked]
    found = []
    for code in long_ones:
        rows = picked[np.searchsorted(grouped, code, "left"):np.searchsorted(grouped, code, "right")]
        if len(rows) < 3:
            continue
        by_start = rows[np.argsort(c_ts[rows], kind="quicksort")]  # as sort_values("ts") orders them
        name = names[code]
        first, later = float(c_dur[by_start[0]]), float(np.median(c_dur[by_start[1:]]))
        ts, end = float(c_ts[by_start[0]]), float(c_end[by_start[0]])
        if first >= FIRST_CALL_MIN_US and first >= FIRST_CALL_X * max(later, 1.0) and not _waits_for_gpu(metrics, ts, end):
            found.append(_cost(metrics, "first-call", f"the first {name} ({first / 1e3:.0f} ms)",
                               f"the first {name} took {first / 1e3:.0f} ms, the later ones a median {later / 1e3:.2f} ms "
                               "(autotuning, compilation or lazy initialisation)", [ts], [end]))
    found.sort(key=lambda c: -c.us)
    # nested ops repeat the same cost (a module and the convolution inside it): the outermost is enough
    return found[:1]


def _compilation(metrics) -> list[OneTimeCost]:
    """torch.compile compiling (and autotuning) inside the window: every compile span (compilework.py),
    one cost. Its syncs and copies wait for the GPU by design (the autotuner times kernels), so no span
    is taken for a wait."""
    work = metrics.compile_work
    if not work:
        return []
    ids = sorted({sp.compile_id for sp in work.spans if sp.compile_id})
    tuning = sum(1 for sp in work.spans if sp.autotuning)
    what = (f"torch.compile compiled for {work.us / 1e3:.0f} ms"
            + (f" ({len(ids)} compile{'s' if len(ids) != 1 else ''}: {', '.join(ids[:6])}{' …' if len(ids) > 6 else ''})"
               if ids else "")
            + (", autotuning included" if tuning else ""))
    return [_cost(metrics, "compilation", f"torch.compile compiling ({work.us / 1e3:.0f} ms)", what,
                  work.starts, work.ends)]


def _slow_first_step(metrics) -> list[OneTimeCost]:
    ps = metrics.per_step
    if len(metrics.steps) < 3:
        return []
    durs = ps["dur_us"].to_numpy(dtype=float)
    rest = float(np.median(durs[1:]))
    if durs[0] >= FIRST_STEP_X * rest and durs[0] - rest >= 10_000.0:
        first = metrics.steps[0]
        lo, hi = first.window
        return [OneTimeCost("first-step", f"step #{first.number} ({durs[0] / 1e3:.0f} ms)",
                            f"the first step (#{first.number}) took {durs[0] / 1e3:.0f} ms, the others a median "
                            f"{rest / 1e3:.0f} ms (e.g. DataLoader workers starting, first-call initialisation)",
                            np.array([lo]), np.array([hi]), step=first.number)]
    return []

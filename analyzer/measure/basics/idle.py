"""What the CPU was doing while the GPU sat idle inside the steps.

"The GPU is idle 60 % of the step" is a symptom; the cause is on the CPU thread that launched the GPU
work which ended each idle gap: that thread was waiting for the DataLoader, blocked in a sync, inside
cudaMalloc/cudaFree, launching, running an op's CPU code, or running Python outside any recorded op.
Each µs of a gap is given to the first of these (in that order) that covers it on that thread; what the
steps' ops cover is named by the outermost op (or annotation) running. All of it is interval arithmetic
on numpy arrays: no loop over events.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import intervals as iv
from . import perstep
from gpuadvise.analyzer.model.calls import ALLOC_CALLS, FREE_CALLS, LAUNCH_CALLS
from .metrics import Metrics
from .steps import step_windows
from .tables import stream_gaps
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in

OUTSIDE_OPS = "Python / CPU work outside any recorded op"
COLUMNS = ["what", "kind", "ms_per_step", "share_of_idle_pct"]


def idle_gaps(metrics: Metrics) -> tuple[np.ndarray, np.ndarray]:
    """The GPU's idle time inside the steps' windows (merged intervals)."""
    lo, hi = step_windows(metrics.steps, metrics.window)
    gaps = iv.subtract(iv.union(lo, hi), metrics.gpu_union)
    cut = metrics.one_time_cut  # one-time costs are not the steps' idle time
    return iv.subtract(gaps, cut) if cut is not None else gaps


IDLE_KINDS = ("host_wait", "kernel_wait", "other")


def idle_split(model: TraceModel, metrics: Metrics) -> dict[str, np.ndarray]:
    """Each step's GPU idle time (`per_step.idle_us`) split by HTA's classes (`stream_gaps`: host wait,
    kernel wait, other), in µs per step in `per_step` row order. HTA sums gaps over streams, which
    overlap; so each step's idle time is shared out in proportion to its streams' gaps of each class."""
    gaps = stream_gaps(model, metrics.launches)
    raw = {k: np.zeros(len(metrics.per_step)) for k in IDLE_KINDS}
    for (_, kind), g in gaps.groupby(["stream", "kind"]):
        raw[kind] = raw[kind] + perstep.covered(metrics, g["ts"], g["end"])
    total = sum(raw.values())
    idle = metrics.per_step["idle_us"].to_numpy(dtype=float)
    return {k: np.where(total > 0, idle * v / np.maximum(total, 1e-9), 0.0) for k, v in raw.items()}


def explain_idle(model: TraceModel, metrics: Metrics, top: int = 8) -> pd.DataFrame:
    """Idle GPU time per cause, largest first: `what` (a name), `kind` (dataloader, sync, allocator,
    launch, op, python), ms per step (the median over the steps, the report's statistic: `perstep`), and
    that time's share of the median step's idle time (the same statistic: a cause that fills one step's
    idle time is not the typical step's)."""
    causes = idle_causes(model, metrics)
    if causes is None:
        return pd.DataFrame(columns=COLUMNS)
    return cause_table(*causes, top=top)


def cause_table(per: dict, idle: np.ndarray, index: int | None = None, top: int = 8) -> pd.DataFrame:
    """`idle_causes`' figures as `explain_idle`'s table: over the median step, or (`index`: a row of
    `per_step`) in that step, each cause's ms and its share of that step's idle time."""
    def value(us: np.ndarray) -> float:
        return perstep.median(us) if index is None else float(us[index])

    out = pd.DataFrame([(w, k, float(us.sum() if index is None else us[index]), value(us)) for (w, k), us in per.items()],
                       columns=["what", "kind", "us", "median_us"])
    out = out[out["us"] > 0].sort_values(["median_us", "us"], ascending=False, ignore_index=True)
    out["ms_per_step"] = (out["median_us"] / 1e3).round(3)
    idle_us = value(idle)
    share = 100 * out["median_us"] / idle_us if idle_us > 0 else 0.0 * out["median_us"]
    out["share_of_idle_pct"] = np.minimum(share, 100.0).round(1)
    return out.head(top)[COLUMNS]


def idle_causes(model: TraceModel, metrics: Metrics) -> tuple[dict, np.ndarray] | None:
    """Each cause's idle GPU time in each step, µs in `per_step` row order, by (what, kind), and each
    step's idle time inside the steps (µs); None when the GPU is never idle or nothing was launched."""
    gaps = idle_gaps(metrics)
    if iv.total(*gaps) <= 0 or metrics.launches.empty:
        return None
    lo, hi = perstep.windows(metrics)
    rows: list[tuple[str, str, np.ndarray]] = []
    for tid, mine in _gaps_by_thread(metrics, gaps).items():
        rows += _explain_thread(model, metrics, tid, mine)
    per: dict[tuple[str, str], np.ndarray] = {}
    for what, kind, us in rows:
        per[(what, kind)] = per.get((what, kind), 0.0) + us
    return per, iv.covered(*gaps, lo, hi)


def _gaps_by_thread(metrics: Metrics, gaps) -> dict:
    """Each gap belongs to the thread that launched the GPU op ending it (the training thread for a gap
    that no launch ends)."""
    gs, ge = gaps
    la = metrics.launches.sort_values("gpu_ts")
    starts = la["gpu_ts"].to_numpy(dtype=float)
    k = np.searchsorted(starts, ge, side="left")  # the first op starting at or after the gap's end
    default = metrics.launch_thread[1] if metrics.launch_thread else -1
    tids = np.where(k < len(la), la["tid"].to_numpy()[np.minimum(k, len(la) - 1)], default)
    return {int(t): (gs[tids == t], ge[tids == t]) for t in np.unique(tids)}


def _explain_thread(model: TraceModel, metrics: Metrics, tid: int, gaps) -> list[tuple[str, str, np.ndarray]]:
    """(what, kind, µs of idle time it covers in each step) for one thread's gaps."""
    rows = []
    left = gaps
    lo, hi = perstep.windows(metrics)

    def take(what: str, kind: str, s, e) -> None:
        nonlocal left
        u = iv.union(s, e)
        got = iv.covered(*iv.intersect(left, u), lo, hi)
        if got.sum() > 0:
            rows.append((what, kind, got))
            left = iv.subtract(left, u)

    dl = metrics.dataloader
    dl = dl[dl["tid"] == tid] if len(dl) else dl
    if len(dl):
        take("DataLoader wait (next batch)", "dataloader", dl["ts"], dl["end"])
    syncs = metrics.syncs
    if len(syncs):
        syncs = syncs[(syncs["tid"] == tid) & ~syncs["profiler_sync"]]
        for (name, op), g in syncs.groupby(["name", "op"]):
            take(f"{name}" + (f" in {op}" if op else ""), "sync", g["ts"], g["end"])
    rt = model.runtime
    rt = rt[rt["tid"] == tid] if len(rt) else rt
    if len(rt):
        alloc = rt[names_in(rt["name"], set(ALLOC_CALLS) | set(FREE_CALLS))]
        take("cudaMalloc / cudaFree", "allocator", alloc["ts"], alloc["end"])
        launch = rt[names_in(rt["name"], LAUNCH_CALLS)]
        take("kernel launch calls", "launch", launch["ts"], launch["end"])
    rows += _outermost_ops(model, metrics, tid, left)
    rest = iv.covered(*iv.subtract(left, _ops_union(model, tid)), lo, hi)
    if rest.sum() > 0:
        rows.append((OUTSIDE_OPS, "python", rest))
    return rows


def _cpu_on(model: TraceModel, tid: int) -> pd.DataFrame:
    cpu = model.cpu
    if cpu.empty:
        return cpu
    cpu = cpu[cpu["tid"] == tid]
    return cpu[~name_mask(cpu["name"], lambda n: n.startswith("ProfilerStep#"))]


def _ops_union(model: TraceModel, tid: int):
    ops = _cpu_on(model, tid)
    return iv.union(ops["ts"], ops["end"]) if len(ops) else (np.empty(0), np.empty(0))


def _outermost_ops(model: TraceModel, metrics: Metrics, tid: int, left) -> list[tuple[str, str, np.ndarray]]:
    """Time of `left` covered by each outermost op on the thread, per step (an op counts in the step it
    starts in; ops nest: the outermost one names the work; a running maximum of ends finds them without
    walking the tree)."""
    ops = _cpu_on(model, tid)
    if ops.empty or not len(left[0]):
        return []
    ops = ops.sort_values(["ts", "end"], ascending=[True, False], kind="stable")
    ts, end = ops["ts"].to_numpy(dtype=float), ops["end"].to_numpy(dtype=float)
    reach = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    top = ts >= reach
    got = iv.covered(*left, ts[top], end[top])
    names = ops["name"].astype(str).to_numpy()[top]
    lo, hi = perstep.windows(metrics)
    starts = np.clip(ts[top], lo[0], np.nextafter(hi[-1], -np.inf))  # an op begun before the first step counts in it
    out = []
    for n in np.unique(names[got > 0]):
        mine = names == n
        out.append((str(n), "op", perstep.sums(metrics, starts[mine], got[mine])))
    return out

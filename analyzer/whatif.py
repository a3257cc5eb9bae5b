"""Predict what a fix would save: replay the steps as a dependency graph and take its critical path.

The graph (a networkx DAG, in the spirit of HTA's critical-path analysis) has, per CPU thread, a chain
of the runtime calls that talk to the GPU (launches, copies, syncs) joined by the CPU time between
them; each GPU op hangs off the call that launched it and follows the previous op on its stream; a
call that blocks (a sync, a blocking copy) cannot finish before the GPU op it waited for. The longest
path through the graph is the simulated window time. A `Scenario` edits the weights the way a fix would
(CPU time of the input pipeline removed, syncs gone, kernels faster, ...) and the saving is
1 − T(scenario) / T(baseline). Work that overlapped something else does not come back, which is exactly
what a share-of-time estimate gets wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import networkx as nx
import numpy as np
import pandas as pd

from . import intervals as iv
from .metrics import COPY_CALLS, LAUNCH_CALLS, SYNC_CALLS, Metrics
from .model import TraceModel

NODE_BUDGET = 60_000  # nodes in the replay graph; longer windows are cut to their middle steps
WAKE_US = 5.0  # a blocked call returns about this long after the GPU op it waited for


@dataclass
class Scenario:
    """How a fix changes the steps. Every field defaults to 'no change'."""

    name: str
    cpu_removed: tuple[np.ndarray, np.ndarray] | None = None  # CPU intervals that disappear
    cpu_scale: float = 1.0  # multiplies CPU time between GPU calls (and launch cost)
    unblock: Callable[[pd.DataFrame], np.ndarray] | None = None  # calls (rows of `calls`) that stop blocking
    gpu_scale: Callable[[pd.DataFrame], np.ndarray] | None = None  # per GPU op duration factor


@dataclass
class Replay:
    graph: nx.DiGraph
    calls: pd.DataFrame
    ops: pd.DataFrame
    window: tuple[float, float]
    steps: int
    baseline_us: float
    actual_us: float
    _cache: dict = field(default_factory=dict)

    def simulate(self, scenario: Scenario) -> float:
        _apply(self, scenario)
        return float(nx.dag_longest_path_length(self.graph, weight="w"))

    def saving_pct(self, scenario: Scenario) -> float:
        if self.baseline_us <= 0:
            return 0.0
        t = self.simulate(scenario)
        return max(0.0, 100.0 * (1.0 - t / self.baseline_us))


def build(model: TraceModel, metrics: Metrics) -> Replay | None:
    window, nsteps = _choose_window(model, metrics)
    if window is None:
        return None
    ws, we = window
    rt = model.runtime
    names = rt["name"].astype(str)
    talk = names.isin(LAUNCH_CALLS | COPY_CALLS | SYNC_CALLS.keys())
    calls = rt[talk & (rt["ts"] >= ws) & (rt["ts"] < we)].copy()
    calls["name"] = names[calls.index]
    calls = calls.sort_values(["tid", "ts"], ignore_index=True)
    calls["blocking"] = calls["name"].isin(SYNC_CALLS.keys())
    gpu = model.gpu
    launched = gpu["correlation"].isin(calls["correlation"]) & (gpu["correlation"] >= 0)
    spill_in = (gpu["ts"] >= ws) & (gpu["ts"] < we) & ~launched
    ops = gpu[launched | spill_in].sort_values("ts", ignore_index=True)
    # pageable device→host copies through cudaMemcpyAsync block the CPU too
    pageable_dtoh = ops["name"].astype(str).str.contains("-> Pageable", regex=False)
    calls.loc[calls["correlation"].isin(ops.loc[pageable_dtoh, "correlation"]), "blocking"] = True

    g = nx.DiGraph()
    g.add_node("S")
    g.add_node("E")
    delays = np.clip(np.nan_to_num(metrics.launches["delay_us"].to_numpy(), nan=5.0), 0, None)
    latency = float(np.clip(np.percentile(delays, 5), 1.0, 20.0)) if delays.size else 5.0

    # CPU chains, one per thread
    for tid, c in calls.groupby("tid", sort=False):
        prev_end, prev_node = ws, "S"
        for i, ts, end in zip(c.index, c["ts"].to_numpy(), c["end"].to_numpy()):
            g.add_edge(prev_node, ("c", i), base=max(0.0, ts - prev_end), gap=(prev_end, ts), kind="cpu")
            g.add_edge(("c", i), ("d", i), base=float(end - ts), kind="call", call=i)
            prev_end, prev_node = end, ("d", i)
        g.add_edge(prev_node, "E", base=max(0.0, we - prev_end), gap=(prev_end, we), kind="cpu")

    # GPU ops: launched by a call, ordered on their stream
    call_of = dict(zip(calls["correlation"], calls.index))
    for stream, o in ops.groupby("stream", sort=False):
        prev = None
        for k, ts, dur, corr in zip(o.index, o["ts"].to_numpy(), o["dur"].to_numpy(), o["correlation"].to_numpy()):
            i = call_of.get(corr)
            if i is not None:
                g.add_edge(("d", i), ("gs", k), base=latency, kind="launch")
            else:  # launched before the window (or by a graph): keep its real start as a floor
                g.add_edge("S", ("gs", k), base=max(0.0, ts - ws), kind="anchor")
            g.add_edge(("gs", k), ("ge", k), base=float(dur), kind="gpu", op=k)
            if prev is not None:
                g.add_edge(("ge", prev), ("gs", k), base=0.0, kind="stream")
            prev = k
        g.add_edge(("ge", prev), "E", base=0.0, kind="drain")

    # Blocking calls wait for the GPU op that finished just before they returned.
    if len(ops):
        order = np.argsort(ops["end"].to_numpy(), kind="stable")
        ends_sorted = ops["end"].to_numpy()[order]
        blocking = calls[calls["blocking"]]
        for i, ts, end in zip(blocking.index, blocking["ts"].to_numpy(), blocking["end"].to_numpy()):
            j = np.searchsorted(ends_sorted, end + 1.0, side="right") - 1
            if j < 0 or ends_sorted[j] <= ts:
                continue  # the GPU was already idle: the call did not wait
            k = int(order[j])
            g.add_edge(("ge", k), ("d", i), base=min(WAKE_US, max(0.0, end - ends_sorted[j])), kind="wait", call=i)
            # the call's own CPU cost is what is left once the wait is taken out
            g.edges[("c", i), ("d", i)]["base"] = min(float(end - ts), WAKE_US)

    replay = Replay(graph=g, calls=calls, ops=ops, window=(ws, we), steps=nsteps, baseline_us=0.0, actual_us=we - ws)
    replay.baseline_us = replay.simulate(Scenario("baseline"))
    return replay


def _choose_window(model: TraceModel, metrics: Metrics):
    steps = metrics.steps
    budget_calls = NODE_BUDGET // 4
    rt_ts = np.sort(model.runtime["ts"].to_numpy()) if len(model.runtime) else np.empty(0)
    if rt_ts.size == 0:
        return None, 0
    if not steps:
        ws, we = metrics.window
        # no steps: cut to a window holding at most the budget of runtime calls
        lo = np.searchsorted(rt_ts, ws)
        hi = np.searchsorted(rt_ts, we)
        if hi - lo > budget_calls:
            mid = (lo + hi) // 2
            ws = rt_ts[max(lo, mid - budget_calls // 2)]
            we = rt_ts[min(hi - 1, mid + budget_calls // 2)]
        return (ws, we), 0
    counts = np.searchsorted(rt_ts, [s.end for s in steps]) - np.searchsorted(rt_ts, [s.start for s in steps])
    # grow a contiguous run of steps around the median one while it fits the budget
    mid = len(steps) // 2
    lo, hi, total = mid, mid, counts[mid]
    while True:
        grown = False
        if hi + 1 < len(steps) and total + counts[hi + 1] <= budget_calls:
            hi += 1
            total += counts[hi]
            grown = True
        if lo - 1 >= 0 and total + counts[lo - 1] <= budget_calls:
            lo -= 1
            total += counts[lo]
            grown = True
        if not grown:
            break
    return (steps[lo].start, steps[hi].end), hi - lo + 1


def _apply(replay: Replay, s: Scenario) -> None:
    g, calls, ops = replay.graph, replay.calls, replay.ops
    unblocked = set(calls.index[s.unblock(calls)]) if s.unblock is not None else set()
    scale = s.gpu_scale(ops) if s.gpu_scale is not None else None
    removed = s.cpu_removed
    for _, _, d in g.edges(data=True):
        w = d["base"]
        kind = d["kind"]
        if kind == "cpu":
            if removed is not None and w > 0:
                a, b = d["gap"]
                w = max(0.0, w - float(iv.covered(removed[0], removed[1], a, b)[0]))
            w *= s.cpu_scale
        elif kind == "call":
            if d["call"] in unblocked:
                w = min(w, WAKE_US)
            w *= s.cpu_scale if s.cpu_scale < 1 else 1.0
        elif kind == "wait" and d["call"] in unblocked:
            w = -1.0  # marked below as removed
        elif kind == "gpu" and scale is not None:
            w = w * float(scale[d["op"]])
        d["w"] = w
    # a removed wait must not constrain the path: give it a weight that never wins
    for u, v, d in g.edges(data=True):
        if d["w"] < 0:
            d["w"] = -1e18

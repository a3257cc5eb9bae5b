"""Predict what a fix would save: replay the steps as a dependency graph and take its critical path.

The graph (a DAG, dag.py, in the spirit of HTA's critical-path analysis) has, per CPU thread, a chain
of the runtime calls that talk to the GPU (launches, copies, syncs) joined by the CPU time between
them; each GPU op hangs off the call that launched it and follows the previous op on its stream; a
call that blocks (a sync, a blocking copy) cannot finish before the GPU op it waited for. The longest
path through the graph is the simulated window time. A `Scenario` edits the weights the way a fix would
(CPU time of the input pipeline removed, syncs gone, kernels faster, ...) and the saving is
1 − T(scenario) / T(baseline). Work that overlapped something else does not come back, which is exactly
what a share-of-time estimate gets wrong.

This module is what rules call: `Scenario` (how a fix edits the replay), `Replay` (simulate a scenario,
its saving against the baseline) and `baseline_of`. replay_graph.py builds the graph from a trace and
says what it models (the backlog left out, device-wide syncs, unexplained waits, allocator syncs, a full
launch queue).
"""

from __future__ import annotations

import hashlib
import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from ..basics import intervals as iv
from .dag import KINDS, Graph

try:  # the compiled longest path (replay_loops.c); the Python loop below where it was not built
    from ._replay_loops import longest_path as _compiled_longest_path
except ImportError:  # pragma: no cover - depends on the install having had a C compiler
    _compiled_longest_path = None

WAKE_US = 5.0  # a blocked call returns about this long after the GPU op it waited for


@dataclass
class Scenario:
    """How a fix changes the steps. Every field defaults to 'no change'.

    Intervals are (starts, ends) arrays in µs on the trace clock (`intervals.union` of spans). The
    callables receive one of the replay's frames and return a numpy array with one value per row, in
    row order: `unscaled`, `unblock` and `remove` get `Replay.calls` (the runtime calls that talk to the
    GPU: `model.runtime`'s columns plus `blocking`) and return bools; `gpu_scale` and `gpu_time` get
    `Replay.ops` (the GPU ops: `model.gpu`'s columns plus `prev_end_traced`) and return floats.
    docs/rule-api.md lists both frames' columns.
    """

    name: str
    cpu_removed: tuple[np.ndarray, np.ndarray] | None = None  # CPU intervals that disappear
    cpu_shrink: tuple[tuple[np.ndarray, np.ndarray], float] | None = None  # (intervals, factor): CPU time there × factor
    cpu_scale: float = 1.0  # multiplies CPU time between GPU calls (and launch cost, not a driver stall)
    # (sorted start times of recorded events, µs): each CPU gap loses that much per event starting in it, in
    # proportion to what the other edits left of it, and each call its own share (the profiler's per-op cost,
    # calibration.py)
    cpu_per_event: tuple[np.ndarray, float] | None = None
    unscaled: Callable[[pd.DataFrame], np.ndarray] | None = None  # calls whose own cost cpu_scale leaves alone (driver time)
    unblock: Callable[[pd.DataFrame], np.ndarray] | None = None  # calls (rows of `calls`) that stop blocking
    remove: Callable[[pd.DataFrame], np.ndarray] | None = None  # calls that disappear (no CPU cost, no wait)
    gpu_scale: Callable[[pd.DataFrame], np.ndarray] | None = None  # per GPU op duration factor
    gpu_time: Callable[[pd.DataFrame], np.ndarray] | None = None  # per GPU op new duration in µs (NaN: as is), overrides gpu_scale
    # cudaMalloc after a cudaFree waits for the device like cudaFree, and both do their driver work after
    # the drain (module docstring). Compare only with a baseline replayed the same way (`baseline_of`).
    alloc_syncs: bool = False
    # × the GPU ops' waits for what the trace does not show (replay_graph: a queued op that started late with
    # nothing on this GPU to wait for, such as another rank's signal): 0 removes them (every rank of an SPMD
    # job fixed alike, host-sync)
    unseen_scale: float = 1.0


def baseline_of(scenario: Scenario) -> Scenario:
    """The no-change scenario replayed the way `scenario` is (its mode switches): what its saving is taken
    against."""
    return Scenario(name="baseline", alloc_syncs=scenario.alloc_syncs)


@dataclass
class Replay:
    graph: Graph
    calls: pd.DataFrame
    ops: pd.DataFrame
    window: tuple[float, float]
    steps: int
    baseline_us: float
    actual_us: float  # the window's steps on the GPU timeline (sum of Step.dur), or its span without steps
    _edges: dict = field(default_factory=dict)
    # per call (row of `calls`): µs of a stall inside it beyond its name's usual cost (driver work such as
    # lazy module loading on a first launch), which cheaper launches or a lighter profiler do not shrink
    _stall_us: np.ndarray | None = None
    _simulated: dict = field(default_factory=dict)  # digest of a scenario's edge weights → its window time
    # what a scenario's callables gave on this replay's frames, by callable (a weak reference to it beside
    # its answer: holding the callable would tie the replay to the rule's closure, and through it to the
    # Analysis that holds this replay, a cycle only the collector frees), and the recorded events in each
    # CPU gap, by start array
    _answers: dict = field(default_factory=dict)
    _events_in_gaps: dict = field(default_factory=dict)

    def of_calls(self, fn) -> np.ndarray:
        """`fn(self.calls)` as a bool array, computed once per callable: a prediction replays the same
        scenario several times (its baseline, calibrated, with the collectives at their transfer time)."""
        return self._answer(fn, self.calls, bool)

    def of_ops(self, fn) -> np.ndarray:
        """`fn(self.ops)` as a float array, computed once per callable (`of_calls`)."""
        return self._answer(fn, self.ops, np.float64)

    def _answer(self, fn, frame: pd.DataFrame, dtype) -> np.ndarray:
        key = (id(fn), dtype)
        hit = self._answers.get(key)
        if hit is not None and hit[0]() is fn:  # the same callable, alive: not another one at its old id
            return hit[1]
        answer = np.asarray(fn(frame), dtype=dtype)
        try:
            self._answers[key] = (weakref.ref(fn), answer)
        except TypeError:  # a callable that takes no weak reference: asked again each time
            pass
        return answer

    def events_in_gaps(self, starts: np.ndarray) -> np.ndarray:
        """Per CPU edge, how many of the sorted event `starts` fall in its gap (a calibration's events: the
        same array for every scenario replayed on it)."""
        hit = self._events_in_gaps.get(id(starts))
        if hit is None or hit[0] is not starts:
            e = self._edges
            cpu = e["is"]["cpu"]
            n = np.searchsorted(starts, e["gap_b"][cpu], "right") - np.searchsorted(starts, e["gap_a"][cpu], "right")
            hit = self._events_in_gaps[id(starts)] = (starts, n)
        return hit[1]

    def compile(self, order: np.ndarray, start: int, end: int) -> None:
        """Freeze the graph into edge arrays, by source node in topological order (`order`, dag.py), with
        what simulate needs once per replay rather than once per scenario."""
        g = self.graph.edges()
        pos = np.empty(self.graph.nodes, dtype=np.int64)
        pos[order] = np.arange(len(order))
        by = np.argsort(pos[g["src"]], kind="stable")
        e = self._edges
        e["n"] = self.graph.nodes
        e["src"], e["dst"] = (np.ascontiguousarray(g[k][by], np.int64) for k in ("src", "dst"))
        codes = g["kind"][by]
        e["kind"] = np.array(KINDS, dtype=object)[codes]
        e["is"] = {k: codes == i for i, k in enumerate(KINDS)}  # per kind, which edges are of it
        e["base"] = g["base"][by].copy()
        e["call"], e["op"] = g["call"][by], g["op"][by]
        e["call_row"] = self.calls.index.get_indexer(e["call"])  # the row of `calls` each edge's call is (-1: none)
        # a call's own cost with allocator syncs on (its driver work after a drain the trace shows)
        e["synced"] = np.where(g["has_synced"][by], g["synced"][by], e["base"])
        e["unseen"] = g["unseen"][by]
        e["gap_a"], e["gap_b"] = g["gap_a"][by], g["gap_b"][by]
        e["end"], e["start"] = end, start

    def simulate(self, scenario: Scenario) -> float:
        """The window's time under `scenario`: the longest path through the graph with the scenario's edge
        weights. Rules ask for the same weights more than once (a baseline, a calibration's, a fix with the
        collectives at their transfer time): each set of weights is replayed once."""
        e = self._edges
        w = _weights(self, scenario)
        key = hashlib.blake2b(w.tobytes(), digest_size=20).digest()
        t = self._simulated.get(key)
        if t is None:
            t = self._simulated[key] = longest_path(e, w)
        return t

    @property
    def unseen_us(self) -> float:
        """The replayed GPU ops' waits for what the trace does not show, µs in the window (replay_graph)."""
        return float(self._edges["unseen"].sum()) if "unseen" in self._edges else 0.0

    def baseline_for(self, scenario: Scenario) -> float:
        """The baseline replayed in `scenario`'s mode (`baseline_us` for the default one)."""
        base = baseline_of(scenario)
        return self.baseline_us if base == baseline_of(Scenario("")) else self.simulate(base)

    def saving_pct(self, scenario: Scenario) -> float:
        base = self.baseline_for(scenario)
        if base <= 0:
            return 0.0
        t = self.simulate(scenario)
        return max(0.0, 100.0 * (1.0 - t / base))


def longest_path(e: dict, w: np.ndarray) -> float:
    """The window's time with edge weights `w`: compiled where built, else the Python loop (the same
    double additions and comparisons in the same order, so the same answer to the bit)."""
    if _compiled_longest_path is not None:
        return _compiled_longest_path(e["n"], e["start"], e["end"], e["src"], e["dst"], np.ascontiguousarray(w, np.float64))
    if "path" not in e:  # (source, target) per edge, built once per replay
        e["path"] = list(zip(e["src"].tolist(), e["dst"].tolist()))
    return _longest_path(e["n"], e["start"], e["end"], e["path"], w)


def _longest_path(n: int, start: int, end: int, path: list, w: np.ndarray) -> float:
    """The longest path from node `start` to node `end` (0 at least), the edges in topological order of
    their sources: each node's time is final before its first outgoing edge is relaxed."""
    dl = [-np.inf] * n
    dl[start] = 0.0
    for (u, v), wt in zip(path, w.tolist()):
        cand = dl[u] + wt
        if cand > dl[v]:
            dl[v] = cand
    return float(max(dl[end], 0.0))


def _of_calls(e: dict, mask: np.ndarray) -> np.ndarray:
    """Per edge, whether it belongs to a call (a row of `calls`) that `mask` picks."""
    row = e["call_row"]
    return np.where(row >= 0, mask[np.maximum(row, 0)], False) if len(mask) else np.zeros(len(row), dtype=bool)


def _weights(replay: Replay, s: Scenario) -> np.ndarray:
    """Edge weights under a scenario, all edges at once."""
    e = replay._edges
    is_, w = e["is"], e["base"].copy()
    cpu, call, wait, gpu = is_["cpu"], is_["call"], is_["wait"], is_["gpu"]
    drain = is_["alloc_wait"]
    if s.alloc_syncs:
        w[call] = e["synced"][call]
    else:
        w[drain] = -np.inf
    if s.cpu_removed is not None and len(s.cpu_removed[0]):
        removed = iv.covered(s.cpu_removed[0], s.cpu_removed[1], e["gap_a"][cpu], e["gap_b"][cpu])
        w[cpu] = np.maximum(0.0, w[cpu] - removed)
    if s.cpu_shrink is not None and len(s.cpu_shrink[0][0]):
        (lo, hi), factor = s.cpu_shrink
        inside = iv.covered(lo, hi, e["gap_a"][cpu], e["gap_b"][cpu])
        w[cpu] = np.maximum(0.0, w[cpu] - inside * (1.0 - factor))
    if s.cpu_per_event is not None and s.cpu_per_event[1] > 0:
        # the profiler's share of each gap, spread evenly through it: what a scenario removed or shrank loses
        # its share too, so the edits above act on the unprofiled time
        starts, us = s.cpu_per_event
        n = replay.events_in_gaps(starts)
        traced = e["base"][cpu]
        w[cpu] *= np.where(traced > 0, np.clip(1.0 - us * n / np.where(traced > 0, traced, 1.0), 0.0, 1.0), 1.0)
        w[call] = np.maximum(0.0, w[call] - us)  # each runtime call the replay keeps is a recorded event too
        if s.alloc_syncs:  # and so is an allocator call whose driver work follows a drain
            w[drain] = np.maximum(0.0, w[drain] - us)
    w[cpu] *= s.cpu_scale
    if s.cpu_scale < 1:  # cheaper launches: the calls' own CPU cost shrinks too
        scaled = call.copy()
        if s.unscaled is not None:
            keep = replay.of_calls(s.unscaled)
            scaled &= ~_of_calls(e, keep)
        stall = np.zeros(len(w))
        if replay._stall_us is not None:  # indexed at the calls only: a trace may have none to index
            stall[call] = replay._stall_us[e["call"][call]]
        stall = np.minimum(stall, w)  # the call's own cost once any wait is taken out
        w[scaled] = (w[scaled] - stall[scaled]) * s.cpu_scale + stall[scaled]
    if s.unblock is not None:
        mask = replay.of_calls(s.unblock)
        freed = _of_calls(e, mask)
        w[call & freed] = np.minimum(w[call & freed], WAKE_US)
        w[(wait | drain) & freed] = -np.inf  # the call no longer waits for the GPU
    if s.remove is not None:
        mask = replay.of_calls(s.remove)
        gone = _of_calls(e, mask)
        w[call & gone] = 0.0
        w[(wait | drain) & gone] = -np.inf
    if s.unseen_scale != 1.0 and "unseen" in e:
        held = e["unseen"] > 0
        w[held] = np.maximum(0.0, w[held] - e["unseen"][held] * (1.0 - s.unseen_scale))
        w[is_["unseen_dep"]] = 0.0  # the op still follows the work launched before it (replay_graph)
    if s.gpu_scale is not None:
        factor = replay.of_ops(s.gpu_scale)
        w[gpu] *= factor[e["op"][gpu]]
    if s.gpu_time is not None:
        new = replay.of_ops(s.gpu_time)
        w[gpu] = np.where(np.isfinite(new[e["op"][gpu]]), new[e["op"][gpu]], w[gpu])
    return w

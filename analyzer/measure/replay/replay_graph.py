"""The replay graph (whatif.py says what it is for): which calls and GPU ops of a trace become nodes,
and which waits between them become edges.

The replay covers the GPU work the chosen steps launched, wherever the GPU got to it, and nothing that
earlier steps left queued: when the CPU runs ahead, the GPU works through a backlog at the start of the
window, and a replay that kept it would count earlier steps' work as this window's (and a fix could not
shorten it). The baseline is then the steady-state time of the steps, which `actual_us` (their time on
the GPU timeline, metrics.Step.dur) measures in the trace.

Device-wide syncs (cudaDeviceSynchronize, and cudaFree, which synchronises the device before it
returns memory) wait for every GPU op launched before them, even when the trace shows the GPU idle by
then: under a faster CPU (a fix, or a profiler that no longer slows it) that wait is what serialises the
steps.

A GPU op that started later than its launch, its stream and every op it could have waited for allow
waited for something the trace does not show (kernels the profiler missed, such as CUDA-graph nodes,
or another rank's signal). That wait keeps its length, after whatever the op follows in the replay, and
never its clock time: a fixed start would carry the trace's lag into the window (the backlog is left
out, so the window's work starts earlier) and push the GPU work its last step launched as late as it ran
in the trace, behind the next step's CPU work. An op that waited, through an event, for the backlog is
explained by it, like an op behind the backlog on its own stream.

Allocator syncs (`Scenario.alloc_syncs`, off by default; allocator-churn turns it on for its baseline, its
calibration and its fix alike). A device memory allocation is an implicit synchronization (CUDA
programming guide): once the allocator has handed memory back (a cudaFree earlier in the trace, or in
the replayed steps, as `empty_cache()` does every step: the first replayed step's mallocs follow the
previous step's release) each cudaMalloc maps new memory and waits for the device like cudaFree.
With the switch on, such a cudaMalloc waits for every GPU op launched before it, and a cudaMalloc or
cudaFree does its own driver work (its traced time after the drain, or all of it where the trace shows
no drain) after that wait. Under the profiler the slowed CPU reaches these calls after the GPU has
drained, so the trace shows them as CPU time; the wait binds once the CPU is faster. Other rules replay
cudaMalloc as CPU time: a trace that mixes cuDNN workspace mallocs with frees outside any churn keeps its
baseline.

A full launch queue is a wait, not CPU work. CUDA holds only so many pending ops per context; once the
GPU is that far behind, `cudaLaunchKernel`, `cudaMemsetAsync` and `cudaMemcpyAsync` block until an op
finishes and frees a slot. Such a call (far above its name's usual cost in the window, returning just
after a GPU op launched before it ended) is replayed as its usual CPU cost plus a wait on that op, like
a sync: a scenario that makes the GPU faster then frees the CPU too, instead of leaving a GPU-bound loop
looking CPU-bound.

"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..basics import intervals as iv
from .dag import Cyclic, Graph
from gpuadvise.analyzer.model.calls import (ALLOC_CALLS, COPY_CALLS, DEVICE_SYNCS, FREE_CALLS, LAUNCH_CALLS, QUEUEING_CALLS,
                                            SYNC_CALLS)
from ..basics.metrics import Metrics
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in
from .whatif import WAKE_US, Replay, Scenario

DEVICE_WIDE = set(DEVICE_SYNCS) | set(FREE_CALLS)  # calls that wait for all GPU work launched before them
NODE_BUDGET = 60_000  # nodes in the replay graph; longer windows are cut to their middle steps


# A launch that took this many times its usual cost, and at least QUEUE_MIN_US more, waited for a slot
QUEUE_X = 5.0
QUEUE_MIN_US = 50.0


class _Nodes:
    """The replay graph's node numbers: S and E (the window's start and end), per call its start c(i) and
    end d(i), per GPU op its start gs(k) and end ge(k), per allocator call the end of its drain dw(i)."""

    S, E = 0, 1

    def __init__(self, calls: int, ops: int) -> None:
        self._c, self._d = 2, 2 + calls
        self._gs, self._ge = 2 + 2 * calls, 2 + 2 * calls + ops
        self._dw = 2 + 2 * calls + 2 * ops
        self.count = 2 + 3 * calls + 2 * ops

    def c(self, i):
        return self._c + np.asarray(i, dtype=np.int64)

    def d(self, i):
        return self._d + np.asarray(i, dtype=np.int64)

    def gs(self, k):
        return self._gs + np.asarray(k, dtype=np.int64)

    def ge(self, k):
        return self._ge + np.asarray(k, dtype=np.int64)

    def dw(self, i):
        return self._dw + np.asarray(i, dtype=np.int64)


class _Edges:
    """The edges the replay adds one at a time (waits and dependencies), before they join the graph."""

    def __init__(self) -> None:
        self.waits: dict[tuple[int, int], float] = {}  # (op k, call i) → base: the call waits for the op
        self.waited: set[int] = set()  # calls with a wait of their own (not a device-wide one)
        self.drains: list[tuple[int, list[int], float]] = []  # (call i, ops it drains, its driver work)
        self.deps: list[tuple[int, int, float]] = []  # (op, op after it, base)
        self.unseen_deps: list[tuple[int, int, float]] = []

    def wait(self, k: int, i: int, base: float) -> None:
        self.waits[(k, i)] = base
        self.waited.add(i)

    def into(self, g: Graph, nodes: _Nodes) -> None:
        if self.waits:
            ks, calls = np.array(list(self.waits), dtype=np.int64).reshape(-1, 2).T
            g.add("wait", nodes.ge(ks), nodes.d(calls), np.array(list(self.waits.values()), dtype=np.float64), call=calls)
        if self.drains:  # each op drained → the call's drain node, then that node → the call's end
            ks = [k for _, each, _ in self.drains for k in each]
            by = [i for i, each, _ in self.drains for _ in each]
            work = [w for _, each, w in self.drains for _ in each]
            g.add("alloc_wait", nodes.ge(ks), nodes.dw(by), work, call=by)
            i = [i for i, _, _ in self.drains]
            g.add("alloc_wait", nodes.dw(i), nodes.d(i), 0.0, call=i)
        for kind, edges in (("dep", self.deps), ("unseen_dep", self.unseen_deps)):
            if edges:
                a, b, base = zip(*edges)
                g.add(kind, nodes.ge(list(a)), nodes.gs(list(b)), list(base))


def _py_max(a, b):
    """Python's max(a, b), element by element: b only where b > a (a NaN never wins over a number)."""
    return np.where(np.asarray(b) > a, b, a)


def _py_min(a, b):
    """Python's min(a, b), element by element."""
    return np.where(np.asarray(b) < a, b, a)


def build(model: TraceModel, metrics: Metrics) -> Replay | None:
    window, nsteps, actual = _choose_window(model, metrics)
    if window is None:
        return None
    ws, we = window
    rt = model.runtime
    talk = names_in(rt["name"], LAUNCH_CALLS | COPY_CALLS | SYNC_CALLS.keys() | set(ALLOC_CALLS) | set(FREE_CALLS))
    calls = rt[talk & (rt["ts"] >= ws) & (rt["ts"] < we)].copy()
    calls["name"] = calls["name"].astype(str)
    calls = calls.sort_values("ts", kind="stable", ignore_index=True)
    calls["blocking"] = calls["name"].isin(SYNC_CALLS.keys() | DEVICE_WIDE)
    gpu = model.gpu
    # per stream, the end of everything that ran before each op in the trace (the backlog included)
    order = gpu.sort_values("ts", kind="stable")
    prev_full = order.groupby("stream", sort=False)["end"].cummax().groupby(order["stream"], sort=False).shift(1)
    gpu = gpu.assign(prev_end_traced=prev_full.reindex(gpu.index).fillna(-np.inf))
    launched = gpu["correlation"].isin(calls["correlation"]) & (gpu["correlation"] >= 0)
    # ops whose launch the trace does not show (launched before profiling began, or by a thread it missed)
    # belong to the window only once its own work has started; before that they are the backlog
    unknown = ~gpu["correlation"].isin(rt["correlation"]) | (gpu["correlation"] < 0)
    own_start = float(gpu.loc[launched, "ts"].min()) if launched.any() else ws
    spill_in = unknown & (gpu["ts"] >= max(ws, own_start)) & (gpu["ts"] < we)
    ops = gpu[launched | spill_in].sort_values("ts", ignore_index=True)
    # what earlier steps left queued (launched before the window): an op may have waited for it
    # (only the columns the replay reads of it: a row selection of the whole frame is the cost here)
    later = gpu["correlation"].isin(rt.loc[rt["ts"] >= we, "correlation"])
    backlog = gpu.loc[~(launched | spill_in | later).to_numpy(), ["end", "stream"]]
    # cudaMemcpyAsync to or from pageable memory returns only once the data is staged: it blocks too
    pageable = name_mask(ops["name"], lambda n: "Pageable" in n)
    calls.loc[calls["correlation"].isin(ops.loc[pageable, "correlation"]), "blocking"] = True
    launches_block = _blocking_launches(calls, ops)
    usual = _usual_cost(calls)
    calls["queued"] = _queued(calls, ops, usual)

    nc, no = len(calls), len(ops)
    nodes = _Nodes(nc, no)
    g = Graph(nodes.count)
    latency = _idle_launch_latency(metrics.launches)
    call_ts = calls["ts"].to_numpy()
    call_end = calls["end"].to_numpy()
    # a call's own cost (its "call" edge), until a wait on the GPU is taken out of it below
    call_base = (call_end - call_ts).astype(np.float64)
    call_synced = np.zeros(nc)  # with allocator syncs on (_allocator_drains), where has_synced
    has_synced = np.zeros(nc, dtype=bool)
    extra = _Edges()  # the waits and dependencies added one by one

    # One CPU chain for all threads, in time order. PyTorch's threads hand work to each other (the
    # autograd thread runs backward while the main thread waits in loss.backward()), so a per-thread
    # chain would count a thread's waiting as work; the merged chain follows whichever thread is active.
    # Each call's "cpu" edge comes from the latest end of the calls before it (or the window's start).
    prev_end = np.fmax.accumulate(np.concatenate([[ws], call_end]))  # [k]: max(ws, ends of calls < k)
    gap_to = np.concatenate([call_ts, [we]])
    g.add("cpu", np.concatenate([[nodes.S], nodes.d(np.arange(nc))]), np.concatenate([nodes.c(np.arange(nc)), [nodes.E]]),
          _py_max(0.0, gap_to - prev_end), gap_a=prev_end, gap_b=gap_to)

    # GPU ops: launched by a call, ordered on their stream. A blocking call's own copy starts from the
    # call's start (the call returns only after it), every other op from the end of its launch call.
    call_of = dict(zip(calls["correlation"], calls.index))
    blocking_calls = calls["blocking"].to_numpy()
    o_ts, o_dur = ops["ts"].to_numpy(), ops["dur"].to_numpy()
    o_stream = ops["stream"].to_numpy()
    owner = np.array([call_of.get(c, -1) for c in ops["correlation"].tolist()], dtype=np.int64).reshape(-1)
    # per op, the op before it on its stream (-1: none) and the latest end of the ops before it there
    prev_op = np.full(no, -1, dtype=np.int64)
    stream_prev_end = np.full(no, -np.inf)
    for stream in pd.unique(o_stream):
        on = np.flatnonzero(o_stream == stream)
        prev_op[on[1:]] = on[:-1]
        stream_prev_end[on[1:]] = np.fmax.accumulate(o_ts[on] + o_dur[on])[:-1]
    owned = owner >= 0
    mine = np.where(owned, owner, nc)  # an op no call of the window launched: the padding row past the calls
    sync_copy = owned & np.append(blocking_calls, False)[mine]
    launch_ts = np.where(owned, np.append(call_end, -np.inf)[mine], -np.inf)
    launch_base = np.full(no, latency)
    if sync_copy.any():
        # a synchronous copy stages its data inside the call before the DMA starts: keep that time, but not
        # the time the copy waited for GPU work to finish (its stream's, or another's it waits on through an
        # event): that is a wait on the GPU, which the replay ties it to
        k = np.flatnonzero(sync_copy)
        i = owner[k]
        all_ends = np.sort(model.gpu["end"].to_numpy(dtype=np.float64))  # every stream, the backlog included
        last_end = np.concatenate([[-np.inf], all_ends])[np.searchsorted(all_ends, o_ts[k], side="right")]
        ready = _py_max(_py_max(call_ts[i], stream_prev_end[k]), last_end)
        staged = _py_min(_py_max(latency, o_ts[k] - ready), call_end[i] - call_ts[i])
        launch_base[k] = staged
        launch_ts[k] = call_ts[i] + staged - latency
    # what the ops wait for beyond what the trace explains (_unexplained_starts), on their launch and stream edges
    launch_unseen, stream_unseen = np.zeros(no), np.zeros(no)

    # Blocking calls wait for the GPU op that finished just before they returned. Only ops launched
    # before the call (or by it) qualify, which keeps every edge pointing forward in time.
    if no:
        order = np.argsort(ops["end"].to_numpy(), kind="stable")
        ends_sorted = ops["end"].to_numpy()[order]
        waiting = calls[calls["blocking"] | calls["queued"]]
        for i, ts, end, queued in zip(waiting.index, waiting["ts"].to_numpy(), waiting["end"].to_numpy(),
                                      waiting["queued"].to_numpy()):
            own = float(usual[i]) if queued else WAKE_US  # a queued launch still pays its usual cost
            j = np.searchsorted(ends_sorted, end + 1.0, side="right") - 1
            while j >= 0 and ends_sorted[j] > ts:
                k = int(order[j])
                if (owner[k] == i and not queued) or (owner[k] >= 0 and call_ts[owner[k]] < ts) or owner[k] < 0:
                    extra.wait(k, i, min(own, max(0.0, end - ends_sorted[j])))
                    # the call's own CPU cost is what is left once the wait is taken out
                    call_base[i] = min(float(end - ts), own)
                    break
                j -= 1
            else:
                if queued:  # it waited on work an earlier step queued, which the replay leaves out
                    call_base[i] = own
        if launches_block:
            _tie_idle_syncs(extra, calls, ops, owner, call_ts)
        _device_wide_waits(extra, calls, ops, owner, call_ts)
        frees = rt.loc[names_in(rt["name"], set(FREE_CALLS)), "ts"]
        _allocator_drains(extra, call_synced, has_synced, calls, ops, owner, call_ts,
                          float(frees.min()) if len(frees) else np.inf)

    # An op that started well after both its launch and its stream's previous op waited for something
    # else, usually an event recorded on another stream (cudaStreamWaitEvent): tie it to the op on another
    # stream that ended just before it started.
    if no:
        unseen = _unexplained_starts(extra, ops, launch_ts, latency, backlog)
        launch_unseen[owned] = unseen[owned]
        stream_unseen[prev_op >= 0] = unseen[prev_op >= 0]

    k = np.arange(no)
    g.add("call", nodes.c(np.arange(nc)), nodes.d(np.arange(nc)), call_base, call=np.arange(nc), synced=call_synced,
          has_synced=has_synced)
    ko = k[owned]
    g.add("launch", np.where(sync_copy[ko], nodes.c(owner[ko]), nodes.d(owner[ko])), nodes.gs(ko),
          launch_base[ko] + launch_unseen[ko], unseen=launch_unseen[ko])
    # launched before the window (or by a graph): keep its real start as a floor
    g.add("anchor", nodes.S, nodes.gs(k[~owned]), _py_max(0.0, o_ts[~owned] - ws))
    g.add("gpu", nodes.gs(k), nodes.ge(k), o_dur.astype(np.float64), op=k)
    kp = k[prev_op >= 0]
    g.add("stream", nodes.ge(prev_op[kp]), nodes.gs(kp), 0.0 + stream_unseen[kp], unseen=stream_unseen[kp])
    last = np.setdiff1d(k, prev_op[kp])  # the last op on each stream
    g.add("drain", nodes.ge(last), nodes.E, 0.0)
    extra.into(g, nodes)

    try:
        order = g.topological_order()
    except Cyclic:  # orderings we cannot see (clock skew, threads): drop the guesses
        g.drop(("wait", "dep", "alloc_wait", "unseen_dep"))
        g.forget_synced()  # a call's cost after a drain means nothing without the wait
        order = g.topological_order()

    cut = metrics.one_time_cut
    if cut is not None:  # one-time costs no step could be left out for: their time is not the steps'
        actual = max(0.0, actual - float(iv.covered(*cut, [ws], [we])[0]))
    replay = Replay(graph=g, calls=calls, ops=ops, window=(ws, we), steps=nsteps, baseline_us=0.0, actual_us=actual,
                    _stall_us=_stalls(calls, usual))
    replay.compile(order, nodes.S, nodes.E)
    if cut is not None:
        _cut_out(replay, cut)
    replay.baseline_us = replay.simulate(Scenario("baseline"))
    return replay


def _cut_out(replay: Replay, cut: tuple[np.ndarray, np.ndarray]) -> None:
    """Take the one-time ranges out of the CPU chain's weights (the time between calls and the calls'
    own cost): the baseline is then the window without them, and no scenario can claim them."""
    e, calls = replay._edges, replay.calls
    cpu, call = e["kind"] == "cpu", e["kind"] == "call"
    e["base"][cpu] = np.maximum(0.0, e["base"][cpu] - iv.covered(*cut, e["gap_a"][cpu], e["gap_b"][cpu]))
    i = e["call"][call]
    ts, end = calls["ts"].to_numpy(dtype=float)[i], calls["end"].to_numpy(dtype=float)[i]
    e["base"][call] = np.maximum(0.0, e["base"][call] - iv.covered(*cut, ts, end))
    e["synced"][call] = np.minimum(e["synced"][call], e["base"][call])


def _usual_cost(calls: pd.DataFrame) -> np.ndarray:
    """Per call, the median duration of the window's calls of that name (what one costs without a wait);
    NaN-free, and infinite for calls that never wait on a queue (syncs, frees, blocking copies)."""
    med = calls.groupby("name", sort=False)["dur"].transform("median").to_numpy(dtype=np.float64)
    is_async = calls["name"].isin(QUEUEING_CALLS).to_numpy()
    return np.where(is_async, med, np.inf)


def _stalls(calls: pd.DataFrame, usual: np.ndarray) -> np.ndarray:
    """Per call, the time beyond its usual cost of an async call that was far above it without waiting
    for a queue slot (a queued call is replayed at its usual cost already): a stall in the driver."""
    dur = calls["dur"].to_numpy(dtype=np.float64)
    far = ~calls["blocking"].to_numpy() & ~calls["queued"].to_numpy() & (dur > np.maximum(QUEUE_X * usual, usual + QUEUE_MIN_US))
    return np.where(far, dur - usual, 0.0)


def _queued(calls: pd.DataFrame, ops: pd.DataFrame, usual: np.ndarray) -> np.ndarray:
    """Async calls that waited for a slot in a full launch queue: far above their usual cost, and their
    own op started well after they returned (the GPU was behind)."""
    slow = ~calls["blocking"].to_numpy() & (calls["dur"].to_numpy() > np.maximum(QUEUE_X * usual, usual + QUEUE_MIN_US))
    if not slow.any() or ops.empty:
        return slow
    first = ops.groupby("correlation")["ts"].min()
    own_start = calls["correlation"].map(first).to_numpy(dtype=np.float64)
    return slow & (own_start > calls["end"].to_numpy() + QUEUE_MIN_US)


def _blocking_launches(calls: pd.DataFrame, ops: pd.DataFrame, min_launches: int = 20, share: float = 0.9) -> bool:
    """CUDA_LAUNCH_BLOCKING=1: launch calls return only once their kernel has finished. When (nearly) all
    launches in the window did, they are synchronous calls and are replayed like one (marked blocking);
    a few launches of tiny kernels that happened to finish before their call returned change nothing.
    Returns whether the window ran in that mode."""
    launch = calls["name"].isin(LAUNCH_CALLS).to_numpy()
    if launch.sum() < min_launches or ops.empty:
        return False
    ends = (ops["ts"] + ops["dur"]).groupby(ops["correlation"].to_numpy()).max()
    op_end = calls["correlation"].map(ends).to_numpy(dtype=np.float64)  # NaN: no op of its own in the window
    waited = launch & (calls["end"].to_numpy() >= op_end - 1.0)
    if waited.sum() < share * launch.sum():
        return False
    calls.loc[waited, "blocking"] = True
    return True


def _tie_idle_syncs(g: _Edges, calls: pd.DataFrame, ops: pd.DataFrame, owner: np.ndarray, call_ts: np.ndarray) -> None:
    """With blocking launches a sync never waits (the GPU is always done by then), so the trace shows no
    wait to tie it to. A sync still orders after the work launched before it: tie each such sync to the
    last op launched before it on every stream (base 0: the traced steps are unchanged), so a scenario that
    lets the launches return at once still makes the sync wait for the GPU."""
    syncs = calls[calls["name"].isin(SYNC_CALLS.keys()) & ~calls["name"].isin(LAUNCH_CALLS)]
    launched = np.where(owner >= 0, call_ts[np.clip(owner, 0, None)], np.nan)
    streams = ops["stream"].to_numpy()
    for i, ts in zip(syncs.index, syncs["ts"].to_numpy()):
        if i in g.waited:
            continue
        before = np.flatnonzero(launched < ts)
        for stream in np.unique(streams[before]):
            mine = before[streams[before] == stream]
            k = int(mine[np.argmax(launched[mine])])
            g.wait(k, i, 0.0)


def _device_wide_waits(g: _Edges, calls: pd.DataFrame, ops: pd.DataFrame, owner: np.ndarray,
                       call_ts: np.ndarray) -> None:
    """A device-wide sync returns only after every op launched before it, on every stream: tie it to the
    last op (by end) of each stream among those. Where the op had long finished in the trace, the edge
    costs nothing in the baseline; it binds when a scenario makes the CPU reach the call sooner."""
    wide = calls.index[calls["name"].isin(DEVICE_WIDE).to_numpy()].to_numpy()
    for i, k in _last_ops_before(wide, ops, owner, call_ts):
        if (k, i) not in g.waits:
            g.wait(k, i, WAKE_US)


def _last_ops_before(idx: np.ndarray, ops: pd.DataFrame, owner: np.ndarray, call_ts: np.ndarray):
    """(call i, op k) for each call in `idx` and each stream: k is the op with the latest end among those
    the stream had launched before the call, the one a device-wide wait at that call waits for."""
    if not len(idx) or not len(ops):
        return
    launched_at = np.where(owner >= 0, call_ts[np.maximum(owner, 0)], -np.inf)
    ends, streams = ops["end"].to_numpy(), ops["stream"].to_numpy()
    for stream in np.unique(streams):
        on = np.flatnonzero((streams == stream) & (owner >= 0))
        if not on.size:
            continue
        by_launch = on[np.argsort(launched_at[on], kind="stable")]
        # running "op with the latest end" in launch order: the one a sync at time t waits for
        best = by_launch[_argmax_accumulate(ends[by_launch])]
        js = np.searchsorted(launched_at[by_launch], call_ts[idx], side="left") - 1
        for i, j in zip(idx[js >= 0].tolist(), js[js >= 0].tolist()):
            yield int(i), int(best[j])


def _allocator_drains(g: _Edges, synced: np.ndarray, has_synced: np.ndarray, calls: pd.DataFrame,
                      ops: pd.DataFrame, owner: np.ndarray, call_ts: np.ndarray, first_free: float) -> None:
    """Edges that only `Scenario.alloc_syncs` turns on (kind "alloc_wait", -inf otherwise): every cudaFree, and
    every cudaMalloc after a release (after the trace's first cudaFree, or anywhere in a window whose steps
    free memory), waits for the last op (by end) of each stream among those launched before it, then does
    its driver work: what the call took after the latest of those ends when that fell inside the call (the
    call's "synced" own cost too), else its whole traced time.
    The edges run through a node per call (its drain, _Nodes.dw), so they sit beside a sync's own "wait" edges."""
    names = calls["name"]
    frees = names.isin(FREE_CALLS)
    # a loop whose steps free memory released it before each step's mallocs, the first replayed one's too
    # (the previous step, maybe before the trace began)
    released = (calls["ts"] > first_free) | bool(frees.any())
    driver = (frees | (names.isin(ALLOC_CALLS) & released)).to_numpy()
    idx = np.flatnonzero(driver)
    if not idx.size or not len(ops):
        return
    ends = ops["end"].to_numpy()
    call_end = calls["end"].to_numpy(dtype=np.float64)
    waits: dict[int, list[int]] = {int(i): [] for i in idx}
    for i, k in _last_ops_before(idx, ops, owner, call_ts):
        waits[i].append(k)
    for i, ks in waits.items():
        if not ks:
            continue
        drained = max(float(ends[k]) for k in ks)
        own = float(call_end[i] - call_ts[i])
        waited = call_ts[i] < drained < call_end[i]
        work = max(WAKE_US, float(call_end[i] - drained)) if waited else max(WAKE_US, own)
        synced[i], has_synced[i] = min(work, own), True
        g.drains.append((i, ks, work))


def _argmax_accumulate(x: np.ndarray) -> np.ndarray:
    """Index of the running maximum of x (first occurrence)."""
    idx = np.arange(len(x))
    best = np.where(x == np.maximum.accumulate(x), idx, 0)
    return np.maximum.accumulate(best)


def _idle_launch_latency(launches: pd.DataFrame) -> float:
    """Median delay from a launch call's end to its op's start when the stream was idle (no queue)."""
    if launches.empty:
        return 2.0
    delays = []
    for _, g in launches.sort_values("gpu_ts").groupby("stream"):
        end = (g["gpu_ts"] + g["gpu_us"]).to_numpy()
        prev = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
        idle = prev < g["launch_end"].to_numpy()
        delays.append((g["gpu_ts"].to_numpy() - g["launch_end"].to_numpy())[idle])
    d = np.concatenate(delays) if delays else np.empty(0)
    d = d[d >= 0]
    return float(np.clip(np.median(d), 1.0, 20.0)) if d.size else 2.0


def _unexplained_starts(g: _Edges, ops: pd.DataFrame, launch_ts: np.ndarray, latency: float,
                        backlog: pd.DataFrame, slack_us: float = 5.0, tie_us: float = 20.0,
                        unseen_us: float = 100.0) -> np.ndarray:
    """Ops that started later than their launch and stream allow waited for something: another stream's
    op that ended just before (an event wait) becomes a dependency, or nothing when that op is backlog;
    failing that, something the trace does not show, kept as a wait of its traced length after whatever
    the op follows (module docstring: never a fixed start). Returns that wait per op (µs, 0: none), which
    its launch and stream edges carry."""
    unseen = np.zeros(len(ops))
    ts, end, stream = ops["ts"].to_numpy(), ops["end"].to_numpy(), ops["stream"].to_numpy()
    # what ran before each op on its stream in the trace, backlog included: an op that waited for an
    # earlier step's work is explained (and, with that work outside the replay, starts at its launch)
    prev_end = ops["prev_end_traced"].to_numpy(dtype=float)
    earliest = np.maximum(launch_ts + latency, prev_end)  # launch_ts: when the call let the op go
    # candidates for a cross-stream wait: the replay's ops (index ≥ 0) and the backlog's (index -1)
    c_end = np.concatenate([end, backlog["end"].to_numpy(dtype=float)])
    c_stream = np.concatenate([stream, backlog["stream"].to_numpy()])
    c_idx = np.concatenate([np.arange(len(ops)), np.full(len(backlog), -1)])
    c_launch = np.concatenate([launch_ts, np.full(len(backlog), -np.inf)])
    order = np.argsort(c_end, kind="stable")
    ends_sorted = c_end[order]
    by_stream = {}
    for st in np.unique(stream):
        idx = np.flatnonzero(stream == st)
        idx = idx[np.argsort(end[idx], kind="stable")]
        by_stream[st] = (end[idx], idx)
    for k in np.flatnonzero(ts > earliest + slack_us):
        j = np.searchsorted(ends_sorted, ts[k] + 1.0, side="right") - 1
        tied = False
        while j >= 0 and ends_sorted[j] >= ts[k] - tie_us:
            cand = int(order[j])
            if c_stream[cand] != stream[k] and c_launch[cand] <= launch_ts[k]:
                if c_idx[cand] >= 0:
                    g.deps.append((int(c_idx[cand]), int(k), 0.0))
                tied = True
                break
            j -= 1
        if not tied and ts[k] > earliest[k] + unseen_us and np.isfinite(launch_ts[k]):
            unseen[k] = float(ts[k] - earliest[k])  # Scenario.unseen_scale acts on it
            # with that wait gone (Scenario.unseen_scale), whatever it hid may have ordered the op after the
            # work launched before it on the other streams: it follows the last such op that had ended by
            # then on each (never earlier than the trace shows it could have)
            for other, (o_end, o_idx) in by_stream.items():
                if other == stream[k]:
                    continue
                j = np.searchsorted(o_end, ts[k], side="right") - 1
                if j >= 0 and launch_ts[o_idx[j]] <= launch_ts[k]:
                    g.unseen_deps.append((int(o_idx[j]), int(k), -np.inf))
    return unseen


def _sorted(values: np.ndarray) -> np.ndarray:
    """`np.sort(values)`, without the sort when they are in order already (a trace's events mostly are)."""
    return values if len(values) < 2 or bool((values[1:] >= values[:-1]).all()) else np.sort(values)


def _choose_window(model: TraceModel, metrics: Metrics):
    """(CPU window, number of steps, their time on the GPU timeline)."""
    steps = metrics.steps
    budget_calls = NODE_BUDGET // 4
    rt_ts = _sorted(model.runtime["ts"].to_numpy()) if len(model.runtime) else np.empty(0)
    if rt_ts.size == 0:
        return None, 0, 0.0
    if not steps:
        ws, we = metrics.window
        # no steps: cut to a window holding at most the budget of runtime calls
        lo = np.searchsorted(rt_ts, ws)
        hi = np.searchsorted(rt_ts, we)
        if hi - lo > budget_calls:
            mid = (lo + hi) // 2
            ws = rt_ts[max(lo, mid - budget_calls // 2)]
            we = rt_ts[min(hi - 1, mid + budget_calls // 2)]
        return (ws, we), 0, we - ws
    counts = np.searchsorted(rt_ts, [s.end for s in steps]) - np.searchsorted(rt_ts, [s.start for s in steps])
    # a step left out for a one-time cost breaks the run: the replay never spans it
    gone = np.array([s.start for s in metrics.left_out_steps])
    broken = [bool(((gone >= a.end) & (gone < b.start)).any()) for a, b in zip(steps, steps[1:])]
    # grow a contiguous run of steps around the median one while it fits the budget
    mid = len(steps) // 2
    lo, hi, total = mid, mid, counts[mid]
    while True:
        grown = False
        if hi + 1 < len(steps) and not broken[hi] and total + counts[hi + 1] <= budget_calls:
            hi += 1
            total += counts[hi]
            grown = True
        if lo - 1 >= 0 and not broken[lo - 1] and total + counts[lo - 1] <= budget_calls:
            lo -= 1
            total += counts[lo]
            grown = True
        if not grown:
            break
    return (steps[lo].start, steps[hi].end), hi - lo + 1, float(sum(s.dur for s in steps[lo:hi + 1]))

"""One rank's collectives, ready to be lined up with the other ranks' (measure/job/job.py).

Each collective's execution (model/collectives.py: a communication kernel, or a CPU backend's span such
as `gloo:all_reduce`) becomes one row: the step whose iteration issued it, which collective it is, the
process group and sequence number when the trace records them, its order among the same collectives of
its step, and when it started and ended on this rank's clock (absolute µs, so ranks on one host compare
directly; measure/job/job.py aligns other clocks by the collectives' ends).

A collective starts on a rank when that rank arrives (its data is ready, its stream or backend thread gets
to it) and ends once the last rank has arrived and the transfer is done. What part of the time a rank
spends inside it is waiting only shows next to the other ranks; what this module keeps for that is the
rank's own work while its collectives ran (`busy`: compute kernels on the GPU, CPU ops on the training
threads for a CPU backend), so that a wait that overlapped work is not counted as time the step lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..basics import intervals as iv
from .commphases import place
from ..compiled.cudagraphs import captured
from ..basics.metrics import Metrics
from ..basics.steps import launch_steps
from gpuadvise.analyzer.model import collectives as coll
from gpuadvise.analyzer.model.kernels import is_comm
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in


@dataclass
class RankCollectives:
    """One row per collective execution of one rank, in start order (all arrays the same length)."""

    step: np.ndarray  # ProfilerStep number of the iteration that issued it (-1: outside the steps)
    kind: list[str]  # "all_reduce", "all_gather", … (model/collectives.kind)
    pg: list[str]  # process group name ("" when the trace does not say)
    seq: np.ndarray  # the process group's sequence number (-1 when not recorded)
    order: np.ndarray  # its place among the collectives of the same step, group and kind on this rank
    start_us: np.ndarray  # absolute µs (trace clock + its base): when this rank arrived
    end_us: np.ndarray
    nelems: np.ndarray  # elements sent (NaN when not recorded)
    where: list[str]  # coll.KERNEL (GPU) or coll.HOST (a CPU backend's thread)
    # the rank's own work while its collectives ran, as merged intervals (absolute µs)
    busy: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (np.zeros(0), np.zeros(0)))
    base_us: float = 0.0  # the trace's clock at its rebased 0: start_us − base_us is the model's clock
    issued_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # model clock: a kernel's launch, a span's call
    correlation: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # kernels' launches (-1)
    # where it ran on this rank: "pg NAME" where the trace names its process group, else the CPU backend's
    # thread ("thread 6323") or the GPU stream ("stream 0:20"), each of which runs one group's collectives
    lane: list[str] = field(default_factory=list)
    comms_id: list[str] = field(default_factory=list)  # the one id it has on every rank ("" when not recorded)
    pg_desc: list[str] = field(default_factory=list)  # the group's description and ranks, as the trace writes them
    pg_ranks: list[str] = field(default_factory=list)
    group_size: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # its group's size (-1)
    phase: list[str] = field(default_factory=list)  # "forward", "backward", "optimizer", "" (measure/job/commphases.py)
    scheme: list[str] = field(default_factory=list)  # "fsdp", "tp", "pp", "a2a", "ddp", "dp", "optimizer", ""

    def __len__(self) -> int:
        return len(self.step)

    def exposed_us(self) -> np.ndarray:
        """Per row: the time inside it the rank did nothing else (its wait and transfer not overlapped)."""
        return np.clip((self.end_us - self.start_us) - iv.covered(*self.busy, self.start_us, self.end_us), 0.0, None)

    def keys(self, groups: list[str] | None = None) -> list[tuple]:
        """How each row is matched across ranks: by its Comms Id where the trace has one, else by process
        group and sequence number, else by step, group, collective and order within the step. `groups`:
        each row's group as the job resolved it (measure/job/commgroups.py), for rows whose trace names none."""
        out = []
        ids = self.comms_id or [""] * len(self)
        for i, (s, k, g, q, o) in enumerate(zip(self.step.tolist(), self.kind, self.pg, self.seq.tolist(),
                                                 self.order.tolist())):
            if ids[i]:
                out.append(("id", ids[i]))
            elif q >= 0:
                out.append(("seq", g, k == "send_recv", q))
            else:
                out.append(("step", s, groups[i] if groups is not None else g, k, o))
        return out


def rank_collectives(model: TraceModel, m: Metrics) -> RankCollectives | None:
    """The collectives `model` ran, placed on `m`'s steps; None when it ran none."""
    comms = model.comms
    found = coll.executions(comms)
    if found is None:
        return None
    runs, kinds, where = found
    calls = coll.calls_of(comms, runs, kinds, where)  # a CPU backend's span: the c10d call that issued it
    ts = coll.began(comms, runs, kinds, where, calls)  # a CPU backend's collective begins at its call
    runs = runs.assign(ts=ts)
    call_tid = calls[1]
    for i, k in enumerate(calls[2]):
        if k:
            kinds[i] = k  # gloo runs a reduce-scatter as an all-reduce: the call says which it was
    # the iteration that issued it: a kernel by its launch call, a CPU backend's span by its call
    issued_at = ts.copy()
    issued_tid = np.where(call_tid >= 0, call_tid, runs["tid"].to_numpy(dtype=np.int64))
    if len(m.launches):
        launch = m.launches.drop_duplicates("correlation").set_index("correlation")
        corr = runs["correlation"].to_numpy()
        known = np.isin(corr, launch.index.to_numpy()) & (np.array(where) == coll.KERNEL)
        issued_at[known] = launch.loc[corr[known], "launch_ts"].to_numpy(dtype=float)
        issued_tid[known] = launch.loc[corr[known], "tid"].to_numpy(dtype=np.int64)
        _named_by_call(comms, kinds, known, issued_at, launch.loc[corr[known], "tid"].to_numpy())
    k = launch_steps(m.steps, issued_at)
    numbers = np.array([s.number for s in m.steps], dtype=np.int64)
    step = np.where(k >= 0, numbers[np.clip(k, 0, None)] if len(numbers) else -1, -1)
    meta = {c: runs[c].astype(str).tolist() for c in ("pg", "pg_desc", "pg_ranks", "comms_id")}
    seq = runs["seq"].to_numpy(dtype=np.int64).copy()
    _from_param_comms(comms, where, issued_at, issued_tid, meta, seq)
    pg = meta["pg"]
    order = np.zeros(len(runs), dtype=np.int64)
    seen: dict = {}
    for i, key in enumerate(zip(step.tolist(), pg, kinds)):
        order[i] = seen.get(key, 0)
        seen[key] = order[i] + 1
    base = float(model.meta.base_ts_us)
    end = runs["end"].to_numpy(dtype=float)
    lanes = [f"pg {g}" if g else (f"thread {t}" if w == coll.HOST else f"stream {p}:{t}")
             for g, w, p, t in zip(pg, where, runs["pid"].tolist(), runs["tid"].tolist())]
    place_at, place_tid, unplaced = _captured_at(model, runs, where, issued_at, issued_tid)
    phase, scheme = place(model, m, place_at, place_tid, kinds, step_at=issued_at)
    for i in np.flatnonzero(unplaced).tolist():
        phase[i] = "graph"  # a graph captured before the trace ran it: which phase is not in the trace
    return RankCollectives(
        step=step, kind=kinds, pg=pg, seq=seq, order=order,
        start_us=ts + base, end_us=end + base, nelems=runs["in_nelems"].to_numpy(dtype=float), where=where,
        busy=_own_work(model, m, runs, base), base_us=base, issued_us=issued_at,
        correlation=np.where(np.array(where) == coll.KERNEL, runs["correlation"].to_numpy(dtype=np.int64), -1),
        lane=lanes, comms_id=meta["comms_id"], pg_desc=meta["pg_desc"], pg_ranks=meta["pg_ranks"],
        group_size=_sizes_from_calls(model, runs["group_size"].to_numpy(dtype=np.int64), calls[0], call_tid),
        phase=phase, scheme=scheme,
    )


def _sizes_from_calls(model: TraceModel, sizes: np.ndarray, call_ts: np.ndarray, call_tid: np.ndarray) -> np.ndarray:
    """Each collective's group size: what its records say ("Group size"), else, for a CPU backend's span
    (gloo records none), what the tensors of the c10d call that issued it say (an all-gather's output over
    its input: model/collectives.size_from_shapes); -1 where neither does."""
    cpu = model.cpu
    need = np.flatnonzero((sizes <= 0) & (call_tid >= 0))
    if not len(need) or cpu.empty or "input_dims" not in cpu:
        return sizes
    rows = cpu[names_in(cpu["name"], coll.SIZED_CALLS)]
    if rows.empty:
        return sizes
    by_call = {}
    for name, tid, ts, dims in zip(rows["name"].astype(str), rows["tid"].tolist(), rows["ts"].tolist(),
                                   rows["input_dims"].astype(str)):
        try:
            size = coll.size_from_shapes(name, json.loads(dims))
        except ValueError:
            continue
        if size:
            by_call[(int(tid), float(ts))] = size
    out = sizes.copy()
    for i in need.tolist():
        out[i] = by_call.get((int(call_tid[i]), float(call_ts[i])), out[i])
    return out


def _captured_at(model: TraceModel, runs, where: list[str], issued_at: np.ndarray,
                 issued_tid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each collective's phase is read: where it was issued, or for a kernel a CUDA graph ran, where
    the launch captured into the graph was made (measure/compiled/cudagraphs.py); and which ran from a graph whose
    capture the trace does not hold."""
    at, tid = issued_at.copy(), issued_tid.copy()
    unplaced = np.zeros(len(runs), dtype=bool)
    gpu = model.gpu
    if "graph_node" not in gpu or not (gpu["graph_node"].to_numpy() >= 0).any():
        return at, tid, unplaced
    calls = captured(model).calls
    graphed = gpu[gpu["graph_node"].to_numpy() >= 0]
    by_op = {(int(c), float(t)): None for c, t in zip(graphed["correlation"], graphed["ts"])}
    mapped = gpu.loc[calls.index]
    by_op.update({(int(c), float(t)): (float(ct), int(ctid)) for c, t, ct, ctid in
                  zip(mapped["correlation"], mapped["ts"], calls["ts"], calls["tid"])})
    for i, (c, t, w) in enumerate(zip(runs["correlation"].tolist(), runs["ts"].tolist(), where)):
        key = (int(c), float(t))
        if w != coll.KERNEL or key not in by_op:
            continue
        if by_op[key] is None:
            unplaced[i] = True
        else:
            at[i], tid[i] = by_op[key]
    return at, tid, unplaced


def _from_param_comms(comms, where: list[str], issued_at: np.ndarray, issued_tid: np.ndarray, meta: dict,
                      seq: np.ndarray) -> None:
    """A kernel whose args do not name its group takes what the `record_param_comms` op around its launch
    recorded (group, description, ranks, Comms Id, sequence number)."""
    need = [i for i, w in enumerate(where) if w == coll.KERNEL and not (meta["pg"][i] and meta["comms_id"][i])]
    if not need:
        return
    calls = comms[(comms["role"] == coll.CALL).to_numpy() & (comms["name"].astype(str) == coll.PARAM_COMMS).to_numpy()]
    if calls.empty:
        return
    calls = calls.sort_values("ts", kind="stable")
    c_meta = {c: calls[c].astype(str).tolist() for c in meta}
    c_seq = calls["seq"].to_numpy(dtype=np.int64)
    c_ts, c_end, c_tid = (calls[c].to_numpy() for c in ("ts", "end", "tid"))
    by_tid = {t: np.flatnonzero(c_tid == t) for t in np.unique(c_tid).tolist()}
    for i in need:
        rows = by_tid.get(int(issued_tid[i]))
        if rows is None:
            continue
        k = int(np.searchsorted(c_ts[rows], issued_at[i], side="right")) - 1  # the last one begun by the launch
        if k < 0 or c_end[rows[k]] < issued_at[i]:
            continue
        j = int(rows[k])
        for c in meta:
            if not meta[c][i]:
                meta[c][i] = c_meta[c][j]
        if seq[i] < 0:
            seq[i] = c_seq[j]


def _named_by_call(comms, kinds: list[str], launched: np.ndarray, launch_ts: np.ndarray, tids: np.ndarray) -> None:
    """A kernel that does not say which collective it runs (NCCL runs all-to-all as `SendRecv` kernels)
    takes the collective of the `nccl:…` call around its launch, when the trace has one."""
    calls = comms[(comms["role"] == coll.CALL).to_numpy() & name_mask(comms["name"], coll.BACKEND_SPAN.match)]
    if calls.empty:
        return
    c_ts, c_end, c_tid = (calls[c].to_numpy() for c in ("ts", "end", "tid"))
    c_kind = [coll.kind(str(n)) for n in calls["name"]]
    for i, t, tid in zip(np.flatnonzero(launched).tolist(), launch_ts[launched].tolist(), tids.tolist()):
        if kinds[i] not in ("send_recv", "other"):
            continue
        around = np.flatnonzero((c_ts <= t) & (c_end >= t) & (c_tid == tid))
        if len(around):
            kinds[i] = c_kind[int(around[-1])]


def own_work(model: TraceModel, runs=None) -> tuple[np.ndarray, np.ndarray]:
    """The rank's own work as merged intervals (absolute µs): compute kernels where its collectives run on
    the GPU, CPU ops on the threads that are not a backend's where they run on a CPU backend. `runs`: its
    collective executions (rows of model.comms; all of them when None)."""
    if runs is None:
        comms = model.comms
        runs = comms[comms["role"].isin([coll.KERNEL, coll.HOST])] if comms is not None else comms
    parts_s, parts_e = [], []
    kernels = model.kernels
    if runs is not None and (runs["role"] == coll.KERNEL).any() and len(kernels):
        own = ~name_mask(kernels["name"], is_comm)
        parts_s.append(kernels["ts"].to_numpy(dtype=float)[own])
        parts_e.append(kernels["end"].to_numpy(dtype=float)[own])
    host = runs[runs["role"] == coll.HOST] if runs is not None else None
    if host is not None and len(host):
        backend_threads = set(host["tid"].tolist())
        cpu = model.cpu
        ops = cpu[~cpu["is_annotation"].to_numpy() & ~cpu["tid"].isin(backend_threads).to_numpy()]
        ops = ops[~coll.in_a_collective(ops)]
        parts_s.append(ops["ts"].to_numpy(dtype=float))
        parts_e.append(ops["end"].to_numpy(dtype=float))
    if not parts_s:
        return np.zeros(0), np.zeros(0)
    s, e = iv.union(np.concatenate(parts_s), np.concatenate(parts_e))
    base = float(model.meta.base_ts_us)
    return s + base, e + base


def _own_work(model: TraceModel, m: Metrics, runs, base: float) -> tuple[np.ndarray, np.ndarray]:
    """`own_work` while the collectives ran (what the reduce needs to tell a wait from work)."""
    work = own_work(model, runs)
    span = iv.union(runs["ts"].to_numpy(dtype=float) + base, runs["end"].to_numpy(dtype=float) + base)
    return iv.intersect(work, span)

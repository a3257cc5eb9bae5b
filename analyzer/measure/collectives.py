"""One rank's collectives, ready to be lined up with the other ranks' (measure/job.py).

Each collective's execution (model/collectives.py: a communication kernel, or a CPU backend's span such
as `gloo:all_reduce`) becomes one row: the step whose iteration issued it, which collective it is, the
process group and sequence number when the trace records them, its order among the same collectives of
its step, and when it started and ended on this rank's clock (absolute µs, so ranks on one host compare
directly; measure/job.py aligns other clocks by the collectives' ends).

A collective starts on a rank when that rank arrives (its data is ready, its stream or backend thread gets
to it) and ends once the last rank has arrived and the transfer is done. What part of the time a rank
spends inside it is waiting only shows next to the other ranks; what this module keeps for that is the
rank's own work while its collectives ran (`busy`: compute kernels on the GPU, CPU ops on the training
threads for a CPU backend), so that a wait that overlapped work is not counted as time the step lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import intervals as iv
from .metrics import Metrics
from .steps import launch_steps
from gpuadvise.analyzer.model import collectives as coll
from gpuadvise.analyzer.model.kernels import is_comm
from gpuadvise.analyzer.model.trace import TraceModel, name_mask


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
    issued_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # model clock: a kernel's launch, a span's start
    correlation: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # kernels' launches (-1)

    def __len__(self) -> int:
        return len(self.step)

    def exposed_us(self) -> np.ndarray:
        """Per row: the time inside it the rank did nothing else (its wait and transfer not overlapped)."""
        return np.clip((self.end_us - self.start_us) - iv.covered(*self.busy, self.start_us, self.end_us), 0.0, None)

    def keys(self) -> list[tuple]:
        """How each row is matched across ranks: by process group and sequence number where the trace has
        them, else by step, group, collective and order within the step."""
        out = []
        for s, k, g, q, o in zip(self.step.tolist(), self.kind, self.pg, self.seq.tolist(), self.order.tolist()):
            out.append(("seq", g, k == "send_recv", q) if q >= 0 else ("step", s, g, k, o))
        return out


def rank_collectives(model: TraceModel, m: Metrics) -> RankCollectives | None:
    """The collectives `model` ran, placed on `m`'s steps; None when it ran none."""
    comms = model.comms
    found = coll.executions(comms)
    if found is None:
        return None
    runs, kinds, where = found
    runs = runs.assign(ts=coll.began(comms, runs, kinds, where))  # a CPU backend's: from the c10d call
    ts = runs["ts"].to_numpy(dtype=float)
    # the iteration that issued it: a kernel by its launch call, a CPU backend's span by when it began
    issued_at = ts.copy()
    if len(m.launches):
        launch = m.launches.drop_duplicates("correlation").set_index("correlation")
        corr = runs["correlation"].to_numpy()
        known = np.isin(corr, launch.index.to_numpy()) & (np.array(where) == coll.KERNEL)
        issued_at[known] = launch.loc[corr[known], "launch_ts"].to_numpy(dtype=float)
        _named_by_call(comms, kinds, known, issued_at, launch.loc[corr[known], "tid"].to_numpy())
    k = launch_steps(m.steps, issued_at)
    numbers = np.array([s.number for s in m.steps], dtype=np.int64)
    step = np.where(k >= 0, numbers[np.clip(k, 0, None)] if len(numbers) else -1, -1)
    pg = runs["pg"].astype(str).tolist()
    order = np.zeros(len(runs), dtype=np.int64)
    seen: dict = {}
    for i, key in enumerate(zip(step.tolist(), pg, kinds)):
        order[i] = seen.get(key, 0)
        seen[key] = order[i] + 1
    base = float(model.meta.base_ts_us)
    end = runs["end"].to_numpy(dtype=float)
    return RankCollectives(
        step=step, kind=kinds, pg=pg, seq=runs["seq"].to_numpy(dtype=np.int64), order=order,
        start_us=ts + base, end_us=end + base, nelems=runs["in_nelems"].to_numpy(dtype=float), where=where,
        busy=_own_work(model, m, runs, base), base_us=base, issued_us=issued_at,
        correlation=np.where(np.array(where) == coll.KERNEL, runs["correlation"].to_numpy(dtype=np.int64), -1),
    )


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
        ops = ops[name_mask(ops["name"], lambda n: coll.role(n, False) is None)]  # a c10d call is not work
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

"""The work that exists only to produce a synced value.

A user who removes `if p.grad.norm().item() > limit:` removes the norm op, its launch, the device→host
copy and the Python around them, not only the sync. Without data flow in the trace, the ops that feed a
scalar read are found by repetition: for a group of scalar reads from the same source (or op, without
stacks) that recurs within the steps, the top-level ops that immediately precede every read of the group
since the previous sync (the longest common run, nearest first, at most MAX_CHAIN ops) are its feeding
chain. Reads that follow each other with nothing in between (the values computed in a loop first, then
read one by one) form one burst, whose chain extends back over ops of the same kinds as its nearest ones.
A read that happens once per step (`loss.item()`) has no repeated chain and nothing is removed
with it: the loss is needed for the backward pass anyway. When the chain covers everything since the
previous sync, the Python between the two goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.calls import SCALAR_OPS
from gpuadvise.analyzer.model.trace import TraceModel

MAX_CHAIN = 4  # ops traced back from a scalar read: enough for norm/abs/max/compare chains


@dataclass
class Feeding:
    lo: np.ndarray  # CPU intervals that disappear with the reads (their chain, the read, the Python around)
    hi: np.ndarray
    tid: np.ndarray  # the thread of each interval
    reads: int  # scalar reads with a feeding chain
    chain: list[str]  # op names of the most common chain, nearest first

    def covers(self, ts: np.ndarray, tid: np.ndarray) -> np.ndarray:
        """Whether each (time, thread) falls inside one of the intervals."""
        if not len(self.lo):
            return np.zeros(len(ts), dtype=bool)
        j = np.clip(np.searchsorted(self.lo, ts, side="right") - 1, 0, None)
        return (ts >= self.lo[j]) & (ts <= self.hi[j]) & (tid == self.tid[j])


def feeding_work(model: TraceModel, syncs: pd.DataFrame, nsteps: int) -> Feeding:
    """The feeding chains of the repeated scalar reads among `syncs` (metrics.sync_table rows)."""
    empty = Feeding(np.empty(0), np.empty(0), np.empty(0), 0, [])
    cpu = model.cpu
    if cpu.empty or syncs.empty:
        return empty
    reads = syncs[syncs["op"].isin(SCALAR_OPS)]
    if reads.empty:
        return empty
    lo, hi, tids, chains, nreads = [], [], [], [], 0
    for tid, on_thread in syncs.groupby("tid"):
        top = _top_level(cpu[(cpu["tid"] == tid) & ~cpu["is_annotation"]])
        if top.empty:
            continue
        t_ts, t_end, t_name = top["ts"].to_numpy(), top["end"].to_numpy(), top["name"].astype(str).to_numpy()
        sync_end = np.sort(on_thread["end"].to_numpy())
        mine = reads[reads["tid"] == tid]
        for _, group in mine.groupby(["source"] if mine["source"].astype(bool).any() else ["op"]):
            # one read = one external id (a copy and a sync); it must recur within the steps
            first = group.groupby("external_id", sort=False).agg(ts=("ts", "min"), end=("end", "max"))
            if len(first) < 2 * max(nsteps, 1):
                continue
            holders = np.searchsorted(t_ts, first["ts"].to_numpy(), side="right") - 1
            holders = np.unique(holders[(holders >= 0) & (t_end[np.clip(holders, 0, None)] >= first["end"].to_numpy())])
            units = []
            for burst in np.split(holders, np.flatnonzero(np.diff(holders) > 1) + 1):
                if not len(burst):
                    continue
                t = int(burst[0])
                k = np.searchsorted(sync_end, t_ts[t], side="right") - 1
                prev_sync = sync_end[k] if k >= 0 else -np.inf
                seed = [j for j in range(t - 1, max(t - 1 - MAX_CHAIN, -1), -1) if t_ts[j] >= prev_sync]
                units.append((burst, prev_sync, seed))
            common = _common_run([[t_name[j] for j in seed] for _, _, seed in units])
            if not common:
                continue
            kinds = set(common)
            for burst, prev_sync, seed in units:
                # the values may be computed in a loop before they are read (norms of every parameter,
                # then the reads): extend the chain back over ops of the same kinds
                j = seed[len(common) - 1] - 1
                while j >= 0 and t_ts[j] >= prev_sync and t_name[j] in kinds:
                    j -= 1
                first_op = j + 1
                start = t_ts[first_op]
                # nothing but the chain since the previous sync: the op before it holds that sync (or is older)
                if (j < 0 or t_ts[j] < prev_sync) and np.isfinite(prev_sync):
                    start = prev_sync  # its Python goes too
                lo.append(start)
                hi.append(t_end[int(burst[-1])])
                tids.append(tid)
                nreads += len(burst)
            chains.append(common)
    if not lo:
        return empty
    order = np.argsort(lo, kind="stable")
    return Feeding(np.asarray(lo)[order], np.asarray(hi)[order], np.asarray(tids)[order], nreads, max(chains, key=len))


def _top_level(ops: pd.DataFrame) -> pd.DataFrame:
    """Ops not nested inside an earlier op on the same thread, in time order."""
    ops = ops.sort_values(["ts", "end"], ascending=[True, False], kind="stable")
    ends = ops["end"].to_numpy()
    before = np.concatenate([[-np.inf], np.maximum.accumulate(ends)[:-1]]) if len(ends) else ends
    return ops[ops["ts"].to_numpy() >= before]


def _common_run(chains: list[list[str]]) -> list[str]:
    """The longest run of op names (nearest first) that every chain starts with."""
    if not chains:
        return []
    out = []
    for names in zip(*chains):
        if len(set(names)) != 1:
            break
        out.append(names[0])
    return out

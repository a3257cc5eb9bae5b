"""The work that exists only to produce a synced value.

A user who removes `if p.grad.norm().item() > limit:` removes the norm op, its launch, the device→host
copy and the Python around them, not only the sync. Without data flow in the trace, the ops that feed a
scalar read are found by repetition: for a group of scalar reads from the same source (or op, without
stacks) that recurs within the steps, the top-level ops that immediately precede every read of the group
since the previous sync (the longest common run, nearest first, at most MAX_CHAIN ops) are its feeding
chain. A read that happens once per step (`loss.item()`) has no repeated chain and nothing is removed
with it: the loss is needed for the backward pass anyway. When the chain covers everything since the
previous sync, the Python between the two goes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .metrics import SCALAR_OPS
from gpuadvise.analyzer.model.trace import TraceModel

MAX_CHAIN = 4  # ops traced back from a scalar read: enough for norm/abs/max/compare chains


@dataclass
class Feeding:
    lo: np.ndarray  # CPU intervals that disappear with the reads (their chain, the read, the Python around)
    hi: np.ndarray
    reads: int  # scalar reads with a feeding chain
    chain: list[str]  # op names of the most common chain, nearest first

    def covers(self, ts: np.ndarray) -> np.ndarray:
        """Whether each time falls inside one of the intervals."""
        if not len(self.lo):
            return np.zeros(len(ts), dtype=bool)
        j = np.searchsorted(self.lo, ts, side="right") - 1
        return (j >= 0) & (ts <= self.hi[np.clip(j, 0, None)])


def feeding_work(model: TraceModel, syncs: pd.DataFrame, nsteps: int) -> Feeding:
    """The feeding chains of the repeated scalar reads among `syncs` (metrics.sync_table rows)."""
    empty = Feeding(np.empty(0), np.empty(0), 0, [])
    cpu = model.cpu
    if cpu.empty or syncs.empty:
        return empty
    reads = syncs[syncs["op"].isin(SCALAR_OPS)]
    if reads.empty:
        return empty
    lo, hi, chains = [], [], []
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
            found = []
            for ts, end in zip(first["ts"].to_numpy(), first["end"].to_numpy()):
                t = np.searchsorted(t_ts, ts, side="right") - 1  # the top-level op holding the read
                if t < 0 or t_end[t] < end:
                    continue
                k = np.searchsorted(sync_end, t_ts[t], side="right") - 1
                prev_sync = sync_end[k] if k >= 0 else -np.inf
                back = [j for j in range(t - 1, max(t - 1 - MAX_CHAIN, -1), -1) if t_ts[j] >= prev_sync]
                found.append((t, prev_sync, back))
            common = _common_run([[t_name[j] for j in back] for _, _, back in found])
            if not common:
                continue
            n = len(common)
            for t, prev_sync, back in found:
                start = t_ts[back[n - 1]]
                # nothing but the chain since the previous sync: the op before it holds that sync (or is older)
                everything = len(back) == n and (back[-1] == 0 or t_ts[back[-1] - 1] < prev_sync)
                if everything and np.isfinite(prev_sync):
                    start = prev_sync  # nothing else since the previous sync: its Python goes too
                lo.append(start)
                hi.append(t_end[t])
            chains.append(common)
    if not lo:
        return empty
    order = np.argsort(lo)
    return Feeding(np.asarray(lo)[order], np.asarray(hi)[order], len(lo), max(chains, key=len))


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

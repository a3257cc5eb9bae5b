"""Collectives lined up across ranks: for every rank and collective, the time it waited for the last rank
to arrive, and the time the transfer itself took.

Matching: a collective is the same on every rank when it has the same process group and sequence number
(newer torch records both), else the same step, group, collective and place among those of its step
(every rank of an SPMD job issues its collectives in the same order; model/collectives.py says what a
collective is on each backend). Only the collectives found on every traced rank are measured.

Clocks: the ranks' clocks are lined up by the collectives themselves. An all-reduce, all-gather,
reduce-scatter, all-to-all or barrier ends at the same moment on every rank (no rank is done before all
have sent), so the median difference of their ends is the offset between two ranks' clocks; ranks on one
host come out at ~0, ranks on hosts whose clocks differ are moved onto the first rank's.

Per collective and rank, on the aligned clock:
- arrival: its start there (the rank's data was ready and its stream or backend thread got to it);
- wait: (last rank's arrival) − (its own arrival), at most the time it spent inside the collective;
- transfer: the rest of that time;
- exposed wait: the part of the wait the rank did nothing else (no compute kernel for a GPU collective,
  no op on its training threads for a CPU backend's): the time its step lost to the wait;
- the last rank to arrive is the one the others waited for.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from . import intervals as iv
from gpuadvise.analyzer.model.collectives import SYMMETRIC


SLACK_US = 50.0  # how far a rank's clock reading of "the collective ended" may precede another's "arrived"


@dataclass
class Matched:
    """The collectives every traced rank ran, arrays shaped (ranks, collectives) unless noted."""

    step: np.ndarray  # (n,) ProfilerStep number of the iteration that issued it
    kind: list[str]  # (n,)
    pg: list[str]  # (n,)
    arrival: np.ndarray  # aligned clock, µs
    dur: np.ndarray
    wait: np.ndarray
    exposed_wait: np.ndarray
    transfer: np.ndarray
    exposed_transfer: np.ndarray
    last: np.ndarray  # (n,) index of the rank that arrived last
    offsets_us: np.ndarray  # (ranks,) each rank's clock minus the first rank's
    start: np.ndarray  # each rank's own clock: when it arrived (to measure time against its own work)
    busy: list  # per rank, its own work during its collectives (measure.collectives.RankCollectives.busy)
    unmatched: int  # collectives not found once on every traced rank, or whose ends do not line up
    keys: list  # (n,) each collective's key on the first rank (measure.collectives.RankCollectives.keys)
    by: str  # how they were matched: "sequence number" or "order within the step"

    def __len__(self) -> int:
        return len(self.step)


def match(collectives: list) -> Matched | None:
    """`collectives`: one measure.collectives.RankCollectives (or None) per rank, in rank order."""
    if len(collectives) < 2 or any(c is None or not len(c) for c in collectives):
        return None
    keyed = []
    for c in collectives:
        keys = c.keys()
        counts = Counter(keys)
        keyed.append({k: i for i, k in enumerate(keys) if counts[k] == 1})
    common = set(keyed[0])
    for k in keyed[1:]:
        common &= set(k)
    if not common:
        return None
    first = collectives[0]
    order = sorted(common, key=lambda k: keyed[0][k])  # the first rank's issue order
    idx = np.array([[k[key] for key in order] for k in keyed], dtype=np.int64)  # (ranks, n)
    start = np.stack([c.start_us[i] for c, i in zip(collectives, idx)])
    end = np.stack([c.end_us[i] for c, i in zip(collectives, idx)])
    kinds = [first.kind[i] for i in idx[0]]
    offsets = _offsets(start, end, kinds)
    # a collective every rank finishes together cannot end on one rank before another arrived: a match that
    # does (clocks aligned) paired different collectives (ranks in different process groups)
    together = np.array([k in SYMMETRIC for k in kinds], dtype=bool)
    early = (end - offsets[:, None]).min(axis=0) < (start - offsets[:, None]).max(axis=0) - SLACK_US
    keep = ~(together & early)
    if not keep.any():
        return None
    idx, start, end = idx[:, keep], start[:, keep], end[:, keep]
    kinds = [k for k, ok in zip(kinds, keep.tolist()) if ok]
    order = [k for k, ok in zip(order, keep.tolist()) if ok]
    arrival = start - offsets[:, None]
    dur = end - start
    last_arrival = arrival.max(axis=0)
    wait = np.clip(last_arrival[None, :] - arrival, 0.0, dur)
    transfer = dur - wait
    busy_wait = np.stack([iv.covered(*c.busy, s, s + w) for c, s, w in zip(collectives, start, wait)])
    busy_transfer = np.stack([iv.covered(*c.busy, s + w, e) for c, s, w, e in zip(collectives, start, wait, end)])
    total = sum(len(c) for c in collectives)
    return Matched(
        step=first.step[idx[0]], kind=kinds, pg=[first.pg[i] for i in idx[0]],
        arrival=arrival, dur=dur, wait=wait, exposed_wait=np.clip(wait - busy_wait, 0.0, None),
        transfer=transfer, exposed_transfer=np.clip(transfer - busy_transfer, 0.0, None),
        last=np.argmax(arrival, axis=0), offsets_us=offsets, start=start, busy=[c.busy for c in collectives],
        unmatched=total - len(collectives) * len(order), keys=list(order),
        by="sequence number" if order[0][0] == "seq" else "order within the step",
    )


def _offsets(start: np.ndarray, end: np.ndarray, kinds: list[str]) -> np.ndarray:
    """Each rank's clock minus the first rank's. Clocks are moved only when the trace proves them apart: a
    collective that ends together everywhere ends on each rank after every rank arrived, which bounds the
    offset from both sides; 0 when it lies within the bounds (one host, or clocks in sync), else the
    nearest bound. When the bounds contradict each other (some pairs are not one collective), the median
    difference of the ends, where it exceeds the time the ranks spent in them."""
    together = np.array([k in SYMMETRIC for k in kinds], dtype=bool)
    pick = together if together.any() else np.ones(len(kinds), dtype=bool)
    s, e = start[:, pick], end[:, pick]
    out = np.zeros(len(start))
    for r in range(1, len(start)):
        lo, hi = float((s[r] - e[0]).max()), float((e[r] - s[0]).min())
        if lo <= hi:
            out[r] = min(max(0.0, lo), hi)
        else:
            diff = float(np.median(e[r] - e[0]))
            out[r] = diff if abs(diff) > float(np.median(np.minimum(e[r] - s[r], e[0] - s[0]))) else 0.0
    return out


def exposed_per_step(m: Matched, steps: list[int], part: str = "wait", cols=None,
                     less_own_work: bool = True) -> np.ndarray:
    """(ranks, steps): the time each step lost to its collectives' waits (`part` "wait") or transfers
    ("transfer"): their union on the rank's own clock minus its own work, so collectives that run at
    the same time (DDP's buckets on two gloo threads) count once. `cols`: only those collectives;
    `less_own_work` False: the whole union (the time the transfers took, overlapped or not)."""
    out = np.zeros((m.dur.shape[0], len(steps)))
    cols = np.arange(len(m)) if cols is None else np.asarray(cols)
    for j, s in enumerate(steps):
        mine = cols[m.step[cols] == s]
        if not len(mine):
            continue
        for r in range(out.shape[0]):
            lo = m.start[r, mine] if part == "wait" else m.start[r, mine] + m.wait[r, mine]
            hi = m.start[r, mine] + (m.wait[r, mine] if part == "wait" else m.dur[r, mine])
            spans = iv.union(lo, hi)
            mine_busy = iv.total(*iv.intersect(spans, m.busy[r])) if less_own_work else 0.0
            out[r, j] = max(0.0, iv.total(*spans) - mine_busy)
    return out


def caused(m: Matched, steps: list[int]) -> np.ndarray:
    """(ranks, steps): the wait each rank caused: the exposed wait of the other ranks in the collectives it
    arrived last at (per step, each other rank's counted once), the median over them."""
    ranks = m.dur.shape[0]
    out = np.zeros((ranks, len(steps)))
    for r in range(ranks):
        mine = np.flatnonzero(m.last == r)
        if len(mine) and ranks > 1:
            lost = exposed_per_step(m, steps, "wait", mine)
            out[r] = np.median(np.delete(lost, r, axis=0), axis=0)
    return out


def by_collective(m: Matched, rank_ids: list[int], steps: list[int], step_us: np.ndarray | None = None) -> list[dict]:
    """Waits per collective (kind and group), per rank: median per step over the matched steps, measured as
    the job's wait and transfer are (`exposed_per_step`: collectives that run at the same time count once;
    the wait at most the step, `step_us` (ranks, steps)), so that a rank's one kind of collective shows the
    job table's wait."""
    rows = []
    groups: dict = {}
    for i, key in enumerate(zip(m.kind, m.pg)):
        groups.setdefault(key, []).append(i)
    nsteps = max(len(steps), 1)
    for (kind, pg), cols in sorted(groups.items(), key=lambda kv: -float(m.exposed_wait[:, kv[1]].sum())):
        cols_a = np.array(cols)
        wait = exposed_per_step(m, steps, "wait", cols=cols_a)
        if step_us is not None:
            wait = np.minimum(wait, step_us)
        transfer = exposed_per_step(m, steps, "transfer", cols=cols_a, less_own_work=False)
        last = Counter(int(m.last[i]) for i in cols)
        rows.append({
            "collective": kind, "group": pg, "per_step": round(len(cols) / nsteps, 1),
            "ranks": [{"rank": r, "wait_ms": _ms(np.median(wait[j])) if len(steps) else 0.0,
                       "transfer_ms": _ms(np.median(transfer[j])) if len(steps) else 0.0,
                       "last_arrivals": last.get(j, 0)} for j, r in enumerate(rank_ids)],
        })
    return rows


def _ms(us) -> float:
    return round(float(us) / 1e3, 3)

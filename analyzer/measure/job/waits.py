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

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..basics import intervals as iv
from gpuadvise.analyzer.model.collectives import SYMMETRIC


SLACK_US = 50.0  # how far a rank's clock reading of "the collective ended" may precede another's "arrived"


@dataclass
class Matched:
    """The collectives lined up across the traced ranks, arrays shaped (ranks, collectives) unless noted. A
    collective of a process group that not every traced rank belongs to (a device mesh's) has its members
    in `member`; the other ranks' entries are 0 (NaN for `start`) and never read."""

    step: np.ndarray  # (n,) ProfilerStep number of the iteration that issued it
    kind: list[str]  # (n,)
    pg: list[str]  # (n,) its group as shown beside it (commgroups.Resolved.shown)
    arrival: np.ndarray  # aligned clock, µs
    dur: np.ndarray
    wait: np.ndarray
    exposed_wait: np.ndarray
    transfer: np.ndarray
    exposed_transfer: np.ndarray
    last: np.ndarray  # (n,) index of the rank that arrived last
    offsets_us: np.ndarray  # (ranks,) each rank's clock minus the first rank's
    start: np.ndarray  # each rank's own clock: when it arrived (to measure time against its own work)
    busy: list  # per rank, its own work during its collectives (measure.job.collectives.RankCollectives.busy)
    unmatched: int  # collectives not found once on every traced rank of their group, or whose ends do not line up
    keys: list  # (n,) each collective's key (measure.job.collectives.RankCollectives.keys)
    by: str  # how they were matched: "Comms Id", "sequence number" or "order within the step"
    member: np.ndarray | None = None  # (ranks, n) bool: the ranks it ran on (None: every rank)
    group: list = field(default_factory=list)  # (n,) its group's id (commgroups.Group.id)
    phase: list = field(default_factory=list)  # (n,) "forward", "backward", "optimizer", "" (measure/job/commphases.py)
    scheme: list = field(default_factory=list)  # (n,) "fsdp", "tp", "pp", "a2a", "ddp", "dp", "optimizer", ""

    def __len__(self) -> int:
        return len(self.step)

    def on(self, r: int, cols: np.ndarray) -> np.ndarray:
        """The columns among `cols` that rank (position) r ran."""
        cols = np.asarray(cols, dtype=np.int64)
        return cols if self.member is None else cols[self.member[r, cols]]


def match(collectives: list, groups=None) -> Matched | None:
    """`collectives`: one measure.job.collectives.RankCollectives (or None) per rank, in rank order; `groups`:
    their process groups (commgroups.Resolved; None: every collective is one of all the traced ranks)."""
    if len(collectives) < 2 or any(c is None or not len(c) for c in collectives):
        return None
    ranks = len(collectives)
    keyed, group_of = [], {}
    for r, c in enumerate(collectives):
        rows = groups.rows[r] if groups is not None else None
        keys = c.keys(rows)
        counts = Counter(keys)
        keyed.append({k: i for i, k in enumerate(keys) if counts[k] == 1})
        if rows is not None:
            for k, i in keyed[-1].items():
                group_of.setdefault(k, rows[i])
    expected = {gid: set(groups.members(gid)) for gid in groups.groups} if groups is not None else {}
    everyone = set(range(ranks))
    present: dict = defaultdict(set)
    for r, k in enumerate(keyed):
        for key in k:
            present[key].add(r)
    common = [key for key, on in present.items()
              if len(on) >= 2 and on == expected.get(group_of.get(key), everyone)]
    if not common:
        return None
    first = {key: min(present[key]) for key in common}
    order = sorted(common, key=lambda key: (0, keyed[0][key]) if 0 in present[key] else
                   (1, float(collectives[first[key]].start_us[keyed[first[key]][key]])))
    n = len(order)
    idx = np.full((ranks, n), -1, dtype=np.int64)
    for r, k in enumerate(keyed):
        idx[r] = [k.get(key, -1) for key in order]
    member = idx >= 0
    start = np.full((ranks, n), np.nan)
    end = np.full((ranks, n), np.nan)
    for r, c in enumerate(collectives):
        on = member[r]
        start[r, on], end[r, on] = c.start_us[idx[r, on]], c.end_us[idx[r, on]]
    owner = np.argmax(member, axis=0)  # each collective's first member: its kind, step and place
    rows_of = idx[owner, np.arange(n)]
    kinds = [collectives[o].kind[i] for o, i in zip(owner.tolist(), rows_of.tolist())]
    offsets = _offsets(start, end, kinds, member)
    # a collective every rank finishes together cannot end on one rank before another arrived: a match that
    # does (clocks aligned) paired different collectives (ranks in different process groups)
    together = np.array([k in SYMMETRIC for k in kinds], dtype=bool)
    shifted_s, shifted_e = start - offsets[:, None], end - offsets[:, None]
    early = np.nanmin(shifted_e, axis=0) < np.nanmax(shifted_s, axis=0) - SLACK_US
    keep = ~(together & early)
    if not keep.any():
        return None
    idx, start, end, member, owner, rows_of = (x[:, keep] if x.ndim == 2 else x[keep]
                                              for x in (idx, start, end, member, owner, rows_of))
    kinds = [k for k, ok in zip(kinds, keep.tolist()) if ok]
    order = [k for k, ok in zip(order, keep.tolist()) if ok]
    arrival = start - offsets[:, None]
    dur = np.where(member, end - start, 0.0)
    last_arrival = np.nanmax(arrival, axis=0)
    wait = np.where(member, np.clip(last_arrival[None, :] - np.nan_to_num(arrival), 0.0, dur), 0.0)
    transfer = dur - wait
    busy_wait, busy_transfer = np.zeros_like(dur), np.zeros_like(dur)
    for r, c in enumerate(collectives):
        on = member[r]
        s, w, e = start[r, on], wait[r, on], end[r, on]
        busy_wait[r, on] = iv.covered(*c.busy, s, s + w)
        busy_transfer[r, on] = iv.covered(*c.busy, s + w, e)
    total = sum(len(c) for c in collectives)
    everywhere = bool(member.all())

    def of_owner(field_name: str, default: str = "") -> list:
        out = []
        for o, i in zip(owner.tolist(), rows_of.tolist()):
            values = getattr(collectives[o], field_name)
            out.append(values[i] if values else default)
        return out

    gids = [group_of.get(key, "") for key in order]
    return Matched(
        step=np.array([collectives[o].step[i] for o, i in zip(owner.tolist(), rows_of.tolist())], dtype=np.int64),
        kind=kinds, pg=[groups.shown(g, ranks) for g in gids] if groups is not None else of_owner("pg"),
        arrival=arrival, dur=dur, wait=wait, exposed_wait=np.clip(wait - busy_wait, 0.0, None),
        transfer=transfer, exposed_transfer=np.clip(transfer - busy_transfer, 0.0, None),
        last=np.argmax(np.where(member, arrival, -np.inf), axis=0), offsets_us=offsets, start=start,
        busy=[c.busy for c in collectives], unmatched=total - int(member.sum()), keys=list(order),
        by={"id": "Comms Id", "seq": "sequence number"}.get(order[0][0], "order within the step"),
        member=None if everywhere else member, group=gids, phase=of_owner("phase"), scheme=of_owner("scheme"),
    )


def _offsets(start: np.ndarray, end: np.ndarray, kinds: list[str], member: np.ndarray) -> np.ndarray:
    """Each rank's clock minus the first rank's. Clocks are moved only when the trace proves them apart: a
    collective that ends together everywhere ends on each rank after every rank arrived, which bounds the
    offset between two ranks that ran it from both sides; 0 when it lies within the bounds (one host, or
    clocks in sync), else the nearest bound. When the bounds contradict each other (some pairs are not one
    collective), the median difference of the ends, where it exceeds the time the ranks spent in them.
    Ranks that share no collective with the first (a device mesh's) are reached through ranks that do."""
    together = np.array([k in SYMMETRIC for k in kinds], dtype=bool)
    out = np.zeros(len(start))
    known, queue = {0}, [0]
    while queue:
        p = queue.pop(0)
        for r in range(1, len(start)):
            if r in known:
                continue
            both = member[p] & member[r]
            if not both.any():
                continue
            pick = both & together if (both & together).any() else both
            s_p, e_p, s_r, e_r = start[p, pick], end[p, pick], start[r, pick], end[r, pick]
            lo, hi = float((s_r - e_p).max()), float((e_r - s_p).min())
            if lo <= hi:
                rel = min(max(0.0, lo), hi)
            else:
                diff = float(np.median(e_r - e_p))
                rel = diff if abs(diff) > float(np.median(np.minimum(e_r - s_r, e_p - s_p))) else 0.0
            out[r] = out[p] + rel
            known.add(r)
            queue.append(r)
    return out


def exposed_per_step(m: Matched, steps: list[int], part: str = "wait", cols=None,
                     less_own_work: bool = True) -> np.ndarray:
    """(ranks, steps): the time each step lost to its collectives' waits (`part` "wait"), transfers
    ("transfer") or whole time inside them ("inside"): their union on the rank's own clock minus its own
    work, so collectives that run at the same time (DDP's buckets on two gloo threads) count once. `cols`:
    only those collectives; `less_own_work` False: the whole union (the time they took, overlapped or not)."""
    out = np.zeros((m.dur.shape[0], len(steps)))
    cols = np.arange(len(m)) if cols is None else np.asarray(cols, dtype=np.int64)
    for j, s in enumerate(steps):
        mine = cols[m.step[cols] == s]
        if not len(mine):
            continue
        for r in range(out.shape[0]):
            ran = m.on(r, mine)
            if not len(ran):
                continue
            lo = m.start[r, ran] + (m.wait[r, ran] if part == "transfer" else 0.0)
            hi = m.start[r, ran] + (m.wait[r, ran] if part == "wait" else m.dur[r, ran])
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
            others = np.ones(ranks, dtype=bool) if m.member is None else m.member[:, mine].any(axis=1)
            others[r] = False
            if others.any():
                out[r] = np.median(lost[others], axis=0)
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
                       "last_arrivals": last.get(j, 0)} for j, r in enumerate(rank_ids)
                      if m.member is None or m.member[j, cols_a].any()],
        })
    return rows


def _ms(us) -> float:
    return round(float(us) / 1e3, 3)

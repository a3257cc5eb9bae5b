"""What a fix saves the job, not one rank: each rank's steps replayed side by side, with every collective
ending when its last rank arrives.

Each rank's step is its own work between the collectives lined up across the ranks (measure/job/waits.py).
On the aligned clock, rank r reaches collective k either after its earlier collectives ended, when it was
held by them (the latest of their ends came after its previous arrival and before this one), plus the
work after that; or else after its previous arrival plus the work between them (collectives it did not
wait for: asynchronous ones, or several in flight at once, as DDP's buckets on gloo's two threads). Collective k ends on rank r at (last arrival) + (the time
r stayed in it after the last arrival, its transfer). Replayed as recorded, this gives back every arrival
and end of the trace.

A fix takes `saved_us` of work out of each step of the ranks that show its cause (spread over the work
between their collectives, in proportion to it), or takes collectives away (`dropped`: no_sync() drops
the all-reduces of all but the last micro-batch): a dropped collective holds no rank, each goes on from
where it arrived. The replay then moves every arrival, so a collective ends earlier only when its *last*
rank arrives earlier. The job's step is its longest rank's, and the
saving is 1 − (job step after) / (job step as replayed), over the steps every rank recorded.
"""

from __future__ import annotations

import numpy as np

from .job import JobView


def job_saving_pct(view: JobView, saved_us: dict[int, float], dropped: set | None = None,
                   hidden: np.ndarray | None = None) -> float | None:
    """% of the job's step saved when rank r loses `saved_us[r]` µs of its own work per step (ranks not in
    it: none), the collectives whose keys are in `dropped` go away, and the lined-up collectives whose
    indices are in `hidden` stop holding their ranks for their exposed transfer (it runs behind their
    work); None without steps every rank recorded."""
    if not view.steps:
        return None
    before = after = 0.0
    for j, step in enumerate(view.steps):
        base, fixed = _step(view, j, step, saved_us, dropped or set(), hidden)
        before += base
        after += fixed
    return max(0.0, 100.0 * (1.0 - after / before)) if before > 0 else None


def _step(view: JobView, j: int, step: int, saved_us: dict[int, float], dropped: set,
          hidden: np.ndarray | None = None) -> tuple[float, float]:
    """The job's step time (the longest rank's) as replayed, and with the fix. A collective of a group that
    not every rank is in holds only its ranks: for the others it is not there."""
    g, m = view.grid, view.matched
    dur = g["dur_us"][:, j]
    saved = np.array([saved_us.get(int(r.rank), 0.0) for r in view.ranks])
    cols = np.flatnonzero(m.step == step) if m is not None else np.zeros(0, dtype=np.int64)
    if not len(cols):  # nothing to wait on: each rank's step shrinks on its own
        return float(dur.max()), float(np.maximum(dur - np.minimum(saved, dur), 0.0).max())
    on = np.ones((len(dur), len(cols)), dtype=bool) if m.member is None else m.member[:, cols]
    first = m.arrival[0, cols] if m.member is None else np.nanmin(np.where(on, m.arrival[:, cols], np.nan), axis=0)
    order = np.argsort(first, kind="stable")
    cols, on = cols[order], on[:, order]
    start = np.array([r.start_us[r.steps.index(step)] + r.base_us for r in view.ranks]) - m.offsets_us
    # a rank outside a collective's group reaches it where it left its previous one: no gap, no hold
    a = _carried(np.where(on, m.arrival[:, cols], np.nan), start)
    e = np.where(on, a + m.dur[:, cols], -np.inf)
    # time in a collective that is not work (carried past the collectives a rank is not in, to its next one)
    lost = _carried(np.where(on, m.exposed_wait[:, cols] + m.exposed_transfer[:, cols], np.nan), np.zeros(len(start)))
    end = start + dur
    # per rank and collective: was it held until its earlier collectives ended (the latest of them ended
    # after its previous arrival, before this one), and how much of its own work lies before it
    prev_a = np.concatenate([start[:, None], a[:, :-1]], axis=1)
    last_e = np.maximum.accumulate(e, axis=1)
    prev_e = np.concatenate([np.full((len(start), 1), -np.inf), last_e[:, :-1]], axis=1)
    prev_lost = np.concatenate([np.zeros((len(start), 1)), lost[:, :-1]], axis=1)
    held = on & (a >= prev_e) & (prev_e > prev_a)
    work = np.where(held, a - prev_e, np.maximum(a - prev_a - prev_lost, 0.0))
    gap = np.where(held, a - prev_e, a - prev_a)  # from the end (held) or from the previous arrival
    tail_held = (end >= last_e[:, -1]) & (last_e[:, -1] > a[:, -1])
    tail = np.where(tail_held, end - last_e[:, -1], end - a[:, -1])
    tail_work = np.where(tail_held, tail, np.maximum(tail - lost[:, -1], 0.0))
    total = work.sum(axis=1) + tail_work
    share = np.where(total > 0, np.minimum(saved, total) / np.where(total > 0, total, 1.0), 0.0)
    cut, tail_cut = work * share[:, None], tail_work * share
    last_arrival = np.max(np.where(on, a, -np.inf), axis=0, keepdims=True)
    stay = np.where(on, e - last_arrival, -np.inf)  # each rank's time in a collective after its last rank arrived
    replay = (start, held, gap, on, tail_held, tail)
    gone = np.array([m.keys[i] in dropped for i in cols], dtype=bool)
    quicker = np.zeros_like(stay)
    if hidden is not None and len(hidden):
        hide = np.isin(cols, hidden)
        quicker[:, hide] = np.where(on[:, hide], m.exposed_transfer[:, cols[hide]], 0.0)
    base = _replay(*replay, stay, np.zeros_like(cut), np.zeros_like(tail_cut), np.zeros_like(gone))
    fixed = _replay(*replay, stay - quicker, cut, tail_cut, gone)
    return float((base - start).max()), float((fixed - start).max())


def _carried(arrival: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Arrivals with a rank's missing ones (NaN: not in that collective's group) set to its previous
    arrival, or its step's start before any."""
    out = arrival.copy()
    prev = start.copy()
    for k in range(out.shape[1]):
        missing = np.isnan(out[:, k])
        out[missing, k] = prev[missing]
        prev = out[:, k]
    return out


def _replay(start, held, gap, on, tail_held, tail, stay, cut, tail_cut, gone) -> np.ndarray:
    """Each rank's step end, collective by collective (module docstring): `ended` is the latest end of
    the collectives so far (a dropped one ends nothing); a collective waits for its own ranks only."""
    ranks, n = gap.shape
    arrive = start.copy()
    ended = np.full(ranks, -np.inf)
    for k in range(n):
        arrive = np.where(held[:, k], np.maximum(ended, arrive), arrive) + gap[:, k] - cut[:, k]
        if not gone[k]:
            last = np.max(np.where(on[:, k], arrive, -np.inf))
            ended = np.maximum(ended, np.where(on[:, k], last + stay[:, k], -np.inf))
    return np.where(tail_held, np.maximum(ended, arrive), arrive) + tail - tail_cut



def held_by(view: JobView, rank: int, saved_us: float) -> str:
    """Why `saved_us` of work saved per step on `rank` hardly shortens the job's step, in words: the rank
    waits for another one anyway (its exposed wait is at least half the saving: the collective it waits
    longest in, and the rank that arrived last there, weighted by the wait); or it begins its steps late
    and the others wait for that, not for its work; or another rank's step sets the job's."""
    ids = view.rank_ids
    if rank not in ids or not view.steps:
        return f"rank {rank}'s step is not the one that sets the job's pace"
    i, g = ids.index(rank), view.grid
    wait = float(np.median(g["wait_us"][i]))
    if wait >= 0.5 * saved_us and wait > 0:
        whom, kind = _waits_for(view, i)
        where = f" in {kind.replace('_', '-')}" if kind else ""
        return f"rank {rank} waits for rank {whom}{where} anyway ({wait / 1e3:.2f} ms per step)"
    late = float(np.median(g["late_us"][i]))
    caused = float(np.median(g["caused_us"][i]))
    if caused > 0 and late >= 0.5 * caused:
        return (f"rank {rank} begins its steps {late / 1e3:.2f} ms after the other ranks, and they wait for that "
                f"late start ({caused / 1e3:.2f} ms per step), not for its work")
    longest = int(np.argmax(np.median(g["dur_us"], axis=1)))
    return (f"the job's step is set by rank {ids[longest]} ({float(np.median(g['dur_us'][longest])) / 1e3:.2f} ms "
            "per step)" if longest != i else f"rank {rank}'s saved time does not reach the collectives that end the "
            "job's step")


def _waits_for(view: JobView, i: int) -> tuple[int, str | None]:
    """The rank that rank index `i` waits for most, and in which collective (None without matched ones)."""
    ids, m = view.rank_ids, view.matched
    if m is None or not len(m):
        return ids[int(np.argmax(view.grid["work_us"].sum(axis=1)))], None
    by_kind: dict = {}
    for k, kind in enumerate(m.kind):
        if m.step[k] in view.steps:
            by_kind.setdefault(kind, []).append(k)
    if not by_kind:
        return ids[int(np.argmax(view.grid["work_us"].sum(axis=1)))], None
    kind, cols = max(by_kind.items(), key=lambda kv: float(m.exposed_wait[i, kv[1]].sum()))
    weight: dict = {}
    for k in cols:
        weight[int(m.last[k])] = weight.get(int(m.last[k]), 0.0) + float(m.exposed_wait[i, k])
    return ids[max(weight, key=weight.get)], kind

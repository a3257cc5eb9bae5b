"""What a fix saves the job, not one rank: each rank's steps replayed side by side, with every collective
ending when its last rank arrives.

Each rank's step is its own work between the collectives lined up across the ranks (measure/waits.py).
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


def job_saving_pct(view: JobView, saved_us: dict[int, float], dropped: set | None = None) -> float | None:
    """% of the job's step saved when rank r loses `saved_us[r]` µs of its own work per step (ranks not in
    it: none) and the collectives whose keys are in `dropped` go away; None without steps every rank
    recorded."""
    if not view.steps:
        return None
    before = after = 0.0
    for j, step in enumerate(view.steps):
        base, fixed = _step(view, j, step, saved_us, dropped or set())
        before += base
        after += fixed
    return max(0.0, 100.0 * (1.0 - after / before)) if before > 0 else None


def _step(view: JobView, j: int, step: int, saved_us: dict[int, float], dropped: set) -> tuple[float, float]:
    """The job's step time (the longest rank's) as replayed, and with the fix."""
    g, m = view.grid, view.matched
    dur = g["dur_us"][:, j]
    saved = np.array([saved_us.get(int(r.rank), 0.0) for r in view.ranks])
    cols = np.flatnonzero(m.step == step) if m is not None else np.zeros(0, dtype=np.int64)
    if not len(cols):  # nothing to wait on: each rank's step shrinks on its own
        return float(dur.max()), float(np.maximum(dur - np.minimum(saved, dur), 0.0).max())
    cols = cols[np.argsort(m.arrival[0, cols], kind="stable")]
    start = np.array([r.start_us[r.steps.index(step)] + r.base_us for r in view.ranks]) - m.offsets_us
    a, e = m.arrival[:, cols], m.arrival[:, cols] + m.dur[:, cols]
    lost = m.exposed_wait[:, cols] + m.exposed_transfer[:, cols]  # time in a collective that is not work
    end = start + dur
    # per rank and collective: was it held until its earlier collectives ended (the latest of them ended
    # after its previous arrival, before this one), and how much of its own work lies before it
    prev_a = np.concatenate([start[:, None], a[:, :-1]], axis=1)
    last_e = np.maximum.accumulate(e, axis=1)
    prev_e = np.concatenate([np.full((len(start), 1), -np.inf), last_e[:, :-1]], axis=1)
    prev_lost = np.concatenate([np.zeros((len(start), 1)), lost[:, :-1]], axis=1)
    held = (a >= prev_e) & (prev_e > prev_a)
    work = np.where(held, a - prev_e, np.maximum(a - prev_a - prev_lost, 0.0))
    gap = np.where(held, a - prev_e, a - prev_a)  # from the end (held) or from the previous arrival
    tail_held = (end >= last_e[:, -1]) & (last_e[:, -1] > a[:, -1])
    tail = np.where(tail_held, end - last_e[:, -1], end - a[:, -1])
    tail_work = np.where(tail_held, tail, np.maximum(tail - lost[:, -1], 0.0))
    total = work.sum(axis=1) + tail_work
    share = np.where(total > 0, np.minimum(saved, total) / np.where(total > 0, total, 1.0), 0.0)
    cut, tail_cut = work * share[:, None], tail_work * share
    stay = e - a.max(axis=0, keepdims=True)  # each rank's time in a collective after its last rank arrived
    replay = (start, held, gap, stay, tail_held, tail)
    gone = np.array([m.keys[i] in dropped for i in cols], dtype=bool)
    base = _replay(*replay, np.zeros_like(cut), np.zeros_like(tail_cut), np.zeros_like(gone))
    fixed = _replay(*replay, cut, tail_cut, gone)
    return float((base - start).max()), float((fixed - start).max())


def _replay(start, held, gap, stay, tail_held, tail, cut, tail_cut, gone) -> np.ndarray:
    """Each rank's step end, collective by collective (module docstring): `ended` is the latest end of
    the collectives so far (a dropped one ends nothing)."""
    ranks, n = gap.shape
    arrive = start.copy()
    ended = np.full(ranks, -np.inf)
    for k in range(n):
        arrive = np.where(held[:, k], np.maximum(ended, arrive), arrive) + gap[:, k] - cut[:, k]
        if not gone[k]:
            ended = np.maximum(ended, arrive.max() + stay[:, k])
    return np.where(tail_held, np.maximum(ended, arrive), arrive) + tail - tail_cut

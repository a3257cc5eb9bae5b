"""Where one rank's training thread spends each step: inside recorded ops, or in time no op covers.

Next to the other ranks this says why a rank is slow when its GPU is not (or when there is no GPU): a
rank whose thread spends 20 ms more per step outside every op than the others runs Python the others do
not (input preparation, logging, a sleep), and the op that follows that stretch says where in the step.
Time while a CPU backend runs one of the rank's collectives (`gloo:all_reduce` on its own thread), and
on such a backend the thread's own ops that are part of a collective or hold one (its `c10d::` call, a
functional collective's `wait_tensor`, autograd's node whose hook reduce-scatters:
model/collectives.in_a_collective, what measure/job/collectives.own_work leaves out of the rank's work) are
neither: the training thread is then waiting for the collective, which measure/job/job.py counts as a wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..basics import intervals as iv
from ..basics.metrics import Metrics
from ..basics.steps import cpu_windows
from gpuadvise.analyzer.model import collectives as coll
from gpuadvise.analyzer.model.calls import STEP
from gpuadvise.analyzer.model.trace import TraceModel, name_mask


@dataclass
class ThreadTime:
    """Per step (in `per_step` order), µs of the training thread's CPU span."""

    op_us: list[float]  # inside a recorded op
    untraced_us: list[float]  # inside no op and no collective of a CPU backend
    gap_before: list[str]  # the op that follows the step's longest untraced stretch ("" if none)
    gap_us: list[float]  # that stretch


def thread_time(model: TraceModel, m: Metrics, waits: tuple[np.ndarray, np.ndarray] | None = None) -> ThreadTime:
    """`waits`: more intervals the thread is known to wait in (the DataLoader's `__next__`), counted like a CPU
    backend's collectives: neither ops nor untraced."""
    lo, hi = cpu_windows(m.steps, m.window)
    n = len(lo)
    empty = ThreadTime([0.0] * n, [0.0] * n, [""] * n, [0.0] * n)
    cpu = model.cpu
    tid = training_thread(model, m)
    if tid is None:
        return empty
    mine = cpu[(cpu["tid"].to_numpy() == tid) & ~cpu["is_annotation"].to_numpy()]
    comms = model.comms
    host = comms[comms["role"] == coll.HOST] if comms is not None and len(comms) else None
    if host is not None and len(host):  # a CPU backend: its spans, and the thread's ops in a collective, wait
        held = coll.in_a_collective(mine)  # as measure/job/collectives.own_work leaves them out of the rank's work
        waiting = iv.union(np.concatenate([host["ts"].to_numpy(dtype=float), mine["ts"].to_numpy(dtype=float)[held]]),
                           np.concatenate([host["end"].to_numpy(dtype=float), mine["end"].to_numpy(dtype=float)[held]]))
        mine = mine[~held]
    else:
        waiting = (np.zeros(0), np.zeros(0))
        mine = mine[name_mask(mine["name"], lambda name: coll.role(name, False) is None)]
    ops = iv.union(mine["ts"], mine["end"])
    if waits is not None and len(waits[0]):
        waiting = iv.union(np.concatenate([waiting[0], waits[0]]), np.concatenate([waiting[1], waits[1]]))
    busy = iv.union(np.concatenate([ops[0], waiting[0]]), np.concatenate([ops[1], waiting[1]]))
    op_us = iv.covered(*ops, lo, hi)
    untraced = np.clip((hi - lo) - iv.covered(*busy, lo, hi), 0.0, None)
    gap_before, gap_us = [], []
    starts, ends = busy
    names = mine["name"].astype(str).to_numpy()
    op_ts = mine["ts"].to_numpy(dtype=float)
    for a, b in zip(lo.tolist(), hi.tolist()):
        inside = (starts < b) & (ends > a)
        s, e = np.clip(starts[inside], a, b), np.clip(ends[inside], a, b)
        gaps_a = np.concatenate([[a], e])  # the stretches between what kept the thread busy
        gaps_b = np.concatenate([s, [b]])
        length = gaps_b - gaps_a
        if not len(length) or length.max() <= 0:
            gap_before.append("")
            gap_us.append(0.0)
            continue
        j = int(np.argmax(length))
        nxt = np.searchsorted(op_ts, gaps_b[j] - 1e-6)
        gap_before.append(str(names[nxt]) if nxt < len(names) and op_ts[nxt] < b else "")
        gap_us.append(float(length[j]))
    return ThreadTime([float(x) for x in op_us], [float(x) for x in untraced], gap_before, gap_us)


def training_thread(model: TraceModel, m: Metrics) -> int | None:
    """The thread of the training loop: the one that launches the GPU work, else (a CPU-only trace) the
    one the ProfilerStep annotations are on, else the busiest one."""
    if m.launch_thread is not None:
        return m.launch_thread[1]
    cpu = model.cpu
    if cpu.empty:
        return None
    steps = cpu[name_mask(cpu["name"], STEP.match)]
    pick = steps if len(steps) else cpu
    return int(pick.groupby("tid")["dur"].sum().idxmax())

"""DDP's forward passes within each step, and the collectives each one's backward issued.

DDP marks each forward with a `DistributedDataParallel.forward` annotation; with gradient accumulation
a step (one optimizer step) holds several. The collectives issued from one forward to the next belong
to that micro-batch's backward: a micro-batch that all-reduced synchronised its gradients (outside
`no_sync()`). Used by ddp-sync-per-microbatch and ddp-unused-parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..basics.spans import annotation_spans
from ..basics.steps import launch_steps

if TYPE_CHECKING:  # the object a rule reads (measure/analysis.py) imports this package: for the annotations only
    from ..analysis import Analysis

DDP_FORWARD = "DistributedDataParallel.forward"


@dataclass
class StepRounds:
    """One step: its DDP forwards and, per forward, the rows of `a.collectives` its backward issued."""

    index: int  # into metrics.steps
    forwards: np.ndarray  # start times (model clock)
    rounds: list[np.ndarray]  # per forward: row indices into a.collectives (all-reduces only)

    @property
    def synced(self) -> int:
        """Micro-batches whose backward all-reduced."""
        return sum(1 for r in self.rounds if len(r))


def forward_spans(a: Analysis):
    """DDP's forward annotations (name, ts, end, …), in time order."""
    spans = annotation_spans(a.model, DDP_FORWARD)
    return spans[spans["name"].astype(str) == DDP_FORWARD].sort_values("ts")


def step_rounds(a: Analysis) -> list[StepRounds]:
    """Per step with at least one DDP forward, its forwards and the all-reduces each one's backward issued."""
    m, c = a.metrics, a.collectives
    fwd = forward_spans(a)
    if not m.steps or fwd.empty:
        return []
    f_ts = fwd["ts"].to_numpy(dtype=float)
    f_step = launch_steps(m.steps, f_ts)
    if c is not None and len(c):
        allreduce = np.array([k == "all_reduce" for k in c.kind], dtype=bool)
        c_step = launch_steps(m.steps, c.issued_us)
    out = []
    for i in range(len(m.steps)):
        starts = f_ts[f_step == i]
        if not len(starts):
            continue
        rounds = []
        if c is not None and len(c):
            rows = np.flatnonzero(allreduce & (c_step == i))
            slot = np.searchsorted(starts, c.issued_us[rows], side="right") - 1
            rounds = [rows[slot == j] for j in range(len(starts))]
        else:
            rounds = [np.zeros(0, dtype=np.int64) for _ in starts]
        out.append(StepRounds(index=i, forwards=starts, rounds=rounds))
    return out

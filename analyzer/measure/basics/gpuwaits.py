"""What the GPU waits for inside the steps, when it is not computing: the other side of a host sync.

A sync holds the training thread until the GPU has finished the work before it; if the GPU itself sat
idle for much of that time, ending the sync on this rank alone frees the thread but not the GPU. This
module splits each step's GPU time (the steps' windows, all streams together) into:

- **computing**: some non-communication op runs;
- **in a collective alone**: only communication kernels (NCCL/RCCL) run: transferring, or waiting inside
  the collective for another rank to arrive;
- **idle, waiting for a launch**: the op that ends the idle gap was launched after the gap began (the
  CPU was late: it was blocked, or busy);
- **idle with work queued**: the op that ends the gap had been launched before the gap began, and no op
  on any stream of this GPU ran in between: it waited for something this rank's trace does not show (a
  signal from another rank, a CUDA-graph node or host callback the profiler does not record). In a job
  of several ranks that is, most likely, another rank.

Each figure is per step, the median over the steps (perstep.py); the step's total is the median step.
The replay (replay_graph.py) keeps the queued waits as waits of their traced length (`unseen` edges);
host-sync's prediction for every rank of an SPMD job removes them (whatif.Scenario.unseen_scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import intervals as iv
from . import perstep
from .idle import idle_gaps
from .metrics import Metrics
from gpuadvise.analyzer.model.kernels import is_comm
from gpuadvise.analyzer.model.trace import TraceModel

LATE_LAUNCH_SLACK_US = 5.0  # a launch this soon after the gap began still counts as queued


@dataclass(frozen=True)
class GpuWaits:
    """Per step (median over the steps), µs."""

    step_us: float
    computing_us: float
    collective_alone_us: float
    launch_wait_us: float
    queued_wait_us: float
    collectives: tuple[str, ...]  # the communication kernels' names, most time first
    world_size: int | None

    @property
    def idle_us(self) -> float:
        return self.launch_wait_us + self.queued_wait_us

    def share(self, us: float) -> float:
        return 100.0 * us / self.step_us if self.step_us > 0 else 0.0

    @property
    def waits_on_others(self) -> bool:
        """Most of the GPU's time that is not computing is spent waiting for something other than this
        rank's CPU: queued work held, or a collective running alone."""
        other = self.queued_wait_us + self.collective_alone_us
        return other > self.launch_wait_us and other > 0.25 * self.step_us

    def describe(self) -> str:
        """The split in words: "computing 35 %, in a collective alone (ncclKernel_SendRecv) 8 %, …"."""
        parts = [f"computing {self.share(self.computing_us):.0f} %"]
        if self.collective_alone_us > 0:
            what = f" ({', '.join(f'`{c}`' for c in self.collectives[:2])})" if self.collectives else ""
            parts.append(f"in a collective alone{what} {self.share(self.collective_alone_us):.0f} %")
        parts.append(f"idle waiting for a launch {self.share(self.launch_wait_us):.0f} %")
        parts.append(f"idle with its next work queued, waiting for something this trace does not show "
                     f"({'another rank, most likely' if (self.world_size or 1) > 1 else 'a graph node or host callback'}) "
                     f"{self.share(self.queued_wait_us):.0f} %")
        return ", ".join(parts)


def gpu_waits(model: TraceModel, metrics: Metrics) -> GpuWaits | None:
    """The split of the steps' GPU time; None without GPU work."""
    gpu = model.gpu
    if gpu.empty or not metrics.has_gpu:
        return None
    names = gpu["name"].astype(str)
    comm_names = {n for n in names.unique() if is_comm(n)}
    comm = names.isin(comm_names).to_numpy()
    ts, end = gpu["ts"].to_numpy(dtype=float), gpu["end"].to_numpy(dtype=float)
    compute_union = iv.union(ts[~comm], end[~comm])
    comm_alone = iv.subtract(iv.union(ts[comm], end[comm]), compute_union)
    # each idle gap of the whole GPU, by what ended it: the first op to start at its end
    lo, hi = idle_gaps(metrics)
    launch_at = _launch_times(model, metrics)
    order = np.argsort(ts, kind="stable")
    first = order[np.clip(np.searchsorted(ts[order], hi - 0.5), 0, len(order) - 1)]
    launched = launch_at.reindex(gpu["correlation"].to_numpy()[first]).to_numpy(dtype=float)
    queued = np.isfinite(launched) & (launched <= lo + LATE_LAUNCH_SLACK_US)
    per = {
        "computing": perstep.covered(metrics, *compute_union),
        "alone": perstep.covered(metrics, *comm_alone),
        "launch": perstep.covered(metrics, lo[~queued], hi[~queued]),
        "queued": perstep.covered(metrics, lo[queued], hi[queued]),
    }
    by_name = gpu[comm].groupby(names[comm], observed=True)["dur"].sum().sort_values(ascending=False)
    step_us = float(metrics.median_step_us) if metrics.steps else float(metrics.window[1] - metrics.window[0])
    return GpuWaits(step_us=step_us, computing_us=perstep.median(per["computing"]),
                    collective_alone_us=perstep.median(per["alone"]), launch_wait_us=perstep.median(per["launch"]),
                    queued_wait_us=perstep.median(per["queued"]),
                    collectives=tuple(_short(n) for n in by_name.index[:3]), world_size=model.meta.world_size)


def _launch_times(model: TraceModel, metrics: Metrics) -> pd.Series:
    """When each GPU op's launch call let it go, by correlation."""
    la = metrics.launches
    if la is None or la.empty:
        return pd.Series(dtype=float)
    return la.drop_duplicates("correlation").set_index("correlation")["launch_ts"].astype(float)


def _short(name: str) -> str:
    """A kernel's name without its argument list."""
    return str(name).split("(", 1)[0].split("<", 1)[0]

"""Steps and windows: the ProfilerStep spans, each step's time on the GPU timeline, and which step a
timestamp or a launch belongs to.

Steps are measured on the GPU timeline, not only on the CPU one (HTA, and the TensorBoard plugin, use
the CPU `ProfilerStep#N` spans). When the training thread runs ahead of the GPU, as it does in a loop
without syncs, the CPU span of a step says nothing about its cost: the GPU is still busy with earlier
steps. So each GPU op belongs to the step whose CPU span launched it (runtime call ↔ op correlation), a
step's GPU time runs from its first GPU activity to the next step's first GPU activity, or to the end of
its own GPU work when that comes first (the GPU then waited for the CPU, whose span counts that wait),
and a step takes the longer of its CPU span and its GPU time.
Both figures are kept (`Step.cpu_dur`, `Step.gpu_dur`); every per-step figure and every share of step
time uses `Step.dur`. CPU-side quantities (DataLoader waits, syncs) are measured in the CPU span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.calls import STEP
from gpuadvise.analyzer.model.trace import TraceModel, name_mask


@dataclass
class Step:
    number: int
    start: float  # the CPU span: the ProfilerStep annotation on the training thread
    end: float
    gpu_start: float = float("nan")  # first GPU activity of the work launched in the CPU span
    gpu_end: float = float("nan")  # the next step's first GPU activity, or its own work's end if sooner

    @property
    def cpu_dur(self) -> float:
        return self.end - self.start

    @property
    def gpu_dur(self) -> float:
        return self.gpu_end - self.gpu_start if np.isfinite(self.gpu_start) and np.isfinite(self.gpu_end) else 0.0

    @property
    def gpu_bound(self) -> bool:
        """The GPU, not the CPU, set this step's pace."""
        return self.gpu_dur > self.cpu_dur

    @property
    def dur(self) -> float:
        """What the step costs: the slower of the CPU span and the GPU time."""
        return max(self.cpu_dur, self.gpu_dur)

    @property
    def window(self) -> tuple[float, float]:
        """Where on the timeline the step's time is spent: its GPU time when that is longer, else its CPU span."""
        return (self.gpu_start, self.gpu_end) if self.gpu_bound else (self.start, self.end)


def find_steps(model: TraceModel) -> list[Step]:
    cpu = model.cpu
    if cpu.empty:
        return []
    mask = name_mask(cpu["name"], lambda n: n.startswith("ProfilerStep#"))
    if not mask.any():
        return []
    rows = cpu[mask]
    seen: dict[int, Step] = {}
    for name, ts, end in zip(rows["name"].astype(str), rows["ts"], rows["end"]):
        m = STEP.match(name)
        if not m:
            continue
        n = int(m.group(1))
        if n not in seen or end - ts > seen[n].cpu_dur:  # duplicated annotations: keep the CPU-side span
            seen[n] = Step(n, float(ts), float(end))
    return sorted(seen.values(), key=lambda s: s.start)


def launch_steps(steps: list[Step], launch_ts: np.ndarray) -> np.ndarray:
    """Index of the step whose CPU span launched each call (−1: before the first step or after the last).

    A call between two steps' spans belongs to the earlier step: it is part of that iteration."""
    if not steps:
        return np.full(len(launch_ts), -1, dtype=np.int64)
    starts = np.array([s.start for s in steps])
    k = np.searchsorted(starts, launch_ts, side="right") - 1
    after_last = (k == len(steps) - 1) & (launch_ts >= steps[-1].end)
    return np.where((k >= 0) & ~after_last, k, -1)


def gpu_timeline(steps: list[Step], launches: pd.DataFrame) -> list[Step]:
    """Give each step its GPU time: from the first GPU activity it launched to the next step's first
    GPU activity, or to the end of its own GPU work when that comes first (always for the last step)."""
    if not steps or launches.empty:
        return steps
    k = launch_steps(steps, launches["launch_ts"].to_numpy(dtype=float))
    mine = k >= 0
    k = k[mine]
    ts = launches["gpu_ts"].to_numpy(dtype=float)[mine]
    end = ts + launches["gpu_us"].to_numpy(dtype=float)[mine]
    first = np.full(len(steps), np.inf)
    last = np.full(len(steps), -np.inf)
    np.minimum.at(first, k, ts)
    np.maximum.at(last, k, end)
    has = np.isfinite(first)
    # the next step (with GPU work) of each step, scanning from the end
    nxt = np.full(len(steps), np.nan)
    upcoming = np.nan
    for i in range(len(steps) - 1, -1, -1):
        nxt[i] = upcoming
        if has[i]:
            upcoming = first[i]
    out = []
    for i, s in enumerate(steps):
        if not has[i]:
            out.append(s)
            continue
        # to the next step's first GPU activity (the GPU moved straight on: its time is this step's), but
        # no further than the end of this step's own work: a GPU that then waited for the CPU to launch
        # the next step spent CPU time, which the CPU spans already count
        gpu_end = min(max(nxt[i], first[i]), last[i]) if np.isfinite(nxt[i]) else last[i]
        out.append(Step(s.number, s.start, s.end, float(first[i]), float(gpu_end)))
    return out


def trace_window(model: TraceModel, steps: list[Step]) -> tuple[float, float]:
    if steps:
        wins = [s.window for s in steps]
        return min(w[0] for w in wins), max(w[1] for w in wins)
    lo, hi = np.inf, -np.inf
    for df in (model.gpu, model.runtime, model.cpu):
        if len(df):
            lo = min(lo, float(df["ts"].min()))
            hi = max(hi, float(df["end"].max()))
    if lo == np.inf:
        return 0.0, 0.0
    return lo, hi


def step_windows(metrics_steps: list[Step], window: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's window on the timeline (`Step.window`), or the whole window without steps."""
    if metrics_steps:
        return (np.array([s.window[0] for s in metrics_steps]), np.array([s.window[1] for s in metrics_steps]))
    return np.array([window[0]]), np.array([window[1]])


def cpu_windows(metrics_steps: list[Step], window: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's CPU span, or the whole window without steps."""
    if metrics_steps:
        return (np.array([s.start for s in metrics_steps]), np.array([s.end for s in metrics_steps]))
    return np.array([window[0]]), np.array([window[1]])


def step_of(ts: np.ndarray, steps: list[Step]) -> np.ndarray:
    """Index of the step containing each timestamp, -1 outside every step (all 0 without steps)."""
    if not steps:
        return np.zeros(len(ts), dtype=np.int64)
    starts = np.array([s.start for s in steps])
    ends = np.array([s.end for s in steps])
    k = np.searchsorted(starts, ts, side="right") - 1
    ok = (k >= 0) & (ts < ends[np.clip(k, 0, None)])
    return np.where(ok, k, -1)

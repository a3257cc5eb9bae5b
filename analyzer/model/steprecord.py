"""The whole run's step times and memory samples, as `gpuadvise profile` recorded them in the run folder's
step record (`steps.jsonl`; the format is in gpuadvise/harness/steps/record.py), read by read/steprecord.py.

Times are ms by the run's clock: the GPU's (CUDA events) where the script ran on one, else the wall
clock. Exact steps come one by one; from `exact_steps` on, buckets of steps summarised by their median,
min and max (unprofiled steps only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .telemetry import Telemetry

UNPROFILED = ("w", "n", "o")  # phase letters of steps nothing of the profiler touched
PHASE_NAMES = {"w": "wait", "s": "shapes", "u": "warmup", "a": "active", "m": "memory", "n": "after", "o": "off"}


@dataclass(frozen=True)
class Bucket:
    first: int
    last: int
    n: int  # unprofiled steps summarised
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    max_step: int | None  # the slowest of them


@dataclass
class StepRecord:
    source: str
    clock: str  # "cuda_event" or "cpu"
    exact_steps: int
    number: np.ndarray  # int, the exact steps in order
    phase: np.ndarray  # str, one phase letter each
    ms: np.ndarray  # float, by `clock` (NaN: no time by that clock)
    cpu_ms: np.ndarray
    buckets: list[Bucket] = field(default_factory=list)
    # memory samples: step, resident bytes, the CUDA allocator's allocated and reserved bytes (NaN: none)
    mem_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    mem_rss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mem_allocated: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mem_reserved: np.ndarray = field(default_factory=lambda: np.zeros(0))
    damaged_lines: int = 0  # lines that could not be read (a crash while one was being written)
    # the GPU's own readings over the run (NVML, `telemetry.jsonl` beside the record); None: not sampled
    telemetry: "Telemetry | None" = None
    # each DataLoader iterator that started worker processes: (step, workers), in step order (every epoch's,
    # unless persistent_workers kept them)
    worker_starts: list[tuple[int, int]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """Steps recorded in all, exact and bucketed."""
        return int(len(self.number)) + sum(b.last - b.first + 1 for b in self.buckets)

    @property
    def last_step(self) -> int | None:
        if self.buckets:
            return self.buckets[-1].last
        return int(self.number[-1]) if len(self.number) else None

    def unprofiled(self, settle: int = 2) -> tuple[np.ndarray, np.ndarray]:
        """(step numbers, ms) of the exact steps no profiler touched, after the loop's start-up (`settle`),
        without the first step after a window (the trace export ran just before it, on cold caches)."""
        ph = self.phase
        free = np.isin(ph, UNPROFILED)
        after_window = np.zeros(len(ph), dtype=bool)
        if len(ph) > 1:
            consecutive = np.diff(self.number) == 1
            after_window[1:] = consecutive & ~free[:-1]
        keep = free & ~after_window & (self.number > settle) & np.isfinite(self.ms)
        return self.number[keep], self.ms[keep]


def dated(low: int | None, high: int | None) -> str:
    """An onset's interval in words, when it spans more than one step (the run summary's and step-time-drift's):
    what it is, the onsets of every growth law that fits about as well as the best (measure/longrun/changepoints.py),
    and no confidence the real loops did not earn for every law (docs/long-runs.md: it held the true onset in
    95–100 % of linear, n log n and step loops, in fewer of the quadratic ones)."""
    if low is None or high is None or high - low < 2:
        return ""
    return f" (dated to steps {low}–{high} by every growth law that fits)"

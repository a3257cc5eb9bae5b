"""What changed over a long run, from the whole run's step record and its windows: the run-level rules'
input (`RunAnalysis`, `requires = ("run",)`; docs/rule-api.md section 9).

- The **series**: the unprofiled steps' times (model/steprecord.py: no profiler, no step right after a
  window), then one point per bucket of the bucketed range (its median, at its middle step).
- **Levels** (measure/longrun/changepoints.py): the series' first lasting rise beyond chance (a CUSUM test, then
  step, linear-climb and exponential-climb fits; a warm-up is left out): its onset, shape and, when the
  series came back down, its last step. The early level is the median of the steps before the onset
  (after any warm-up), the slow level the new regime's median (a step) or its last K points' (a climb).
- **Periodic stalls**: points at least `min_x` times the median of the points within K/2 steps and
  `min_excess_ms` above it, recurring at one distance N beyond chance (a hypergeometric test over every
  period and first step that could have been tested).
- **Memory**: the CUDA allocator's allocated bytes where the run used a GPU, else the process's resident
  memory, sampled every few steps: its slope (the median of the pairwise slopes, robust to a few jumps)
  and how often it rose between samples.
- **Windows**: each window's analysis (its `TraceReport`) and the comparison of window 1 with each later
  one (`comparisons`: gpuadvise compare's data, analyzer/compare/diff.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gpuadvise.analyzer.model.steprecord import StepRecord

from .changepoints import Change, find_change, local_level, periodic, stall_steps

DEFAULT_K = 20


@dataclass(frozen=True)
class Levels:
    k: int  # points in each median
    early_ms: float  # the median of the steps before the onset (the first K without one), after any warm-up
    early_steps: tuple[int, int]
    slow_ms: float  # the raised regime's median: a step's whole regime, a climb's last K points
    slow_at: int  # the step the raised level is centred on
    late_ms: float  # the median of the last K points
    late_steps: tuple[int, int]
    began_at: int | None  # the onset of a rise beyond chance; None when there is none
    until: int | None  # the last step at the raised level, when the series came back down
    shape: str = "steady"  # changepoints.Change.shape: steady, step, climb, faster climb, speed-up
    slow_steps: tuple[int, int] | None = None  # the steps slow_ms is the median of
    warmup_until: int | None = None  # the last step of a warm-up left out
    p_value: float | None = None  # of the CUSUM test: the chance of so large a change in a steady series
    began_between: tuple[int, int] | None = None  # the onset's range: every growth law that fits (changepoints)

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.slow_ms / self.early_ms - 1.0) if self.early_ms > 0 else 0.0


@dataclass(frozen=True)
class Stall:
    period: int
    steps: list[int]  # the stalled steps seen (unprofiled ones)
    expected: int  # steps of that residue class the series holds
    base_ms: float  # the median level of the steps around them
    excess_ms: float  # median extra time of a stall over its level
    p_value: float = 0.0  # the chance of as many stalls at one period when they fall at random

    @property
    def share_pct(self) -> float:
        """Of the time of `period` steps that include one stall."""
        total = self.period * self.base_ms + self.excess_ms
        return 100.0 * self.excess_ms / total if total > 0 else 0.0


@dataclass(frozen=True)
class MemoryTrend:
    kind: str  # "allocated" (the CUDA caching allocator) or "resident" (the process's RSS)
    steps: tuple[int, int]
    start_bytes: float
    end_bytes: float
    per_step_bytes: float  # the robust slope
    rising_share: float  # of the intervals between samples in which it rose
    samples: int

    @property
    def growth_bytes(self) -> float:
        return self.per_step_bytes * (self.steps[1] - self.steps[0])


@dataclass
class WindowView:
    """One window of the run: what run.json says about it, and its analysis when its trace was read."""

    index: int
    trigger: str
    detail: str
    steps: tuple[int, int] | None
    state: str
    trace: str | None
    report: object | None = None  # its TraceReport
    level_ms: float | None = None  # the unprofiled steps around it (median): the run's level when it recorded


@dataclass
class RunAnalysis:
    """What a run-level rule sees."""

    record: StepRecord
    windows: list[WindowView] = field(default_factory=list)
    comparisons: dict = field(default_factory=dict)  # window index → compare(window 1, that window)
    facts: dict = field(default_factory=dict)
    k: int = DEFAULT_K

    def has(self, need: str) -> bool:
        return need == "run" and self.record is not None

    def ms(self, us: float) -> float:
        return round(float(us) / 1e3, 3)

    # -- the series ---------------------------------------------------------------------------------
    @cached_property
    def series(self) -> tuple[np.ndarray, np.ndarray]:
        """(step, ms): the unprofiled exact steps, then a point per bucket."""
        steps, ms = self.record.unprofiled()
        extra = [(0.5 * (b.first + b.last), b.median_ms) for b in self.record.buckets if b.median_ms is not None and b.n]
        if extra:
            steps = np.concatenate([steps.astype(float), np.array([e[0] for e in extra])])
            ms = np.concatenate([ms, np.array([e[1] for e in extra])])
        return steps.astype(float), ms.astype(float)

    @cached_property
    def level(self) -> np.ndarray:
        """Each point's level: the median of the points within K/2 steps of it."""
        steps, ms = self.series
        return nearby_median(steps, ms, self.k // 2)

    @cached_property
    def change(self) -> Change:
        steps, ms = self.series
        return find_change(steps, ms, k=self.k)

    @cached_property
    def levels(self) -> Levels | None:
        steps, ms = self.series
        k = self.k
        if len(ms) < 2 * k:
            return None
        c = self.change
        n = len(ms)
        start = int(np.searchsorted(steps, c.warmup_until, side="right")) if c.warmup_until is not None else 0
        start = min(start, n - 2)
        drift = c.is_drift and c.onset is not None
        onset = int(np.searchsorted(steps, c.onset)) if drift else None
        # the late level: the last K points, but none the early level counts (before the onset, or the first K
        # after the warm-up): the two ranges a report states side by side never overlap
        late_from = min(max(n - k, onset if drift else start + k), n - 1)
        late_from = max(late_from, start + 1)
        late = (int(steps[late_from]), int(steps[-1]))
        late_ms = float(np.median(ms[late_from:]))
        common = dict(k=k, late_ms=late_ms, late_steps=late, shape=c.shape, warmup_until=c.warmup_until,
                      p_value=c.p_value)
        if not drift:
            stop = min(late_from, start + k)
            early = float(np.median(ms[start:stop]))
            return Levels(early_ms=early, early_steps=(int(steps[start]), int(steps[stop - 1])), slow_ms=early,
                          slow_at=int(steps[start]), began_at=None, until=None, **common)
        end = int(np.searchsorted(steps, c.until, side="right")) if c.until is not None else len(ms)
        first = onset if c.shape == "step" else max(onset, end - k)
        slow = ms[first:end]
        slow_ms = float(np.median(slow)) if len(slow) else float(c.after_ms)
        early_ms = float(np.median(ms[start:onset])) if onset > start else float(c.before_ms)
        return Levels(early_ms=early_ms, early_steps=(int(steps[start]), int(steps[max(start, onset - 1)])),
                      slow_ms=slow_ms, slow_at=int(steps[(first + end - 1) // 2]), began_at=int(c.onset), until=c.until,
                      slow_steps=(int(steps[first]), int(steps[end - 1])),
                      began_between=(c.onset_low, c.onset_high) if c.onset_low is not None else None, **common)

    def stalls(self, min_x: float, min_excess_ms: float, min_repeats: int = 3, min_coverage: float = 0.6) -> Stall | None:
        """The periodic stall beyond chance with the most occurrences, if any (points ≥ `min_x` × their level
        and `min_excess_ms` above it, at one distance, covering `min_coverage` of their residue class)."""
        steps, ms = self.record.unprofiled()
        if len(ms) < 3 * min_repeats:
            return None
        hot, level = stall_steps(steps, ms, self.k, min_x, min_excess_ms)
        found = periodic(steps, hot, min_repeats=min_repeats, min_coverage=min_coverage)
        if found is None:
            return None
        idx = np.searchsorted(steps, found.steps)
        return Stall(period=found.period, steps=found.steps, expected=found.expected,
                     base_ms=float(np.median(level[idx])), excess_ms=float(np.median(ms[idx] - level[idx])),
                     p_value=found.p_value)

    def memory_trend(self, from_step: int = 0) -> MemoryTrend | None:
        """The memory samples from `from_step` on: allocated bytes where there are any, else resident."""
        r = self.record
        keep = r.mem_step >= from_step
        for kind, values in (("allocated", r.mem_allocated), ("resident", r.mem_rss)):
            ok = keep & np.isfinite(values)
            if np.count_nonzero(ok) >= 5:
                steps, v = r.mem_step[ok].astype(float), values[ok]
                break
        else:
            return None
        slope = theil_sen(steps, v)
        q = max(1, len(v) // 4)
        return MemoryTrend(kind=kind, steps=(int(steps[0]), int(steps[-1])), start_bytes=float(np.median(v[:q])),
                           end_bytes=float(np.median(v[-q:])), per_step_bytes=slope,
                           rising_share=float(np.mean(np.diff(v) > 0)), samples=int(len(v)))

    # -- windows --------------------------------------------------------------------------------------
    def window(self, index: int) -> WindowView | None:
        return next((w for w in self.windows if w.index == index), None)

    def captured(self) -> list[WindowView]:
        return [w for w in self.windows if w.report is not None]


def nearby_median(steps: np.ndarray, values: np.ndarray, half: int) -> np.ndarray:
    """For each point, the median of the values whose step is within `half` steps of its own (`steps`
    sorted; a point far from the others keeps its own value)."""
    return local_level(steps, values, half)


def theil_sen(x: np.ndarray, y: np.ndarray, max_points: int = 400) -> float:
    """The median of the pairwise slopes (a few jumps or outliers do not move it)."""
    if len(x) > max_points:
        pick = np.linspace(0, len(x) - 1, max_points).astype(int)
        x, y = x[pick], y[pick]
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    ok = dx > 0
    if not ok.any():
        return 0.0
    return float(np.median((y[j] - y[i])[ok] / dx[ok]))

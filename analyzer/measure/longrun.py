"""What changed over a long run, from the whole run's step record and its windows: the run-level rules'
input (`RunAnalysis`, `requires = ("run",)`; docs/rule-api.md section 9).

- The **series**: the unprofiled steps' times (model/steprecord.py: no profiler, no step right after a
  window), then one point per bucket of the bucketed range (its median, at its middle step).
- **Levels**: the early level is the median of the first K points, a point's level the median of the
  points within K/2 steps of it (a stall in every other step does not move it; a profiled window's gap
  does not pull in steps far away), the slow level the highest of those; a drift began at the first step
  whose level is a quarter of the way from the early level to the slow one (for a jump: the step of the
  jump), and lasted to the last such step.
- **Periodic stalls**: points well above their level that recur at one distance N (the residue class
  mod N that holds most of them, where they cover most of its steps).
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

DEFAULT_K = 20
BEGAN_FRACTION = 0.25  # of the way from the early level to the slow one


@dataclass(frozen=True)
class Levels:
    k: int  # points in each median
    early_ms: float
    early_steps: tuple[int, int]
    slow_ms: float  # the highest level (median of K points)
    slow_at: int  # the step it is centred on
    late_ms: float  # the median of the last K points
    late_steps: tuple[int, int]
    began_at: int | None  # None when the slow level is the early one
    until: int | None  # the last step at the raised level

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
    def levels(self) -> Levels | None:
        steps, ms = self.series
        k = self.k
        if len(ms) < 2 * k:
            return None
        level = self.level
        early = float(np.median(ms[:k]))
        i = int(np.argmax(level))
        slow = float(level[i])
        began = until = None
        if slow > early:
            raised = np.flatnonzero(level >= early + BEGAN_FRACTION * (slow - early))
            if len(raised):
                began, until = int(steps[raised[0]]), int(steps[raised[-1]])
        return Levels(k=k, early_ms=early, early_steps=(int(steps[0]), int(steps[k - 1])), slow_ms=slow,
                      slow_at=int(steps[i]), late_ms=float(np.median(ms[-k:])),
                      late_steps=(int(steps[-k]), int(steps[-1])), began_at=began, until=until)

    def stalls(self, min_x: float, min_excess_ms: float, min_repeats: int = 3, min_coverage: float = 0.6) -> Stall | None:
        """The periodic stall with the most occurrences, if any (points ≥ `min_x` × their level and
        `min_excess_ms` above it, at one distance, covering `min_coverage` of their residue class)."""
        steps, ms = self.record.unprofiled()
        if len(ms) < 3 * min_repeats:
            return None
        level = nearby_median(steps, ms, self.k // 2)
        hot = (ms >= min_x * level) & (ms - level >= min_excess_ms)
        at = steps[hot].astype(np.int64)
        if len(at) < min_repeats:
            return None
        candidates = {int(b - a) for j in range(1, 4) for a, b in zip(at, at[j:]) if b - a >= 2}
        best = None
        for n in sorted(candidates):
            residues, counts = np.unique(at % n, return_counts=True)
            r = int(residues[np.argmax(counts)])
            hits = at[at % n == r]
            expected = int(np.count_nonzero((steps >= hits[0]) & (steps % n == r)))
            if len(hits) < min_repeats or expected == 0 or len(hits) / expected < min_coverage:
                continue
            key = (len(hits), len(hits) / expected, -n)
            if best is None or key > best[0]:
                best = (key, n, hits, expected)
        if best is None:
            return None
        _, n, hits, expected = best
        idx = np.searchsorted(steps, hits)
        return Stall(period=n, steps=[int(s) for s in hits], expected=expected, base_ms=float(np.median(level[idx])),
                     excess_ms=float(np.median(ms[idx] - level[idx])))

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
    n = len(values)
    if n == 0:
        return values.astype(float)
    lo = np.searchsorted(steps, steps - max(half, 1), side="left")
    hi = np.searchsorted(steps, steps + max(half, 1), side="right")
    width = int((hi - lo).max())
    idx = lo[:, None] + np.arange(width)[None, :]
    grid = np.where(idx < hi[:, None], values.astype(float)[np.minimum(idx, n - 1)], np.nan)
    return np.nanmedian(grid, axis=1)


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

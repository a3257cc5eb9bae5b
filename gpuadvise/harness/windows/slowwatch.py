"""`--when-slower PCT`: watch the unprofiled step times for the two ways a long run slows down, and say when
a window should record it. A window is spent on evidence: on a new level once it is established, on a
stall once it recurs at one period beyond chance; a noisy steady loop asks for none.

- **Drift**: the median of the last K unprofiled steps is PCT % above the early median (the median of the
  first K unprofiled steps after the loop's start-up), and the new level is established: by the sign
  test, more of the last K steps lie above the early median than a steady loop would put there by
  chance (at most `SIGN_ALPHA`, 1 %: 16 of 20). After a window is asked for, the watch takes the median
  of the next K steps as the new level and fires again only PCT % above it (a run that settles at the
  slow level is recorded once, one that keeps slowing down again).
- **Periodic stall**: single steps at least PCT % slower than the median of the last K (and at least
  twice it, and 1 ms longer), recurring at one distance N beyond chance among the steps watched
  (analyzer/model/recurrence.py: a hypergeometric test over every period and first step that could have
  been tested, at least 3 stalls covering 3/4 of the watched steps of their class from the first one; steps that fell in a profiled window were
  not watched and count neither way). The window is placed on the next one: predicted at the last stall
  + N. Each period is recorded once (its multiples too).

Steps right after a window (the trace export runs before them, on cold caches) and steps the profiler
touched are not fed in. Cost: a deque append per step, a median of K values every `CHECK_EVERY` steps,
and the period test (numpy, over the last `HORIZON` watched steps) only when a new stall is seen.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

import numpy as np

from gpuadvise.analyzer.model.recurrence import periodic

CHECK_EVERY = 5
STALL_MIN_X = 2.0  # a stall is at least this many times the recent median, whatever PCT says
STALL_MIN_MS = 1.0  # … and this much longer: a step's jitter is no stall
STALLS_KEPT = 64
HORIZON = 1000  # watched steps the period test looks back over
STALL_COVERAGE = 0.75  # of the watched steps of the class from the first stall: more than one miss in four breaks a period
SIGN_ALPHA = 0.01


def sign_test_needs(k: int, alpha: float = SIGN_ALPHA) -> int:
    """The fewest of k steps above the early median that a steady loop reaches with chance ≤ alpha."""
    tail = 0.0
    for m in range(k, -1, -1):
        tail += math.comb(k, m) / 2 ** k
        if tail > alpha:
            return m + 1
    return 0


@dataclass(frozen=True)
class Slowdown:
    kind: str  # "slower" (drift) or "stall"
    detail: str  # what was seen, in words (run.json's window `detail`)
    at_step: int | None = None  # stall: the predicted next stall step
    period: int | None = None  # stall: its period


class SlowWatch:
    def __init__(self, pct: float, k: int = 20):
        self.pct, self.k = pct, k
        self.early: list[float] = []
        self.early_steps: list[int] = []
        self.recent: deque = deque(maxlen=k)
        self.recent_steps: deque = deque(maxlen=k)
        self.threshold: float | None = None  # drift fires above this median
        self.established = sign_test_needs(k)  # of the last K above the early median: a new level
        self.stalls: deque = deque(maxlen=STALLS_KEPT)
        self.periods_seen: set[int] = set()
        self._since_check = 0
        self._rearm = False  # a window was asked for: the next K steps set the level to compare with
        self.watched: deque = deque(maxlen=HORIZON)  # steps checked for stalls: the period test's population
        self._new_stall = False

    @property
    def early_ms(self) -> float | None:
        return statistics.median(self.early) if len(self.early) >= self.k else None

    def observe(self, number: int, ms: float) -> None:
        """An unprofiled step's final time (ms)."""
        if len(self.early) < self.k:
            self.early.append(ms)
            self.early_steps.append(number)
            if len(self.early) == self.k:
                self.threshold = statistics.median(self.early) * (1 + self.pct / 100)
        if len(self.recent) >= max(5, self.k // 2):
            self.watched.append(number)
            median = sorted(self.recent)[len(self.recent) // 2]  # the upper median: one sort of K values
            if ms >= median * max(1 + self.pct / 100, STALL_MIN_X) and ms - median >= STALL_MIN_MS:
                if self.stalls and self.stalls[-1] == number - 1:  # slow steps in a row: a new level, no stall
                    self.stalls.pop()
                else:
                    self.stalls.append(number)
                    self._new_stall = True
        self.recent.append(ms)  # the median shrugs off a stall in every other step and follows a new level
        self.recent_steps.append(number)
        self._since_check += 1

    def check(self) -> Slowdown | None:
        """What to record now, if anything (every CHECK_EVERY observed steps)."""
        if self._new_stall:
            self._new_stall = False
            stall = self._stall()
            if stall is not None:
                return stall
        if self._since_check < CHECK_EVERY or self.threshold is None or len(self.recent) < self.k:
            return None
        self._since_check = 0
        median = statistics.median(self.recent)
        if self._rearm:  # K steps since the last window: the level the run settled at
            self._rearm = False
            self.threshold = max(self.threshold, median * (1 + self.pct / 100))
            return None
        if median <= self.threshold:
            return None
        early = self.early_ms
        above = sum(1 for v in self.recent if v > early)
        if above < self.established:  # a few slow steps lift a median; a new level lifts most of them
            return None
        seen = Slowdown("slower", f"the new level is established: the median of steps {self.recent_steps[0]}–"
                                  f"{self.recent_steps[-1]} ({median:.2f} ms) is {100 * (median / early - 1):.0f} % above "
                                  f"the early median ({early:.2f} ms, steps {self.early_steps[0]}–{self.early_steps[-1]}), "
                                  f"and {above} of those {len(self.recent)} steps are above it (sign test, chance ≤ "
                                  f"{100 * SIGN_ALPHA:.0f} %)")
        self._rearm = True
        self.recent.clear()
        self.recent_steps.clear()
        return seen

    def _stall(self) -> Slowdown | None:
        """The newest stall t in a period beyond chance not recorded yet (nor a divisor of its)."""
        if len(self.stalls) < 3:
            return None
        t = self.stalls[-1]
        steps = np.fromiter(self.watched, dtype=np.int64, count=len(self.watched))
        stalls = np.fromiter(self.stalls, dtype=np.int64, count=len(self.stalls))
        found = periodic(steps, np.isin(steps, stalls), min_coverage=STALL_COVERAGE)
        if found is None or t not in found.steps or any(found.period % p == 0 for p in self.periods_seen):
            return None
        period = found.period
        self.periods_seen.add(period)
        median = statistics.median(self.recent)
        shown = found.steps[-6:]
        return Slowdown("stall", f"a stall every {period} steps, beyond chance: steps {', '.join(map(str, shown))} were "
                                 f"each ≥ {max(1 + self.pct / 100, STALL_MIN_X):.1f}× the median step ({median:.2f} ms), "
                                 f"{len(found.steps)} of the {found.expected} watched steps {period} apart (chance "
                                 f"{found.p_value:.1g}); recording the next one (step {t + period})",
                        at_step=t + period, period=period)

"""`--when-slower PCT`: watch the unprofiled step times for the two ways a long run slows down, and say when
a window should record it.

- **Drift**: the median of the last K unprofiled steps is PCT % above the early median (the median of the
  first K unprofiled steps after the loop's start-up). After a window is asked for, the watch re-arms only
  when the median climbs PCT % above the level that triggered it (a run that settles at the slow level is
  recorded once, one that keeps slowing down again).
- **Periodic stall**: single steps at least PCT % slower than the median of the last K (and at least
  twice it, and 1 ms longer), three of them at the same distance N (an evaluation, a checkpoint, a log
  line every N steps, a DataLoader restarting its workers each epoch; other slow steps between them do
  not matter). The window is placed on the next one: predicted at the last stall + N. Each period is
  recorded once.

Steps right after a window (the trace export runs before them, on cold caches) and steps the profiler
touched are not fed in. Cost: a deque append per step, a median of K values every `CHECK_EVERY` steps.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

CHECK_EVERY = 5
STALL_MIN_X = 2.0  # a stall is at least this many times the recent median, whatever PCT says
STALL_MIN_MS = 1.0  # … and this much longer: a step's jitter is no stall
STALLS_KEPT = 16


@dataclass(frozen=True)
class Slowdown:
    kind: str  # "slower" (drift) or "stall"
    detail: str  # what was seen, in words (run.json's window `detail`)
    at_step: int | None = None  # stall: the predicted next stall step


class SlowWatch:
    def __init__(self, pct: float, k: int = 20):
        self.pct, self.k = pct, k
        self.early: list[float] = []
        self.early_steps: list[int] = []
        self.recent: deque = deque(maxlen=k)
        self.recent_steps: deque = deque(maxlen=k)
        self.threshold: float | None = None  # drift fires above this median
        self.stalls: deque = deque(maxlen=STALLS_KEPT)
        self.periods_seen: set[int] = set()
        self._since_check = 0

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
            median = statistics.median(self.recent)
            if ms >= median * max(1 + self.pct / 100, STALL_MIN_X) and ms - median >= STALL_MIN_MS:
                if self.stalls and self.stalls[-1] == number - 1:  # slow steps in a row: a new level, no stall
                    self.stalls.pop()
                else:
                    self.stalls.append(number)
        self.recent.append(ms)  # the median shrugs off a stall in every other step and follows a new level
        self.recent_steps.append(number)
        self._since_check += 1

    def check(self) -> Slowdown | None:
        """What to record now, if anything (every CHECK_EVERY observed steps)."""
        stall = self._stall()
        if stall is not None:
            return stall
        if self._since_check < CHECK_EVERY or self.threshold is None or len(self.recent) < self.k:
            return None
        self._since_check = 0
        median = statistics.median(self.recent)
        if median <= self.threshold:
            return None
        early = self.early_ms
        self.threshold = median * (1 + self.pct / 100)
        return Slowdown("slower", f"the median of steps {self.recent_steps[0]}–{self.recent_steps[-1]} "
                                  f"({median:.2f} ms) is {100 * (median / early - 1):.0f} % above the early median "
                                  f"({early:.2f} ms, steps {self.early_steps[0]}–{self.early_steps[-1]})")

    def _stall(self) -> Slowdown | None:
        """The newest stall t, with stalls at t − N and t − 2N before it: a period N not recorded yet."""
        if len(self.stalls) < 3:
            return None
        t, seen = self.stalls[-1], set(self.stalls)
        for u in reversed(list(self.stalls)[:-1]):
            period = t - u
            if period >= 2 and t - 2 * period in seen and period not in self.periods_seen:
                break
        else:
            return None
        self.periods_seen.add(period)
        median = statistics.median(self.recent)
        at = [t - 2 * period, t - period, t]
        return Slowdown("stall", f"steps {', '.join(map(str, at))} were each ≥ {max(1 + self.pct / 100, STALL_MIN_X):.1f}× "
                                 f"the median step ({median:.2f} ms): a stall every {period} steps; recording the next "
                                 f"one (step {t + period})", at_step=t + period)

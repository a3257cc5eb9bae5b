"""`--when-slower PCT`: watch the unprofiled step times for the two ways a long run slows down, and say when
a window should record it.

- **Drift**: the median of the last K unprofiled steps is PCT % above the early median (the median of the
  first K unprofiled steps after the loop's start-up). After a window is asked for, the watch takes the
  median of the next K steps as the new level and fires again only PCT % above it (a run that settles at
  the slow level is recorded once, one that keeps slowing down again).
- **Periodic stall**: single steps at least PCT % slower than the median of the last K (and at least
  twice it, and 1 ms longer), three of them at the same distance N (an evaluation, a checkpoint, a log
  line every N steps, a DataLoader restarting its workers each epoch; other slow steps between them do
  not matter, and one that fell in a profiled window, unseen, does not break the count; one seen at its
  normal speed does). The window is placed on the next one: predicted at the last stall + N. Each period
  is recorded once.

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
        self._rearm = False  # a window was asked for: the next K steps set the level to compare with
        self.checked: list[list[int]] = []  # runs of steps checked for stalls ([first, last]): the others went unseen
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
            if self.checked and self.checked[-1][1] == number - 1:
                self.checked[-1][1] = number
            else:
                self.checked.append([number, number])
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
        seen = Slowdown("slower", f"the median of steps {self.recent_steps[0]}–{self.recent_steps[-1]} "
                                  f"({median:.2f} ms) is {100 * (median / early - 1):.0f} % above the early median "
                                  f"({early:.2f} ms, steps {self.early_steps[0]}–{self.early_steps[-1]})")
        self._rearm = True
        self.recent.clear()
        self.recent_steps.clear()
        return seen

    def _checked(self, step: int) -> bool:
        return any(a <= step <= b for a, b in self.checked)

    def _stall(self) -> Slowdown | None:
        """The newest stall t, with two stalls among t − N, t − 2N, t − 3N and none of them seen at normal
        speed: a period N not recorded yet."""
        if len(self.stalls) < 3:
            return None
        t, seen = self.stalls[-1], set(self.stalls)
        # a period is the distance to an earlier stall, or a third or half of it (a stall between went unseen)
        periods = sorted({(t - u) // j for u in self.stalls if u < t for j in (1, 2, 3) if (t - u) % j == 0})
        for period in periods:
            if period < 2 or any(period % p == 0 for p in self.periods_seen):
                continue  # recorded already (its multiples too)
            before = [t - j * period for j in (1, 2, 3)]
            hits = [s for s in before if s in seen]
            if len(hits) >= 2 and not any(self._checked(s) and s not in seen for s in before):
                break
        else:
            return None
        self.periods_seen.add(period)
        median = statistics.median(self.recent)
        at = sorted(hits) + [t]
        return Slowdown("stall", f"steps {', '.join(map(str, at))} were each ≥ {max(1 + self.pct / 100, STALL_MIN_X):.1f}× "
                                 f"the median step ({median:.2f} ms): a stall every {period} steps; recording the next "
                                 f"one (step {t + period})", at_step=t + period)

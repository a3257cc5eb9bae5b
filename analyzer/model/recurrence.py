"""A stall's period, beyond chance: given the steps that were watched and which of them stalled, the
period N at which they recur more than stalls falling at random would. Pure arithmetic over step
numbers, shared by the run-level measures (analyzer/measure/longrun/changepoints.py) and the `--when-slower`
watch in the training process (harness/windows/slowwatch.py), so that a window is recorded for a
period only when the report can name it.

For each distance N that two stalls span, the watched steps N apart from the first stall of a residue
class to the end hold m stalls of e; the chance of m or more when the same number of stalls fall on the
watched steps at random is the hypergeometric tail, multiplied by every (N, first step) with room for
the repeats (Bonferroni over the arithmetic progressions that could have been tested). A period is named
when that is below `ALPHA` (1 %), with at least `min_repeats` (3) stalls covering `min_coverage` (60 %)
of the class; of those that pass, the one with most stalls, then the best coverage, then the shortest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ALPHA = 0.01


@dataclass(frozen=True)
class Period:
    period: int
    steps: list[int]  # the stalled steps of its class
    expected: int  # unprofiled steps in the class from the first stall on
    p_value: float  # hypergeometric tail × the (N, r) pairs that could be tested
    one_off: list[int] = field(default_factory=list)  # stalls outside it


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def hypergeom_tail(population: int, successes: int, draws: int, at_least: int) -> float:
    """P(X ≥ at_least), X the successes among `draws` taken without replacement from `population`."""
    hi = min(successes, draws)
    if at_least > hi:
        return 0.0
    total = _log_comb(population, draws)
    terms = [_log_comb(successes, x) + _log_comb(population - successes, draws - x) - total
             for x in range(max(at_least, 0), hi + 1) if draws - x <= population - successes]
    return float(min(1.0, sum(math.exp(v) for v in terms)))


def periodic(steps, hot, min_repeats: int = 3, min_coverage: float = 0.6, alpha: float = ALPHA) -> Period | None:
    """The stall period beyond chance among the unprofiled `steps` (`hot`: which are stalls), if any."""
    steps = np.asarray(steps, dtype=np.int64)
    hot = np.asarray(hot, dtype=bool)
    at = steps[hot]
    n, h = len(steps), len(at)
    if h < min_repeats or n < 2 * min_repeats:
        return None
    span = int(steps[-1] - steps[0]) + 1
    top = span // (min_repeats - 1) if min_repeats > 1 else span
    # every (N, first stall) with room for the repeats after it: the arithmetic progressions tested
    tests = max(1, sum(span - (min_repeats - 1) * N for N in range(2, top + 1)))
    candidates = {int(b - a) for i, a in enumerate(at) for b in at[i + 1:] if 2 <= b - a <= top}
    # a stall hidden by a profiled window: its neighbours' distance is a multiple of the period
    candidates |= {d // j for d in list(candidates) for j in (2, 3) if d % j == 0 and d // j >= 2}
    best = None
    for N in sorted(candidates):
        residues, counts = np.unique(at % N, return_counts=True)
        for r in residues[counts >= min_repeats]:
            hits = at[at % N == r]
            expected = int(np.count_nonzero((steps >= hits[0]) & (steps % N == r)))
            if expected == 0 or len(hits) / expected < min_coverage:
                continue
            p = min(1.0, tests * hypergeom_tail(n, h, expected, len(hits)))
            if p >= alpha:
                continue
            key = (len(hits), len(hits) / expected, -N)
            if best is None or key > best[0]:
                best = (key, N, hits, expected, p)
    if best is None:
        return None
    _, N, hits, expected, p = best
    chosen = set(int(s) for s in hits)
    return Period(period=int(N), steps=sorted(chosen), expected=expected, p_value=p,
                  one_off=[int(s) for s in at if int(s) not in chosen])

"""Interval arithmetic on numpy arrays: unions and how much of a window a union covers."""

from __future__ import annotations

import numpy as np


def union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping [start, end) intervals into sorted disjoint ones."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if s.size == 0:
        return s, e
    if not (s[1:] >= s[:-1]).all():  # most callers pass intervals already in order: no sort then
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # a new merged interval begins where the start lies past everything seen so far
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    merged_s = s[idx]
    merged_e = reach[np.append(idx[1:] - 1, s.size - 1)]
    return merged_s, merged_e


def covered(merged_s: np.ndarray, merged_e: np.ndarray, lo, hi) -> np.ndarray:
    """Length of the union (already merged, sorted) inside each window [lo[i], hi[i])."""
    lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
    hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
    if merged_s.size == 0:
        return np.zeros(lo.shape)
    lengths = merged_e - merged_s
    prefix = np.concatenate([[0.0], np.cumsum(lengths)])

    def upto(t):
        # covered length in (-inf, t)
        k = np.searchsorted(merged_s, t, side="right")  # intervals starting before t
        full = prefix[k]
        last = np.clip(k - 1, 0, None)
        overshoot = np.where(k > 0, np.clip(merged_e[last] - t, 0, None), 0.0)
        return full - overshoot

    return np.clip(upto(hi) - upto(lo), 0, None)


def total(merged_s: np.ndarray, merged_e: np.ndarray) -> float:
    return float((merged_e - merged_s).sum())


def overlap_each(starts, ends, merged_s, merged_e) -> np.ndarray:
    """For each interval, how much of it the merged union covers."""
    return covered(merged_s, merged_e, starts, ends)


def _inside(merged_s: np.ndarray, merged_e: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Whether each point lies inside the merged union (half-open intervals)."""
    if merged_s.size == 0:
        return np.zeros(x.shape, dtype=bool)
    k = np.searchsorted(merged_s, x, side="right") - 1
    return (k >= 0) & (x < merged_e[np.clip(k, 0, None)])


def _separate(s: np.ndarray, e: np.ndarray) -> bool:
    """Finite, sorted, each interval well formed, and a gap between any two: what `union` returns (it
    merges intervals that touch)."""
    return bool(np.isfinite(s).all() and np.isfinite(e).all() and (e >= s).all() and (s[1:] > e[:-1]).all())


def _intersect_separate(a_s, a_e, b_s, b_e) -> tuple[np.ndarray, np.ndarray]:
    """Where two sorted unions with gaps between their intervals both cover: each interval of `a` against
    the intervals of `b` it overlaps, found by binary search. The pieces come out sorted, apart, and
    ending where one of the inputs does, as `_combine_pointwise` finds them point by point."""
    lo = np.searchsorted(b_e, a_s, "right")  # the first interval of b that ends after a's starts
    hi = np.searchsorted(b_s, a_e, "left")  # past the last one that starts before a's ends
    count = np.maximum(hi - lo, 0)
    i = np.repeat(np.arange(len(a_s)), count)
    j = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(lo, count)
    s, e = np.maximum(a_s[i], b_s[j]), np.minimum(a_e[i], b_e[j])
    keep = s < e
    return s[keep], e[keep]


def _combine(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], keep_b: bool):
    a_s, a_e = (np.asarray(v, dtype=np.float64) for v in a)
    b_s, b_e = (np.asarray(v, dtype=np.float64) for v in b)
    if _separate(a_s, a_e) and _separate(b_s, b_e):  # merged unions, as callers pass: by binary search
        if keep_b:
            return _intersect_separate(a_s, a_e, b_s, b_e)
        full = b_e > b_s  # what b leaves of the line: the gaps between its (non-empty) intervals
        gap_s = np.concatenate([[-np.inf], b_e[full]])
        gap_e = np.concatenate([b_s[full], [np.inf]])
        return _intersect_separate(a_s, a_e, gap_s, gap_e)
    return _combine_pointwise(a_s, a_e, b_s, b_e, keep_b)


def _combine_pointwise(a_s, a_e, b_s, b_e, keep_b: bool):
    """Any two sets of intervals (overlapping, unsorted): every elementary piece between their endpoints
    kept or not by whether its middle lies in both (in `a` and not `b`), then merged."""
    pts = np.unique(np.concatenate([a_s, a_e, b_s, b_e]))
    if pts.size < 2:
        return np.empty(0), np.empty(0)
    lo, hi = pts[:-1], pts[1:]
    mid = (lo + hi) / 2
    in_b = _inside(b_s, b_e, mid)
    keep = _inside(a_s, a_e, mid) & (in_b if keep_b else ~in_b)
    return union(lo[keep], hi[keep])


def subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The merged union `a` without the merged union `b`."""
    return _combine(a, b, keep_b=False)


def intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Where both merged unions cover."""
    return _combine(a, b, keep_b=True)

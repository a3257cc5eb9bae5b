"""Interval arithmetic on numpy arrays: unions and how much of a window a union covers."""

from __future__ import annotations

import numpy as np


def union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping [start, end) intervals into sorted disjoint ones."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    if s.size == 0:
        return s, e
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

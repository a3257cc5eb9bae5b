"""Per-step figures by the report's one statistic: the median over the steps.

The report's header quotes the median step (`Metrics.median_step_us`) and `per_step` holds one row per
step; a finding that says "X ms per step" next to it must mean the same thing: the median, over the same
steps, of what each step holds (zero for a step that holds none). A total divided by the number of steps
is a mean, and one slow step moves it where it does not move the median the header quotes.
"""

from __future__ import annotations

import numpy as np

from . import intervals as iv
from .metrics import Metrics
from .steps import launch_steps, step_windows


def windows(m: Metrics) -> tuple[np.ndarray, np.ndarray]:
    """The steps' windows, in `per_step` row order (the whole window without steps)."""
    return step_windows(m.steps, m.window)


def sums(m: Metrics, ts, values=None) -> np.ndarray:
    """Per step: the sum of `values` (a count without them) of the events starting at `ts` inside it."""
    lo, hi = windows(m)
    ts = np.asarray(ts, dtype=float)
    v = np.ones(ts.shape) if values is None else np.asarray(values, dtype=float)
    k = np.searchsorted(lo, ts, side="right") - 1
    inside = (k >= 0) & (ts < hi[np.clip(k, 0, None)]) if len(lo) else np.zeros(ts.shape, dtype=bool)
    return np.bincount(k[inside], weights=v[inside], minlength=len(lo)).astype(float)


def issued(m: Metrics, ts, values=None) -> np.ndarray:
    """Per step: the sum of `values` (a count without them) of the CPU-side events (calls, ops, launches
    by their launch time) issued at `ts` in that step's iteration: the step whose CPU span holds them, a
    call between two spans belonging to the earlier (`launch_steps`). Without steps: those in the window.
    Unlike `sums`, which places events on the steps' timeline windows (a GPU-bound step's window is its
    GPU time, later than the CPU span that issued its work), this counts what each iteration issued."""
    if not m.steps:
        return sums(m, ts, values)
    ts = np.asarray(ts, dtype=float)
    v = np.ones(ts.shape) if values is None else np.asarray(values, dtype=float)
    k = launch_steps(m.steps, ts)
    return np.bincount(k[k >= 0], weights=v[k >= 0], minlength=len(m.steps)).astype(float)


def by_index(m: Metrics, step, values=None) -> np.ndarray:
    """Per step: the sum of `values` (a count without them) of rows already placed on a step by index into
    `m.steps` (a table's `step` column; −1: outside every step). Without steps: every row."""
    step = np.asarray(step, dtype=np.int64)
    v = np.ones(step.shape) if values is None else np.asarray(values, dtype=float)
    if not m.steps:
        return np.array([v.sum()], dtype=float)
    return np.bincount(step[step >= 0], weights=v[step >= 0], minlength=len(m.steps)).astype(float)


def count_text(n: float) -> str:
    """A median count as the report writes it: whole, or with one decimal (the median of an even number
    of steps can fall between two counts)."""
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def count_of(n: float, noun: str, plural: str | None = None) -> str:
    """`count_text(n)` with its noun, singular for exactly one ("1 copy", "2 copies", "1.5 copies"); the
    plural is the noun + "s" unless given. In a compound noun only the last word changes ("1 fill kernel")."""
    return f"{count_text(n)} {noun if float(n) == 1 else (plural or noun + 's')}"


def a_median(m: Metrics) -> str:
    """"a median " before a figure per step, or nothing when the trace holds one step: its figure is that
    step's own ("3.2 ms of the 41.0 ms step", not "a median 3.2 ms of each 41.0 ms step")."""
    return "" if len(m.steps) == 1 else "a median "


def each_step(m: Metrics) -> str:
    """"each" step, or "the" step when the trace holds one."""
    return "the" if len(m.steps) == 1 else "each"


def the_median_step(m: Metrics) -> str:
    """"the median step", or "the step" when the trace holds one."""
    return "the step" if len(m.steps) == 1 else "the median step"


def covered(m: Metrics, starts, ends) -> np.ndarray:
    """Per step: the time inside it covered by the intervals [starts, ends)."""
    lo, hi = windows(m)
    return iv.covered(*iv.union(np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)), lo, hi)


def median(per_step_values) -> float:
    """The report's statistic over one value per step."""
    v = np.asarray(per_step_values, dtype=float)
    return float(np.median(v)) if v.size else 0.0

"""Where a step-time series changed, and how: the onset of a drift and its shape, a warm-up, and stalls
that recur at one period beyond chance. The run-level rules (step-time-drift, periodic-stall) and the
run's summary read these; `bench/bench_changepoints.py` measures them on labelled series.

The method is our own, documented here, and chosen by the benchmark (bench/bench_changepoints.py, 1 200
labelled series, both methods in one run) over the threshold rule it replaces, which put a climb's onset
where its local median crossed a quarter of the way up: onsets within ±5 % of the run went from 2 % to
98 % on linear climbs and from 14 % to 90 % on exponential ones (97 → 99 % on step changes), and drifts
named on pure noise from 3.3 % to 0 % (GC-like pauses: periods named wrongly from 34 % to 0 %). A library
was not taken: `ruptures`' PELT and binary segmentation need a penalty tuned per noise level and a
significance test of their own anyway, offer no exponential-climb cost, and would be a compiled
dependency for ~2 000 points that numpy's prefix sums fit exactly at every split.

1. **Clean.** Each point's local level is the median of the points within K/2 steps of it; points more
   than 3 robust standard deviations (1.4826 · MAD of the residuals) from it are pulled back to that
   bound, so that stalls and GC-like pauses do not move a level or a trend.
2. **Noise.** σ is the robust spread of the cleaned series' first differences (1.4826 · MAD / √2):
   a level change or a trend moves it by one difference at most. The CUSUM test below divides by the
   noise's long-run spread instead when its steps follow each other (`long_run_sigma`: a busy machine slows
   a run of steps, not one): on 300 series of AR(1) noise with lag-1 correlation 0.3–0.6, a drift was named
   in 89 before (30 %), in 3 after (1 %); on white noise in 3 and 1.
3. **Warm-up.** The split in the first fifth of the series that makes the steps before it slowest
   against the steps after it (Welch-like z of the two means, σ as above); a z above `WARMUP_Z` with the
   early steps slower is a warm-up, left out of everything that follows.
4. **Is there a change at all?** The CUSUM test (Page; Brown, Durbin and Evans): the largest excursion of
   the cumulative sum of the deviations from the mean, over σ·√n, against the Kolmogorov distribution
   (the supremum of a Brownian bridge): a change is named only when its chance under a steady series is
   below `ALPHA` (1 %). A level change and a trend both make the excursion large; noise does not.
5. **Where, and what shape.** Three models, each fitted by least squares at every split τ from prefix
   sums (O(n) per model): a **step** (one level before τ, another after), a **linear climb** (a level, then
   a + s·(t − τ)) and a **faster climb** (a level, then a + b·(exp((t − τ)/T) − 1), T on a grid of 2–70 %
   of the span). The shape is the model with the lowest BIC (n·log(SSE/n) + parameters·log n); the onset
   is its τ: for a climb the step where the series left its early level, not the first step above a
   threshold. An exponential's τ cannot be told from the data (moving τ earlier and shrinking b gives the
   same curve), so its onset is where the fitted excess reaches σ: where it left the early level's noise.
   Binary segmentation: each side of a step, and the part before a climb, are searched again the same
   way; the drift's onset is the first change that rose above the early level.
   **The onset is dated again on the drift's own stretch** (from the change before it to where it ended;
   binary segmentation may have split a curve), by every growth law a loop's step time follows: a step,
   a + b·u^p for p = 1, 1.5, 2, 3 (u the steps since the hinge: a list scanned, a sort, a pairwise pass, what
   grows faster still), a + b·u + c·u² and a + b·u + c·u·ln u (a scan and a pairwise pass; a sort of n items
   a step for any n), b, c > 0, and the exponential (24 e-folding times, then 10 between the best one's
   neighbours, twice), each at every split (the power laws first at 100 splits, then near the best one and
   near the interval's ends at a tenth of that spacing, and so on down to every split: a 10 000-step series
   in a median 0.63 s, against 2.27 s for every split near them at once, with the same onsets and ranges).
   The series less a first climb fit is cleaned against its own local level first (a local median of the
   series lags a steep curve's last points, and clipping against it bent the curve and put the onset late).
   The fits are weighted by the noise each point carries: on a busy machine the step's spread grows with
   the step (the real loops: ±25 % at 10 ms and at 80 ms alike), so the noise ∝ level^γ, γ ∈ [0, 1] from
   the residuals before the rise and over its last quarter. The onset is the first step of the new regime
   of the fit with the lowest BIC; an exponential's start cannot
   be told from the data (moving it earlier and shrinking b gives the same curve), so its onset is where
   its excess reached the noise of one step.
   **The interval** (`onset_low`, `onset_high`): the onsets of every law and split whose fit the data cannot
   tell from the best one: weighted SSE within 5.99·φ·σ² of the least. The law is chosen by the data as
   well as the onset (a power, an e-folding time), so the range is the projection of their joint 95 %
   region from the profile likelihood, χ²(2) and not χ²(1). A real loop is not its code's law: a pairwise
   pass over a growing list, run 60 times, fitted u² hinged where it began a median 8 φσ² worse than the
   best law over the whole climb (within χ²(1) in 32 % of the runs), and the range held its true onset in
   85 % of them with χ²(1) on the stretches a first fit chose, in all 60 with χ²(2) on the stretches below.
   σ² is the best fit's residual variance and φ its long-run factor (Bartlett, √n lags: autocorrelated
   noise, and the runs of one sign a fit of the wrong shape leaves, count as that much less information).
   The range is the union of that on the whole stretch, on the stretches to where the series' own local
   level rose halfway, 10 σ and 5 σ above its level before the onset (a real loop's law changes on the way:
   a list outgrows a cache, the machine gets busier; fitted to the end, a curve's start bends to the shape
   of its end; the series' level, not a first fit's curve, says where those stretches end: a line fitted to
   a steep end starts late), and, when segmentation split the drift, on its first change's own segment.
   A step's interval is the same union on the stretch between its neighbouring changes (its onset stays the
   two-means split). What it is worth is measured, not assumed: the benchmark's real loops (`--loops`, 280
   of them shipped in bench/real-loops and held to it by tests/test_real_loop_onsets.py) and its series
   with heavy-tailed and autocorrelated noise and laws none of the fits is (docs/long-runs.md has the
   tables).
6. **Recovery.** After the onset, a downward step back (the same CUSUM test on the steps after the onset,
   with its step model) ends the change: `until` is the last step before it.

**Periodic stalls** (`periodic`, analyzer/model/recurrence.py, which the `--when-slower` watch shares): steps at least `min_x` times their local level and `min_excess_ms`
above it. For each distance N that two of them span, the unprofiled steps N apart from the first stall of a
residue class to the end of the series hold m stalls of e; the chance of m or more when the same number
of stalls fall on unprofiled steps at random is the hypergeometric tail, multiplied by every (N, first
step) that could have been tested (Bonferroni over the arithmetic progressions with room for the repeats). A period is named when that is below `ALPHA`, with at least 3 recurrences covering most of
the class (`min_coverage`); of the periods that pass, the one with most stalls (then the best coverage,
then the shortest). Stalls that form no such period are one-off stalls.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gpuadvise.analyzer.model.recurrence import Period, hypergeom_tail, periodic  # noqa: F401 - the measures' API

ALPHA = 0.01
KOLMOGOROV_CRITICAL = {0.10: 1.224, 0.05: 1.358, 0.01: 1.628, 0.001: 1.949}
CLIP_SIGMAS = 3.0
WARMUP_Z = 5.0
WARMUP_SHARE = 0.2
MIN_POINTS = 16
# A rise that came back down and stayed under this share of the early level is passed over for a later
# one: a few steps 5 % slower while the machine was busy (seen: 11.2 → 11.8 ms over steps 16–32 before a
# 4× step at step 40) are beyond chance in a quiet series, but they are not where the slowdown began.
PASSING_RISE = 0.10


@dataclass(frozen=True)
class Change:
    """The series' change, if any. `shape`: "steady", "step", "climb" (linear), "faster climb" (its trend
    grows), "speed-up" (a lasting fall). Steps are the series' own step numbers."""

    shape: str
    onset: int | None = None  # the first step of the new regime
    until: int | None = None  # the last step of it, when the series came back
    before_ms: float | None = None  # the level before the onset (after any warm-up)
    after_ms: float | None = None  # the level the change reached: the new level, or a climb's end
    warmup_until: int | None = None  # the last step of a warm-up, when there was one
    p_value: float | None = None  # of the CUSUM test (steady series ⇒ this large a change)
    sigma_ms: float | None = None  # the noise of one step
    fit: dict = field(default_factory=dict)  # the chosen model's parameters (level, slope, curvature)
    last_before: int | None = None  # the series' last step before the onset (steps between went unseen)
    # the onset's range: the onsets of every growth law that fits about as well as the best (`date_onset`)
    onset_low: int | None = None
    onset_high: int | None = None

    @property
    def is_drift(self) -> bool:
        return self.shape in ("step", "climb", "faster climb")


def local_level(steps: np.ndarray, values: np.ndarray, half: int) -> np.ndarray:
    """For each point, the median of the values whose step is within `half` steps of its own (`steps`
    sorted; a point far from the others keeps its own value)."""
    half = max(half, 1)
    return _window_medians(values, np.searchsorted(steps, steps - half, side="left"),
                           np.searchsorted(steps, steps + half, side="right"))


def _window_medians(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each point, the median of values[lo:hi] (NaN where that is empty)."""
    n = len(values)
    if n == 0:
        return values.astype(float)
    width = max(int((hi - lo).max()), 1)
    idx = lo[:, None] + np.arange(width)[None, :]
    grid = np.where(idx < hi[:, None], values.astype(float)[np.minimum(idx, n - 1)], np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty window: NaN
        return np.nanmedian(grid, axis=1)


def _mad(x: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def clean(steps: np.ndarray, ms: np.ndarray, half: int) -> tuple[np.ndarray, float]:
    """The series with its outliers pulled to 3 robust σ of their local level, and σ of one step. A point is
    an outlier when it is that far from the median of the steps before it and from that of the steps after it
    (within `half` steps each), and is pulled towards the nearer: the first steps of a new level are far
    from the steps before them only (a window recorded just after a jump leaves few steps after it, and
    a median of both sides then lies at the old level)."""
    level = local_level(steps, ms, half)
    spread = max(_mad(ms - level), 1e-3 * float(np.median(ms)), 1e-6)
    half, here = max(half, 1), np.arange(len(ms))
    lo, hi = np.searchsorted(steps, steps - half, side="left"), np.searchsorted(steps, steps + half, side="right")
    enough = max(3, half // 2)  # a side with fewer steps is no level (two pauses in a row would vouch for each other)
    before = np.where(here - lo >= enough, _window_medians(ms, lo, here), level)
    after = np.where(hi - here - 1 >= enough, _window_medians(ms, here + 1, hi), level)
    near = np.where(np.abs(ms - before) <= np.abs(ms - after), before, after)
    y = np.clip(ms, near - CLIP_SIGMAS * spread, near + CLIP_SIGMAS * spread)
    sigma = _mad(np.diff(y)) / math.sqrt(2.0) if len(y) > 2 else spread
    return y, max(sigma, 1e-3 * float(np.median(ms)), 1e-6)


def long_run_sigma(y: np.ndarray, sigma: float) -> float:
    """The σ the CUSUM test divides by: one step's noise `sigma`, or more when the noise is autocorrelated
    (a busy machine slows a run of steps, not one): the spread of a sum of n noisy steps is σ_LR·√n, with
    σ_LR² = σ²·(1 + ρ)/(1 − ρ) for a lag-1 autocorrelation ρ. ρ comes from the spread of the lag-1 and lag-2
    differences, whose variances are 2σ²(1 − ρ) and 2σ²(1 − ρ²) for such noise (each difference clipped to
    3 robust σ of its median: a level change moves a few of them, a trend all of them by a constant); never
    below `sigma`."""
    if len(y) < 8:
        return sigma

    def spread(d):
        mid, s = float(np.median(d)), _mad(d)
        return float(np.var(np.clip(d, mid - CLIP_SIGMAS * s, mid + CLIP_SIGMAS * s)))

    v1, v2 = spread(np.diff(y)), spread(y[2:] - y[:-2])
    if v1 <= 0:
        return sigma
    rho = min(v2 / v1 - 1.0, 0.9)
    if rho <= 0:
        return sigma
    return max(sigma, math.sqrt(v1 / (2.0 * (1.0 - rho)) * (1.0 + rho) / (1.0 - rho)))


def kolmogorov_p(stat: float) -> float:
    """P(sup |Brownian bridge| > stat): the Kolmogorov distribution's tail."""
    if stat <= 0.3:
        return 1.0
    k = np.arange(1, 101)
    return float(min(1.0, max(0.0, 2.0 * np.sum((-1.0) ** (k - 1) * np.exp(-2.0 * k * k * stat * stat)))))


def cusum_p(y: np.ndarray, sigma: float) -> float:
    n = len(y)
    if n < 4 or sigma <= 0:
        return 1.0
    s = np.cumsum(y - y.mean())
    return kolmogorov_p(float(np.max(np.abs(s))) / (sigma * math.sqrt(n)))


def _warmup_end(y: np.ndarray, sigma: float) -> int:
    """How many leading points are a warm-up (0 when none)."""
    n = len(y)
    m = max(4, int(WARMUP_SHARE * n))
    if n < 2 * m:
        return 0
    best, at = 0.0, 0
    c = np.concatenate([[0.0], np.cumsum(y)])
    for t in range(2, m + 1):
        before = c[t] / t
        after = (c[t + m] - c[t]) / m
        z = (before - after) / (sigma * math.sqrt(1.0 / t + 1.0 / m))
        if z > best:
            best, at = z, t
    return at if best >= WARMUP_Z else 0


# of the series' span: the e-folding times tried while searching for changes, and (finer, 24 from 2 % to the
# whole span, then 10 between the best one's neighbours, twice) when a climb's onset is refined
EXP_TIMESCALES = (0.02, 0.035, 0.05, 0.07, 0.1, 0.14, 0.2, 0.3, 0.45, 0.7)
EXP_TIMESCALES_FINE = tuple(float(v) for v in np.geomspace(0.02, 1.0, 24))
EXP_REFINE = float(EXP_TIMESCALES_FINE[1] / EXP_TIMESCALES_FINE[0])  # then 10 between the best one's neighbours, twice
# χ²(2) at 95 %: the onset's range is the projection of the joint 95 % region of the onset and the growth law's
# shape (its power, its e-folding time: the law is chosen by the data too), from the profile likelihood
CI_CHI2 = 5.99


class Profile(NamedTuple):
    """One model's least squares at every split (or split and e-folding time)."""

    sse: np.ndarray
    at: np.ndarray  # the onset each entry puts the change at: a step's first step, a climb's hinge (an
    # exponential's hinge too: where its excess reaches σ is `exp_onsets(*exp, σ)`)
    params: Callable[[int], dict]  # entry → the fitted parameters, in steps and ms
    taus: np.ndarray  # entry → the split index
    exp: tuple | None = None  # an exponential's (hinge step, e-folding time in steps, scale) per entry


def _profiles(t: np.ndarray, y: np.ndarray, models=("step", "climb", "faster climb"),
              timescales=EXP_TIMESCALES) -> dict:
    """For each model, its least squares at every split τ (the new regime starts at point τ), from suffix
    sums (the normal equations, batched): {model: Profile}. A climb's onset is its hinge; an exponential's
    is where its fitted excess reaches σ (worked out by the caller, who knows σ)."""
    n = len(y)
    out = {}
    taus = np.arange(2, n - 1)
    if not len(taus):
        return out
    c1, c2 = np.concatenate([[0.0], np.cumsum(y)]), float(y @ y)
    S = float(c1[n])
    n1, n2 = taus.astype(float), (n - taus).astype(float)
    if "step" in models:  # two means
        s1, s2 = c1[taus], c1[n] - c1[taus]
        sse = c2 - s1 ** 2 / n1 - s2 ** 2 / n2
        out["step"] = Profile(sse, t[taus], lambda i: {"before": float(s1[i] / n1[i]), "after": float(s2[i] / n2[i])},
                              taus)
    lo, width = float(t[0]), max(float(t[-1] - t[0]), 1.0)
    x = (t - lo) / width  # t scaled to [0, 1]
    c = x[taus - 1]  # u = max(0, x − c): zero up to point τ − 1

    def suffix(v):
        return np.concatenate([np.cumsum(v[::-1])[::-1], [0.0]])[taus]

    def two(G1, G2, GY):
        """Least squares of y = a + b·g at every split, given Σg, Σg², Σg·y over the suffix."""
        det = n * G2 - G1 * G1
        ok = det > 1e-12 * max(n, 1)
        a = np.where(ok, (S * G2 - G1 * GY) / np.where(ok, det, 1.0), S / n)
        b = np.where(ok, (n * GY - G1 * S) / np.where(ok, det, 1.0), 0.0)
        return a, b, c2 - a * S - b * GY

    X1, Y0 = suffix(x), suffix(y)
    if "climb" in models:  # linear climb: y = a + s·u
        X2, Y1 = suffix(x * x), suffix(x * y)
        U1, U2, UY = X1 - c * n2, X2 - 2 * c * X1 + c * c * n2, Y1 - c * Y0
        a, b, sse = two(U1, U2, UY)
        sse = np.where(b > 0, sse, np.inf)
        al, bl = a, b
        out["climb"] = Profile(sse, t[taus - 1], lambda i: {"level": float(al[i]), "slope_per_step": float(bl[i] / width)},
                               taus)
    if "faster climb" in models:  # y = a + b·(exp(u / T) − 1), for each T of `timescales`: rows of one array
        rows_sse, rows_a, rows_b = [], [], []
        for T in timescales:
            e1, e2 = suffix(np.exp(x / T)), suffix(np.exp(2 * x / T))
            ey = suffix(y * np.exp(x / T))
            k = np.exp(-c / T)
            G1 = k * e1 - n2
            G2 = k * k * e2 - 2 * k * e1 + n2
            GY = k * ey - Y0
            a, b, sse = two(G1, G2, GY)
            rows_sse.append(np.where(b > 0, sse, np.inf))
            rows_a.append(a)
            rows_b.append(b)
        m = len(taus)
        out["faster climb"] = _exp_profile(np.concatenate(rows_sse), np.tile(t[taus - 1], len(timescales)),
                                           np.concatenate(rows_a), np.concatenate(rows_b),
                                           np.repeat(np.array(timescales) * width, m), np.tile(taus, len(timescales)))
    return out


def _exp_profile(sse, before, level, b, scales, taus) -> Profile:
    def exp_params(i):
        return {"level": float(level[i]), "scale_ms": float(b[i]), "efold_steps": float(scales[i])}

    return Profile(sse, before, exp_params, taus, (before, scales, b))


def _fits(t: np.ndarray, y: np.ndarray, models=("step", "climb", "faster climb")) -> dict:
    """For each model, (sse, split index τ, params) at its best split: the new regime starts at point τ."""
    out = {}
    for name, prof in _profiles(t, y, models).items():
        sse, params, taus = prof.sse, prof.params, prof.taus
        i = int(np.argmin(sse))
        if np.isfinite(sse[i]):
            out[name] = (float(sse[i]), int(taus[i]), params(i))
    return out


def exp_onsets(before: np.ndarray, scales: np.ndarray, b: np.ndarray, sigma: float) -> np.ndarray:
    """Where an exponential climb's fitted excess b·(exp((t − before)/T) − 1) reaches σ (a step number,
    not rounded): its start cannot be told from the data (b·e^(−Δ/T) trades with τ), where it left the
    early level's noise can."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return before + scales * np.log1p(sigma / np.where(b > 0, b, np.nan))


@dataclass(frozen=True)
class Onset:
    """A drift's onset dated on its own stretch of the series: the best fit's onset and shape, and the range
    every growth law that fits allows (`date_onset`)."""

    shape: str
    at: float  # the first step of the new regime
    low: float
    high: float
    params: dict


def _curve(t: np.ndarray, shape: str, params: dict, hinge: float) -> np.ndarray:
    """A climb model's fitted values: its level, then its excess from `hinge` on."""
    u = np.maximum(t - hinge, 0.0)
    if shape == "climb":
        return params["level"] + params["slope_per_step"] * u
    return params["level"] + params["scale_ms"] * np.expm1(u / params["efold_steps"])


def _bic(n: int, sse: float, shape: str) -> float:
    return n * math.log(max(sse, 1e-12) / n) + PARAMS[shape] * math.log(n)


def _best_climb(t: np.ndarray, y: np.ndarray, finer: int = 0, timescales=EXP_TIMESCALES_FINE):
    """(shape, part, index, parts) of the climb fit with the lowest BIC among `parts`, a list of (shape,
    profile): the linear climb's and the exponential's at `timescales`, then, `finer` times, at 10
    e-folding times between the best one's neighbours (an exponential's onset moves with it). None when
    no climb fits."""
    n = len(y)
    parts = list(_profiles(t, y, ("climb", "faster climb"), timescales).items())
    width = max(float(t[-1] - t[0]), 1.0)

    def best_of(shapes):
        found = None
        for j, (shape, prof) in enumerate(parts):
            if shape not in shapes:
                continue
            i = int(np.argmin(prof.sse))
            if np.isfinite(prof.sse[i]) and (found is None or _bic(n, float(prof.sse[i]), shape) < found[0]):
                found = (_bic(n, float(prof.sse[i]), shape), shape, j, i)
        return found

    for _ in range(finer):
        exp = best_of(("faster climb",))
        if exp is None:
            break
        T = parts[exp[2]][1].exp[1][exp[3]] / width
        near = tuple(np.geomspace(T / EXP_REFINE, T * EXP_REFINE, 10))
        parts.append(("faster climb", _profiles(t, y, ("faster climb",), near)["faster climb"]))
    best = best_of(("climb", "faster climb"))
    return None if best is None else (best[1], best[2], best[3], parts)


# -- dating an onset ----------------------------------------------------------------------------------------

# The growth laws a drift may follow from its onset, u steps on: a step (a new level), a + b·u^p for each p here
# (a list scanned: 1; sorted: a little over 1; compared pairwise: 2; a cubic for what grows faster still), the
# two-term laws of `_hinge_fits` and an exponential, dated where its rise reached the noise (its start cannot be
# told from the data).
CLIMB_POWERS = (1.0, 1.5, 2.0, 3.0)
# The stretches a climb is dated on besides the whole: to where the series' local level reached these shares of
# its whole rise, and these multiples of one step's noise above its level before the onset. A real loop's law
# changes on the way (a list outgrows a cache, the machine gets busier): fitted to the end, the curve's start
# bends to the shape of its end; on a short stretch the start's own shape decides.
WINDOW_SHARES = (0.5,)
WINDOW_SIGMAS = (10.0, 5.0)
COARSE_SPLITS = 100  # splits each hinged law is fitted at first (each costs a pass over the stretch), then the
REFINE_STEPS = 10  # splits near the best one and near the ends of the range, at a tenth of the spacing each time


@dataclass
class _Fits:
    """One growth law's least squares at each split: `sse`, the `onsets` (first steps of the new regime; for
    an exponential, where its excess reached the noise: set once the noise is known) and `curve(i)`, the
    fitted values of split i."""

    shape: str
    params: int
    sse: np.ndarray
    onsets: np.ndarray | None
    curve: Callable[[int], np.ndarray]
    exp: tuple | None = None  # an exponential's (hinge step, e-folding time in steps, scale) per split


def _ab(W: float, S: float, SS: float, G1, G2, GY):
    """Weighted least squares of y = a + b·g at each split from Σw, Σwy, Σwy² and Σwg, Σwg², Σwgy: (a, b,
    SSE), the SSE infinite where b ≤ 0 (no rise)."""
    det = W * G2 - G1 * G1
    ok = det > 1e-12 * W * np.maximum(G2, 1e-300)
    a = np.where(ok, (S * G2 - G1 * GY) / np.where(ok, det, 1.0), S / W)
    b = np.where(ok, (W * GY - G1 * S) / np.where(ok, det, 1.0), 0.0)
    return a, b, np.where(b > 0, np.maximum(SS - a * S - b * GY, 0.0), np.inf)


def _two_terms(W: float, S: float, SS: float, w, y, g1: np.ndarray, g2: np.ndarray,
               onsets: np.ndarray) -> _Fits:
    """Weighted least squares of y = a + b·g1 + c·g2 (b, c > 0) for each row of g1, g2 (one split each)."""
    g1w, g2w = g1 * w, g2 * w
    m = np.empty((len(g1), 3, 3))
    m[:, 0, 0] = W
    m[:, 0, 1] = m[:, 1, 0] = g1w.sum(axis=1)
    m[:, 0, 2] = m[:, 2, 0] = g2w.sum(axis=1)
    m[:, 1, 1] = np.einsum("ij,ij->i", g1w, g1)
    m[:, 1, 2] = m[:, 2, 1] = np.einsum("ij,ij->i", g1w, g2)
    m[:, 2, 2] = np.einsum("ij,ij->i", g2w, g2)
    r = np.stack([np.full(len(g1), S), g1w @ y, g2w @ y], axis=1)
    scale = m[:, 0, 0] + m[:, 1, 1] + m[:, 2, 2]
    coef = np.linalg.solve(m + 1e-12 * scale[:, None, None] * np.eye(3), r[..., None])[..., 0]
    sse = np.where((coef[:, 1:] > 0).all(axis=1), np.maximum(SS - (coef * r).sum(axis=1), 0.0), np.inf)
    return _Fits("faster climb", PARAMS["faster climb"], sse, onsets,
                 lambda i: coef[i, 0] + coef[i, 1] * g1[i] + coef[i, 2] * g2[i])


def _hinge_fits(t: np.ndarray, y: np.ndarray, w: np.ndarray, grid: np.ndarray) -> list[_Fits]:
    """The growth laws with a hinge, fitted by least squares weighted by `w` at the splits `grid` (the new
    regime starts at point τ, u = steps since the point before it): a + b·u^p for each of `CLIMB_POWERS`,
    a + b·u + c·u² (a scan and a pairwise pass, or whatever lies between the powers) and a + b·u + c·u·ln u
    (a sort: n log n for any n per step), every coefficient of u > 0."""
    width = max(float(t[-1] - t[0]), 1.0)
    x = (t - t[0]) / width
    wy = w * y
    W, S, SS = float(w.sum()), float(wy.sum()), float(wy @ y)
    hinge, onsets = x[grid - 1], t[grid].astype(float)
    d = np.maximum(x[None, :] - hinge[:, None], 0.0)
    out = []
    for p in CLIMB_POWERS:
        g = d if p == 1.0 else d * d if p == 2.0 else d * d * d if p == 3.0 else d ** p
        gw = g * w
        a, b, sse = _ab(W, S, SS, gw.sum(axis=1), np.einsum("ij,ij->i", gw, g), gw @ y)
        # a power other than 1 was chosen among several: one parameter more, as the exponential's time scale
        out.append(_Fits("climb" if p == 1.0 else "faster climb", PARAMS["climb"] + (p != 1.0), sse, onsets,
                         lambda i, a=a, b=b, p=p: a[i] + b[i] * np.maximum(x - hinge[i], 0.0) ** p))
    steps = d * width  # u in steps, so that u·ln u ≥ 0
    for g1, g2 in ((d, d * d), (steps, steps * np.log(np.maximum(steps, 1.0)))):
        out.append(_two_terms(W, S, SS, w, y, g1, g2, onsets))
    return out


def _step_exp_fits(t: np.ndarray, y: np.ndarray, w: np.ndarray) -> list[_Fits]:
    """The step (two means) and the exponential a + b·(exp(u/T) − 1) at 24 e-folding times from 2 % of the
    stretch to all of it, then 10 between the best one's neighbours, twice (an exponential's onset moves with
    it), weighted by `w`, at every split (suffix sums: one pass each)."""
    n = len(y)
    taus = np.arange(2, n - 1)
    width = max(float(t[-1] - t[0]), 1.0)
    x = (t - t[0]) / width
    wy = w * y
    W, S, SS = float(w.sum()), float(wy.sum()), float(wy @ y)
    cw, cy = np.concatenate([[0.0], np.cumsum(w)]), np.concatenate([[0.0], np.cumsum(wy)])
    before, after = cy[taus] / cw[taus], (S - cy[taus]) / (W - cw[taus])
    out = [_Fits("step", PARAMS["step"], SS - before * cy[taus] - after * (S - cy[taus]), t[taus].astype(float),
                 lambda i: np.where(np.arange(n) < taus[i], before[i], after[i]))]

    def suffix(v):
        return np.concatenate([np.cumsum(v[::-1])[::-1], [0.0]])[taus]

    c, W0, Y0 = x[taus - 1], suffix(w), suffix(wy)

    def exponentials(timescales):
        for T in timescales:  # g = exp((x − c)/T) − 1 after the hinge c
            k = np.exp(-c / T)
            e1, e2, ey = suffix(w * np.exp(x / T)), suffix(w * np.exp(2 * x / T)), suffix(wy * np.exp(x / T))
            a, b, sse = _ab(W, S, SS, k * e1 - W0, k * k * e2 - 2 * k * e1 + W0, k * ey - Y0)
            out.append(_Fits("faster climb", PARAMS["faster climb"], sse, None,
                             lambda i, a=a, b=b, T=T: a[i] + b[i] * np.expm1(np.maximum(x - c[i], 0.0) / T),
                             (t[taus - 1].astype(float), np.full(len(taus), T * width), b)))

    exponentials(EXP_TIMESCALES_FINE)
    for _ in range(2):
        T = out[min(range(1, len(out)), key=lambda j: float(np.min(out[j].sse)))].exp[1][0] / width
        exponentials(np.geomspace(T / EXP_REFINE, T * EXP_REFINE, 10))
    return out


def long_run_factor(e: np.ndarray) -> float:
    """How much the residuals' autocorrelation inflates the spread of a sum of them: their long-run variance
    over their variance (Bartlett kernel, √n lags), at least 1. White noise: 1; a fit of the wrong shape
    leaves runs of residuals of one sign, and counts as noise that much slower."""
    e = e - e.mean()
    n = len(e)
    v = float(e @ e) / n if n else 0.0
    if n < 8 or v <= 0:
        return 1.0
    lags = min(int(math.ceil(math.sqrt(n))), n - 2)
    acf = np.array([float(e[k:] @ e[:-k]) / n / v for k in range(1, lags + 1)])
    return max(1.0, 1.0 + 2.0 * float(np.sum((1.0 - np.arange(1, lags + 1) / (lags + 1)) * acf)))


def _plausible(t: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[float, float, tuple, float] | None:
    """On one stretch, weighted by `w` (the inverse of each point's noise variance, up to a factor): (low,
    high, best, φ): the onsets of every law and split whose fit the data cannot tell from the best one (SSE
    within χ²(2, 95 %)·φ·σ² of the least: the profile likelihood, the onset and the law's shape free; σ² the
    best fit's residual variance, φ its long-run factor), and the (shape, onset) of the fit with the lowest BIC."""
    n = len(y)
    if n < MIN_POINTS:
        return None
    w = np.ones(n) if w is None else w / float(np.mean(w))
    splits = np.arange(2, n - 1)
    coarse = splits if len(splits) <= COARSE_SPLITS else \
        np.unique(np.linspace(2, n - 2, COARSE_SPLITS).round().astype(int))
    fits = _step_exp_fits(t, y, w) + _hinge_fits(t, y, w, coarse)

    def bound_of(fits):
        best = min(fits, key=lambda f: float(np.min(f.sse)))
        i = int(np.argmin(best.sse))
        least = float(best.sse[i])
        sigma2 = least / max(n - PARAMS["faster climb"], 1)
        phi = long_run_factor((y - best.curve(i)) * np.sqrt(w))
        return least + CI_CHI2 * phi * sigma2, sigma2, phi

    # the splits near each hinged law's best and the ends of its plausible ones, finer and finer (a tenth of the
    # spacing each time) to every split: a few hundred fits at most, however long the stretch
    allowed = set(splits.tolist())
    grid, spacing = coarse, (int(np.max(np.diff(coarse))) if len(coarse) < len(splits) else 1)
    while spacing > 1:
        bound = bound_of(fits)[0]
        stride = -(-spacing // REFINE_STEPS)
        near = set()
        for f in fits[-(len(CLIMB_POWERS) + 2):]:
            ok = np.flatnonzero(f.sse <= bound)
            for j in ([int(np.argmin(f.sse))] + ([int(ok[0]), int(ok[-1])] if len(ok) else [])):
                near.update(range(int(grid[j]) - spacing, int(grid[j]) + spacing + 1, stride))
        grid, spacing = np.array(sorted(near & allowed), dtype=int), stride
        if not len(grid):
            break
        fits += _hinge_fits(t, y, w, grid)
    fits = [f for f in fits if np.isfinite(f.sse).any()]
    if not fits:
        return None
    bound, sigma2, phi = bound_of(fits)
    noise = math.sqrt(sigma2 / float(w[0]))  # one step's noise at the early level, in ms
    low, high, pick = math.inf, -math.inf, None
    for f in fits:
        onsets = f.onsets if f.onsets is not None else np.ceil(exp_onsets(*f.exp, noise) - 1e-9)
        # an exponential too small to reach the noise within the stretch rose nowhere in it
        near = np.isfinite(f.sse) & np.isfinite(onsets) & (f.sse <= bound) & (onsets <= t[-1])
        if near.any():
            low, high = min(low, float(onsets[near].min())), max(high, float(onsets[near].max()))
        j = int(np.argmin(np.where(np.isfinite(onsets), f.sse, np.inf)))
        if np.isfinite(f.sse[j]) and np.isfinite(onsets[j]):
            bic = n * math.log(max(float(f.sse[j]), 1e-300) / n) + f.params * math.log(n)
            if pick is None or bic < pick[0]:
                pick = (bic, f.shape, float(onsets[j]))
    if pick is None:
        return None
    return low, high, pick[1:], phi


def noise_weights(fitted: np.ndarray, resid: np.ndarray, started: int) -> np.ndarray:
    """Each point's weight in a fit: the inverse of its noise variance, up to a factor. A step's time often
    varies in proportion to it (the machine's load stretches all of the work; seen on the real loops: ±25 %
    at 10 ms and at 80 ms alike), the noise ∝ level^γ; γ in [0, 1] from the residuals' robust spread
    before the rise and over its last quarter against the fitted levels there."""
    n = len(fitted)
    late = max(started, n - max(n // 4, MIN_POINTS // 2))
    if started < MIN_POINTS // 2 or n - late < MIN_POINTS // 2:
        return np.ones(n)
    lo, hi = float(np.median(fitted[:started])), float(np.median(fitted[late:]))
    s_lo, s_hi = _mad(resid[:started]), _mad(resid[late:])
    if lo <= 0 or hi < 1.2 * lo or s_lo <= 0 or s_hi <= 0:
        return np.ones(n)
    gamma = min(max(math.log(s_hi / s_lo) / math.log(hi / lo), 0.0), 1.0)
    return (np.maximum(fitted, 1e-9) / lo) ** (-2.0 * gamma)


def date_onset(t: np.ndarray, y: np.ndarray, raw: np.ndarray, half: int,
               local: tuple[int, int] | None = None) -> Onset | None:
    """The onset of the drift that `t` holds (its early level, then the drift to its end), and its range:
    the onsets of every growth law (`_hinge_fits`, `_step_exp_fits`) that fits about as well as the best
    one (`_plausible`), on the whole stretch, on the stretches to where the series' local level rose
    `WINDOW_SHARES` of its whole rise and `WINDOW_SIGMAS` times the noise above its level before the onset
    (a real loop's law changes on the way), and, when the segmentation split the drift, on the first change's
    own segment `local` (index range).
    The point is the best fit's (lowest BIC) on the whole stretch. The fits are weighted by
    `noise_weights`.

    `y` is the series cleaned against its local level, `raw` as measured: `raw` less a first climb fit is
    cleaned again against its own local level (within `half` steps; a local median of the series itself
    lags a steep curve's last points, and clipping against it bends the curve) before the laws are fitted.
    None when nothing rises."""
    n = len(y)
    if n < MIN_POINTS:
        return None
    first = _best_climb(t, y, timescales=EXP_TIMESCALES)  # a first curve to clean against: the coarse times do
    if first is None:
        return None
    name, j, i, parts = first
    fitted = _curve(t, name, parts[j][1].params(i), float(parts[j][1].at[i]))
    rest = raw - fitted  # what the first fit leaves: noise, stalls, and any trend it missed (a local median follows that)
    level = local_level(t, rest, half)
    spread = max(_mad(rest - level), 1e-9)
    y = fitted + np.clip(rest, level - CLIP_SIGMAS * spread, level + CLIP_SIGMAS * spread)
    started = int(np.argmax(fitted > fitted[0]))  # where the first fit starts to rise
    w = noise_weights(fitted, y - fitted, started)
    whole = _plausible(t, y, w)
    if whole is None:
        return None
    low, high, (shape, at), phi = whole
    # the stretches end where the series itself (its local level) rose so far above its level before the onset:
    # the first fit's curve is no guide to that when its law is wrong (a line fitted to a steep end starts late)
    k0 = _first_at(t, at)
    lev = local_level(t, y, half)
    rise = np.maximum.accumulate(np.maximum(lev - (float(np.median(y[:k0])) if k0 >= 4 else float(lev[0])), 0.0))
    started = min(started, k0)
    stretches = [(0, int(np.searchsorted(rise, share * rise[-1])) + 1) for share in WINDOW_SHARES]
    stretches += [(0, int(np.searchsorted(rise, k * spread)) + 1) for k in WINDOW_SIGMAS]
    stretches += [local] if local is not None else []
    for lo, hi in stretches:  # a stretch holds the start of the rise, a few steps of it, and a rise beyond the noise
        if hi - max(lo, started) < MIN_POINTS or hi > n or (hi, lo) == (n, 0) or rise[hi - 1] - rise[lo] < 3 * spread:
            continue
        part = _plausible(t[lo:hi], y[lo:hi], w[lo:hi])
        if part is not None:
            low, high = min(low, part[0]), max(high, part[1])
    return Onset(shape, at, min(low, at), max(high, at), {"long_run_factor": round(phi, 2)})


PARAMS = {"step": 3, "climb": 3, "faster climb": 4}


def _choose(t: np.ndarray, y: np.ndarray) -> tuple[str, int, dict]:
    n = len(y)
    best = None
    for name, (sse, tau, params) in _fits(t, y).items():
        bic = n * math.log(max(sse, 1e-12) / n) + PARAMS[name] * math.log(n)
        if best is None or bic < best[0]:
            best = (bic, name, tau, params)
    _, name, tau, params = best
    return name, tau, params


def _changes(t: np.ndarray, y: np.ndarray, sigma: float, alpha: float, p: float | None = None) -> list[tuple]:
    """Binary segmentation: (index, shape, params, p) of every change beyond chance, in order. A step
    splits its segment and each side is searched again; a climb's own segment is searched before it and,
    after it, only for a step back down (its trend is no further change)."""
    n = len(y)
    if n < MIN_POINTS:
        return []
    p = cusum_p(y, sigma) if p is None else p
    if p >= alpha:
        return []
    shape, tau, params = _choose(t, y)
    left = _changes(t[:tau], y[:tau], sigma, alpha)
    here = [(tau, shape, params, p)]
    if shape == "step":
        right = [(tau + j, s, q, pp) for j, s, q, pp in _changes(t[tau:], y[tau:], sigma, alpha)]
    else:
        right = []
        rest_t, rest_y = t[tau:], y[tau:]
        if len(rest_y) >= MIN_POINTS and cusum_p(rest_y, sigma) < alpha:
            sse, j, q = _fits(rest_t, rest_y)["step"]
            if q["after"] < q["before"] and q["after"] < float(np.median(y[:tau])) + 0.5 * (q["before"] - float(np.median(y[:tau]))):
                right = [(tau + j, "step", q, None)]
    return left + here + right


def _first_at(t: np.ndarray, at: float) -> int:
    """The index of the first point of the new regime: the first at or after the step `at`."""
    return int(min(np.searchsorted(t, at, side="left"), len(t) - 1))


def find_change(steps, ms, k: int = 20, alpha: float = ALPHA) -> Change:
    """The series' (steps sorted) first lasting rise beyond chance, or why there is none."""
    steps, ms = np.asarray(steps, dtype=float), np.asarray(ms, dtype=float)
    if len(ms) < MIN_POINTS:
        return Change("steady")
    y, sigma = clean(steps, ms, max(k // 2, 2))
    w = _warmup_end(y, sigma)
    warm = int(steps[w - 1]) if w else None
    t, y, raw = steps[w:], y[w:], ms[w:]
    drift_sigma = long_run_sigma(y, sigma)  # a noise whose steps follow each other strays further by chance
    p = cusum_p(y, drift_sigma)
    changes = _changes(t, y, drift_sigma, alpha, p)
    if not changes:
        return Change("steady", warmup_until=warm, p_value=p, sigma_ms=sigma,
                      before_ms=float(np.median(y)) if len(y) else None)
    bounds = [0] + [c[0] for c in changes] + [len(y)]
    early = float(np.median(y[:bounds[1]]))

    def level(j):  # the level segment j reached: a step's median, a climb's last K points
        seg = y[bounds[j]:bounds[j + 1]]
        shape = changes[j - 1][1]
        return float(np.median(seg if shape == "step" else seg[-max(k, 5):]))

    for j in range(1, len(bounds) - 1):
        after = level(j)
        if after <= early:
            continue
        idx, shape, params, _ = changes[j - 1]
        if (shape == "step" and after - early < PASSING_RISE * early and j + 1 < len(bounds) - 1
                and changes[j][1] == "step" and level(j + 1) > early + PASSING_RISE * early):
            continue  # a small step, then a jump to a level well above: the slowdown began at the jump
        until, shapes, end = None, [shape], len(y)
        for m in range(j + 1, len(bounds) - 1):  # back below halfway: the regime ended
            if level(m) < early + 0.5 * (after - early):
                until, end = int(t[bounds[m] - 1]), bounds[m]
                break
            after = max(after, level(m))
            shapes.append(changes[m - 1][1])
        if until is not None and after - early < PASSING_RISE * early:
            continue  # a small rise that came back (a busy machine for a while): look for the lasting one
        # a climb that goes on after its first change (binary segmentation splits a curve) keeps its shape
        shape = next(s for s in ("faster climb", "climb", "step") if s in shapes)
        first = bounds[j - 1]
        low = high = float(t[idx])
        if shape == "step":  # dated on the stretch between its neighbouring changes, by every law
            found = _plausible(t[first:bounds[j + 1]], y[first:bounds[j + 1]])
            if found is not None:
                low, high = min(found[0], low), max(found[1], high)
        else:  # the whole climb, from the level before it to where it ended, fitted again as one curve
            split = (0, bounds[j + 1] - first) if len(shapes) > 1 else None  # and its first change's own segment
            found = date_onset(t[first:end], y[first:end], raw[first:end], max(k // 2, 2), split)
            if found is not None:
                shape, params, low, high = found.shape, found.params, found.low, found.high
                idx = first + _first_at(t[first:end], found.at)
        return Change(shape, onset=int(t[idx]), until=until, before_ms=early, after_ms=after, warmup_until=warm,
                      p_value=p, sigma_ms=sigma, fit=params, last_before=int(t[idx - 1]) if idx > 0 else None,
                      onset_low=int(math.floor(low)), onset_high=int(math.ceil(high)))
    idx, shape, params, _ = changes[0]
    return Change("speed-up", onset=int(t[idx]), before_ms=early, after_ms=level(len(bounds) - 2), warmup_until=warm,
                  p_value=p, sigma_ms=sigma, fit=params)


# -- periodic stalls -------------------------------------------------------------------------------------

def stall_steps(steps, ms, k: int, min_x: float, min_excess_ms: float) -> tuple[np.ndarray, np.ndarray]:
    """(hot mask, local level): steps far above the median of the steps around them."""
    steps, ms = np.asarray(steps, dtype=float), np.asarray(ms, dtype=float)
    level = local_level(steps, ms, max(k // 2, 2))
    return (ms >= min_x * level) & (ms - level >= min_excess_ms), level

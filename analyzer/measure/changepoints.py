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
   a level change or a trend moves it by one difference at most.
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
   **A climb's onset is refined** on its whole stretch (from the change before it to where it ended; binary
   segmentation may have split the curve): fitted again, linear and exponential; the series less that fit
   is cleaned against its own local level (a local median of the series lags a steep curve's last points,
   and clipping against it bent the curve and put the onset late) and fitted once more, at 24 e-folding
   times, then 10 between the best one's neighbours, twice (an exponential's onset moves with its
   e-folding time: 10 coarse ones put it 10–30 steps off); an exponential's onset is where its excess
   reaches the residuals' standard deviation. Measured on the benchmark (120 series a family):
   exponential onsets within ±5 % of the run 90.0 → 95.0 %, slow growth unchanged at 88.2 %, the other
   families and the noise and period figures unchanged. Cost, a climb of 600 / 3 000 steps on one core:
   about 2.5 → 8 ms and 7 → 26 ms (steps, noise: unchanged).
   **Confidence interval** (`onset_low`, `onset_high`): the onsets of every fit the data cannot tell from
   the best by the profile likelihood — BIC within χ²(1, 95 %) = 3.84 of the best, linear and exponential
   fits both (for the best shape alone: SSE ≤ SSE_min·e^(3.84/n)) —; for an exponential, where those fits'
   excess reached σ, σ taken as known. On the benchmark it held the truth in 99 % of steps, 94 % of
   linear climbs, 92 % of slow growths and 84 % of exponentials (an exponential's onset moves with σ, which
   the interval does not count). A slow growth under 15 % noise has an interval a quarter of the run wide:
   no method can date it within ±5 %, and the interval says so. The benchmark's yardstick shows it: the
   least-squares fit of the true hinge (the maximum-likelihood onset for a method told the shape) is within
   ±5 % of the run on 87.5 % of slow growths, these change points on 88.2 %; only given the true level and
   slope as well does the onset alone reach 98 %.
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
    # the onset's 95 % confidence interval (profile likelihood, the steps around it): the splits whose fit is
    # within χ²(1) of the best; for an exponential, where those fits' excess reached σ
    onset_low: int | None = None
    onset_high: int | None = None

    @property
    def is_drift(self) -> bool:
        return self.shape in ("step", "climb", "faster climb")


def local_level(steps: np.ndarray, values: np.ndarray, half: int) -> np.ndarray:
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


def _mad(x: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def clean(steps: np.ndarray, ms: np.ndarray, half: int) -> tuple[np.ndarray, float]:
    """The series with its outliers pulled to 3 robust σ of their local level, and σ of one step."""
    level = local_level(steps, ms, half)
    spread = max(_mad(ms - level), 1e-3 * float(np.median(ms)), 1e-6)
    y = np.clip(ms, level - CLIP_SIGMAS * spread, level + CLIP_SIGMAS * spread)
    sigma = _mad(np.diff(y)) / math.sqrt(2.0) if len(y) > 2 else spread
    return y, max(sigma, 1e-3 * float(np.median(ms)), 1e-6)


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
CI_CHI2 = 3.84  # χ²(1) at 95 %: the onset's confidence interval from the profile likelihood


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
    """A climb's onset refined on its own stretch of the series, with its 95 % confidence interval (the
    onsets of the fits, of either shape, whose BIC is within χ²(1) of the best: the profile likelihood)."""

    shape: str
    at: float  # the step (not rounded) where the new regime began
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


def refine_climb(t: np.ndarray, y: np.ndarray, raw: np.ndarray, half: int) -> Onset | None:
    """The onset of the climb that `t` holds (a flat level, then the climb to its end): linear or
    exponential, whichever has the lower BIC on this stretch. `y` is the series cleaned against its local
    level, `raw` as measured: `raw` less the first fit is cleaned again against its own local level (within
    `half` steps; a local median of the series itself lags a steep curve's last points, and clipping against
    it bends the curve), and the second fit, on the first fit plus that, is the answer. An
    exponential's onset is where its excess reaches the noise (the residuals' standard deviation). None
    when neither climb fits (no rise)."""
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
    again = _best_climb(t, fitted + np.clip(rest, level - CLIP_SIGMAS * spread, level + CLIP_SIGMAS * spread), finer=2)
    if again is None:
        return None
    name, j, i, parts = again
    best_bic = _bic(n, float(parts[j][1].sse[i]), name)
    exp_sse = min((float(p.sse.min()) for shape, p in parts if shape == "faster climb"), default=math.inf)
    noise = math.sqrt(exp_sse / max(n - PARAMS["faster climb"], 1)) if math.isfinite(exp_sse) else 0.0
    at, low, high = None, math.inf, -math.inf
    for m, (shape, prof) in enumerate(parts):  # the interval: every fit, of either shape, the data cannot tell from the best
        sse, onsets = prof.sse, prof.at
        if shape == "faster climb":
            onsets = exp_onsets(*prof.exp, noise)
        bound = n * math.exp((best_bic + CI_CHI2 - PARAMS[shape] * math.log(n)) / n)
        near = np.isfinite(sse) & np.isfinite(onsets) & (sse <= bound)
        if near.any():
            low, high = min(low, float(onsets[near].min())), max(high, float(onsets[near].max()))
        if m == j:
            at = float(onsets[i])
    return Onset(name, at, min(low, at), max(high, at), parts[j][1].params(i))


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


def _first_at(t: np.ndarray, at: float, hinge: bool) -> int:
    """The index of the first point of the new regime: after a hinge (its excess is zero there), else at or
    after the step `at`."""
    return int(min(np.searchsorted(t, at, side="right" if hinge else "left"), len(t) - 1))


def _step_interval(t: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """A step's onset's 95 % interval on the stretch between its neighbouring changes: the first steps of
    the new level whose two-means fit is within χ²(1) of the best (profile likelihood)."""
    prof = _profiles(t, y, ("step",)).get("step")
    if prof is None:
        return float(t[0]), float(t[-1])
    sse, onsets = prof.sse, prof.at
    near = sse <= sse.min() * (1.0 + CI_CHI2 / len(y))
    return float(onsets[near].min()), float(onsets[near].max())


def find_change(steps, ms, k: int = 20, alpha: float = ALPHA) -> Change:
    """The series' (steps sorted) first lasting rise beyond chance, or why there is none."""
    steps, ms = np.asarray(steps, dtype=float), np.asarray(ms, dtype=float)
    if len(ms) < MIN_POINTS:
        return Change("steady")
    y, sigma = clean(steps, ms, max(k // 2, 2))
    w = _warmup_end(y, sigma)
    warm = int(steps[w - 1]) if w else None
    t, y, raw = steps[w:], y[w:], ms[w:]
    p = cusum_p(y, sigma)
    changes = _changes(t, y, sigma, alpha, p)
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
        if shape == "step":
            low, high = _step_interval(t[first:bounds[j + 1]], y[first:bounds[j + 1]])
        else:  # the whole climb, from the level before it to where it ended, fitted again as one curve
            found = refine_climb(t[first:end], y[first:end], raw[first:end], max(k // 2, 2))
            if found is None:
                low = high = float(t[idx])
            else:
                shape, params, low, high = found.shape, found.params, found.low, found.high
                idx = first + _first_at(t[first:end], found.at, hinge=shape == "climb")
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

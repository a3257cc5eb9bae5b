"""Change points on labelled step-time series: where a drift began, its shape, a stall's period, and what
pure noise makes each method say. Ground truth is known because the series are made here, from seeds; and
(`--loops`) on real CPU loops whose work starts growing at a known step.

    python bench/bench_changepoints.py                # both methods side by side, 120 series a family
    python bench/bench_changepoints.py --seeds 400    # more series per family
    python bench/bench_changepoints.py --method changepoint   # only the change-point module
    python bench/bench_changepoints.py --loops        # real loops instead: 20 runs a growth law
    python bench/bench_changepoints.py --loops --runs 5 --keep DIR   # fewer, and keep the run folders
    python bench/bench_changepoints.py --loops --again DIR           # read kept run folders again
    python bench/bench_changepoints.py --loops --again bench/real-loops/runs.jsonl.gz   # the runs shipped
    python bench/bench_changepoints.py --loops --pack NEW.jsonl.gz   # and write their step records for --again

Methods:
- `threshold` (before): the run-level measures as they were (the onset at the first step whose local
  median is a quarter of the way from the early median to the slowest, a stall period wherever one
  residue class held most slow steps) and the `--when-slower` watch as it was. Copied below so that the
  two are measured in the same run.
- `changepoint` (after): analyzer/measure/longrun/changepoints.py (CUSUM test, step/linear/exponential fits,
  warm-up, the onset dated by every growth law that fits, hypergeometric period test) and
  harness/windows/slowwatch.py.

Families (each series 150, 300 or 600 steps, base 2, 10 or 50 ms, noise 1–15 % Gaussian, uniform
jitter or log-normal): step change, linear climb, exponential climb, slow growth, periodic stall (periods
7–61, some recurring only twice), random GC-like pauses, warm-up, warm-up then climb, stall then step,
pure noise; and laws none of the fits is, or noise they do not assume: n log n (a history of 30–1000 items
a step, sorted), quadratic, a kinked climb (each item 2–5× slower from some length on: a cache outgrown),
a climb with a dip (a cache flushed once: it falls back part of the way, then goes on), a linear climb
under heavy-tailed noise (Student's t, 3 degrees of freedom) and under autocorrelated noise (AR(1), lag-1
correlation 0.3–0.6), and autocorrelated noise alone. An onset is the first step of the new regime; an
exponential climb's is where its excess reached the noise's standard deviation (its mathematical start is
invisible under noise). Printed per family: how often a drift was found, onset error (median and 95th
percentile, in steps and % of the run; the share within ±5 % of the run), how often a period was found and
was exact, and the `--when-slower` watch's windows (right and wrong triggers). For the change points, per
drift family, the onset's interval: how often it holds the truth (of the drifts found), how wide it is,
and the share within ±5 % among the series it calls resolvable (an interval at most 10 % of the run wide:
a slow growth under 15 % noise can be dated only to a quarter of the run, by any method), and two
yardsticks on the pure step, linear and slow-growth series: the least-squares fit of the true shape (the
maximum-likelihood onset for a method told the shape) and the onset alone with the true level and slope
given. Targets: onset within ±5 % on climbs and step changes, no drift and no periodic stall on pure noise
in 99 % of series, a period found exactly when it recurs at least 3 times.

`--loops`: a training loop (a small model's step, 6–10 ms of host jitter) whose host work starts growing
at a known step by one law — a history scanned in full (linear), sorted (n log n, the case of a history
list sorted every step), compared pairwise (quadratic), a fixed extra pass from that step (a step), and a
scan whose history is cut back once (a climb that dips back) — plus a steady one, each run `--runs` times
(150 or 200 steps, the onset a quarter to 60 % of the way in, the size from a seed) under `gpuadvise
profile --when-slower 50`, timed by the step record the harness writes, read as `gpuadvise analyze` reads
it. Printed per law: runs, how often a drift was found, how often the onset's interval held the true onset
(of all runs), its median width, the point's error, and among the runs whose interval is at most 10 % of
the run wide, how often the point is within ±5 % of the run. The machine's own load is the noise: run
`uptime` beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuadvise.analyzer.measure.longrun.changepoints import find_change, local_level, periodic, stall_steps  # noqa: E402
from gpuadvise.harness.windows.slowwatch import SlowWatch  # noqa: E402

K = 20
MIN_DRIFT_PCT, MIN_DRIFT_MS = 15.0, 0.5  # step-time-drift's thresholds
MIN_X, MIN_EXCESS_MS = 2.0, 1.0  # periodic-stall's
WATCH_PCT = 50.0
DRIFTS = ("step", "linear", "exponential", "slow growth", "warm-up then climb", "stall then step", "n log n", "quadratic",
          "kinked climb", "climb with a dip", "heavy-tailed climb", "autocorrelated climb")
STALLS = ("periodic stall", "stall then step")


# -- the series ------------------------------------------------------------------------------------------

def series(family: str, seed: int) -> dict:
    rng = np.random.default_rng([zlib.crc32(family.encode()), seed])
    n = int(rng.choice([150, 300, 600]))
    base = float(rng.choice([2.0, 10.0, 50.0]))
    cv = float(rng.choice([0.01, 0.05, 0.15]))
    kind = rng.choice(["gauss", "uniform", "lognormal"])
    if family.startswith("heavy-tailed"):
        kind = "student"
    elif family.startswith("autocorrelated"):
        kind = "ar"
    t = np.arange(3, n + 3)
    if kind == "gauss":
        noise = rng.normal(0, cv * base, n)
    elif kind == "uniform":
        noise = rng.uniform(-cv * base * 1.7, cv * base * 1.7, n)
    elif kind == "student":  # heavy tails: Student's t with 3 degrees of freedom, the same spread
        noise = cv * base * rng.standard_t(3, n) / np.sqrt(3.0)
    elif kind == "ar":  # a busy machine slows a run of steps: AR(1), lag-1 correlation 0.3–0.6, the same spread
        rho = rng.uniform(0.3, 0.6)
        z = rng.normal(0, cv * base * np.sqrt(1 - rho * rho), n)
        noise = np.empty(n)
        noise[0] = rng.normal(0, cv * base)
        for i in range(1, n):
            noise[i] = rho * noise[i - 1] + z[i]
    else:
        noise = base * (rng.lognormal(0, cv, n) - np.exp(cv * cv / 2))
    y = base + noise
    truth = {"family": family, "n": n, "onset": None, "period": None, "drift": False, "stall": False}
    onset = int(rng.integers(int(0.2 * n), int(0.8 * n)))
    # an onset is the first step of the new regime: a climb's excess is u·slope there, u = t − onset + 1
    u = np.where(t >= onset, t - onset + 1, 0).astype(float)
    span = float(t[-1] - onset + 1)
    if family in ("step", "stall then step"):
        jump = base * rng.uniform(0.25, 1.0)
        y = y + np.where(t >= onset, jump, 0.0)
        truth.update(onset=onset, drift=True, shape="step", level=base, jump=jump)
    elif family in ("linear", "warm-up then climb", "heavy-tailed climb", "autocorrelated climb"):
        rise = base * rng.uniform(0.4, 2.0)
        y = y + rise * u / span
        truth.update(onset=onset, drift=True, shape="hinge", level=base, slope=rise / span)
    elif family == "exponential":
        efold = span * rng.uniform(0.15, 0.35)
        rise = base * rng.uniform(0.5, 3.0)
        excess = rise * np.expm1(u / efold) / np.expm1(span / efold)
        y = y + excess
        # an exponential has no visible start: it left the early level where its excess reached the noise
        truth.update(onset=int(t[np.argmax(excess >= cv * base)]), drift=True, start=onset)
    elif family == "slow growth":  # memory that fills a cache: 30–50 % over most of the run
        onset = int(rng.integers(int(0.1 * n), int(0.3 * n)))
        u, span = np.where(t >= onset, t - onset + 1, 0).astype(float), float(t[-1] - onset + 1)
        rise = base * rng.uniform(0.3, 0.5)
        y = y + rise * u / span
        truth.update(onset=onset, drift=True, shape="hinge", level=base, slope=rise / span)
    elif family == "n log n":  # a history of m items a step, sorted every step
        m = rng.uniform(30, 1000)
        y = y + base * rng.uniform(0.5, 3.0) * u * np.log(np.maximum(m * u, 1.0)) / (span * np.log(m * span))
        truth.update(onset=onset, drift=True)
    elif family == "quadratic":  # every pair of a growing history compared
        y = y + base * rng.uniform(0.5, 3.0) * (u / span) ** 2
        truth.update(onset=onset, drift=True)
    elif family == "kinked climb":  # a list that outgrows a cache: each item slower from some length on
        knee = onset + int(span * rng.uniform(0.3, 0.6))
        grown = u + rng.uniform(1.0, 4.0) * np.maximum(t - knee, 0)
        y = y + base * rng.uniform(0.5, 3.0) * grown / grown[-1]
        truth.update(onset=onset, drift=True)
    elif family == "climb with a dip":  # a cache flushed once: the climb falls back part of the way, then goes on
        dip = onset + int(span * rng.uniform(0.4, 0.7))
        grown = np.where(t >= dip, u - rng.uniform(0.5, 1.0) * (dip - onset + 1), u)
        y = y + base * rng.uniform(0.5, 3.0) * grown / grown[-1]
        truth.update(onset=onset, drift=True)
    if family in ("warm-up", "warm-up then climb"):
        w = int(rng.integers(3, 16))
        y[:w] += base * rng.uniform(0.5, 4.0) * np.exp(-np.arange(w) / max(w / 3, 1))
    if family in STALLS:
        period = int(rng.choice([7, 16, 25, 40, 61]))
        # some runs hold the stall only twice: no period can be told from two
        first = int(rng.integers(3, period + 3))
        if rng.random() < 0.25:
            first = max(3, n + 3 - int(2.5 * period))
        hits = t[(t >= first) & ((t - first) % period == 0)]
        y[np.searchsorted(t, hits)] += base * rng.uniform(3.0, 10.0) + 2.0
        truth.update(period=period, stall=len(hits) >= 3, recurrences=len(hits))
    if family == "gc pauses":
        idx = rng.choice(n, int(rng.integers(3, 16)), replace=False)
        y[idx] += base * rng.uniform(2.0, 10.0, len(idx)) + 2.0
    return {"t": t, "y": np.maximum(y, 0.05 * base), "truth": truth, "base": base}


FAMILIES = ("step", "linear", "exponential", "slow growth", "periodic stall", "gc pauses", "warm-up",
            "warm-up then climb", "stall then step", "noise", "n log n", "quadratic", "kinked climb", "climb with a dip",
            "heavy-tailed climb", "autocorrelated climb", "autocorrelated noise")


# -- the threshold method, as it was before the change-point module ---------------------------------------

def threshold_drift(t, y):
    level = local_level(t, y, K // 2)
    early = float(np.median(y[:K]))
    slow = float(level.max())
    if slow <= early:
        return None
    raised = np.flatnonzero(level >= early + 0.25 * (slow - early))
    if not len(raised):
        return None
    ok = 100 * (slow / early - 1) >= MIN_DRIFT_PCT and slow - early >= MIN_DRIFT_MS
    return int(t[raised[0]]) if ok else None


def threshold_period(t, y):
    level = local_level(t, y, K // 2)
    hot = (y >= MIN_X * level) & (y - level >= MIN_EXCESS_MS)
    at = t[hot].astype(np.int64)
    if len(at) < 3:
        return None
    best = None
    for n in sorted({int(b - a) for j in range(1, 4) for a, b in zip(at, at[j:]) if b - a >= 2}):
        residues, counts = np.unique(at % n, return_counts=True)
        r = int(residues[np.argmax(counts)])
        hits = at[at % n == r]
        expected = int(np.count_nonzero((t >= hits[0]) & (t % n == r)))
        if len(hits) < 3 or expected == 0 or len(hits) / expected < 0.6:
            continue
        key = (len(hits), len(hits) / expected, -n)
        if best is None or key > best[0]:
            best = (key, n)
    if best is None:
        return None
    n = best[1]
    hits = at[at % n == np.unique(at % n)[0]]
    # the run-level rule's 1 % of the run's time
    base = float(np.median(level))
    excess = float(np.median(y[hot] - level[hot]))
    return n if 100 * excess / (n * base + excess) >= 1.0 else None


class ThresholdWatch:
    """--when-slower as it was: a drift when the median of the last K is PCT % above the early median (the
    next K steps set a new level), a stall when three slow steps fall at one distance."""

    def __init__(self, pct, k=K):
        self.pct, self.k = pct, k
        self.early, self.recent, self.recent_steps = [], deque(maxlen=k), deque(maxlen=k)
        self.threshold, self.stalls, self.periods_seen = None, deque(maxlen=16), set()
        self._since, self._rearm, self._new = 0, False, False

    def observe(self, number, ms):
        if len(self.early) < self.k:
            self.early.append(ms)
            if len(self.early) == self.k:
                self.threshold = statistics.median(self.early) * (1 + self.pct / 100)
        if len(self.recent) >= max(5, self.k // 2):
            median = sorted(self.recent)[len(self.recent) // 2]
            if ms >= median * max(1 + self.pct / 100, 2.0) and ms - median >= 1.0:
                if self.stalls and self.stalls[-1] == number - 1:
                    self.stalls.pop()
                else:
                    self.stalls.append(number)
                    self._new = True
        self.recent.append(ms)
        self.recent_steps.append(number)
        self._since += 1

    def check(self):
        if self._new:
            self._new = False
            if len(self.stalls) >= 3:
                t, seen = self.stalls[-1], set(self.stalls)
                for period in sorted({(t - u) // j for u in self.stalls if u < t for j in (1, 2, 3) if (t - u) % j == 0}):
                    if period < 2 or any(period % p == 0 for p in self.periods_seen):
                        continue
                    if sum(1 for j in (1, 2, 3) if t - j * period in seen) >= 2:
                        self.periods_seen.add(period)
                        return ("stall", period)
        if self._since < 5 or self.threshold is None or len(self.recent) < self.k:
            return None
        self._since = 0
        median = statistics.median(self.recent)
        if self._rearm:
            self._rearm = False
            self.threshold = max(self.threshold, median * (1 + self.pct / 100))
            return None
        if median <= self.threshold:
            return None
        self._rearm = True
        self.recent.clear()
        self.recent_steps.clear()
        return ("slower", None)


# -- the best any method could do ----------------------------------------------------------------------------

def oracle_onsets(t, y, truth) -> tuple[int, int] | None:
    """Two yardsticks for a pure step or hinge (no warm-up, no stalls): the least-squares fit of the true
    shape (the maximum-likelihood onset under Gaussian noise for a method told the shape, which none is),
    and the onset alone fitted with the true level and jump or slope given as well (more than the data can
    tell any method). A method that matches the first is at the limit of the data; the second bounds it."""
    shape = truth.get("shape")
    if shape is None or truth["family"] not in ("step", "linear", "slow growth"):
        return None
    t, y = t.astype(float), y.astype(float)
    n = len(y)
    if shape == "step":  # a split before index k: two levels
        c, c2 = np.cumsum(y), np.cumsum(y * y)
        k = np.arange(2, n - 1)
        left, right = c[k - 1], c[-1] - c[k - 1]
        sse = c2[-1] - left ** 2 / k - right ** 2 / (n - k)
        fitted = int(t[k[int(np.argmin(sse))]])
        known = y - truth["level"]
        cost = [float(((known - np.where(t >= t[j], truth["jump"], 0.0)) ** 2).sum()) for j in range(1, n)]
        return fitted, int(t[1 + int(np.argmin(cost))])
    taus = np.arange(t[0] + 2, t[-1] - 2, 0.25)
    x = np.maximum(0.0, t[None, :] - taus[:, None])
    sx, sxx, sxy, sy, syy = x.sum(1), (x * x).sum(1), x @ y, y.sum(), (y * y).sum()
    b = (n * sxy - sx * sy) / np.maximum(n * sxx - sx * sx, 1e-12)
    a = (sy - b * sx) / n
    sse = syy - a * sy - b * sxy
    known = ((y[None, :] - truth["level"] - truth["slope"] * x) ** 2).sum(1)
    # the first step after the fitted hinge: where the new regime's excess is positive
    return int(np.floor(taus[int(np.argmin(sse))])) + 1, int(np.floor(taus[int(np.argmin(known))])) + 1


# -- the change-point method ---------------------------------------------------------------------------------

def changepoint_drift(t, y):
    c = find_change(t, y, k=K)
    if not c.is_drift or c.before_ms is None or c.after_ms is None:
        return None
    ok = 100 * (c.after_ms / c.before_ms - 1) >= MIN_DRIFT_PCT and c.after_ms - c.before_ms >= MIN_DRIFT_MS
    return (c.onset, c.onset_low, c.onset_high) if ok else None


def changepoint_period(t, y):
    hot, level = stall_steps(t, y, K, MIN_X, MIN_EXCESS_MS)
    p = periodic(t, hot)
    if p is None:
        return None
    base = float(np.median(level))
    excess = float(np.median(y[hot] - level[hot]))
    return p.period if 100 * excess / (p.period * base + excess) >= 1.0 else None


def watch_windows(watch, t, y) -> list[tuple]:
    """Feed a watch the series as the harness does (a check every step); (step, kind, period) per trigger."""
    out = []
    for step, ms in zip(t, y):
        watch.observe(int(step), float(ms))
        seen = watch.check()
        if seen is not None:
            kind = seen[0] if isinstance(seen, tuple) else seen.kind
            period = seen[1] if isinstance(seen, tuple) else getattr(seen, "period", None)
            out.append((int(step), kind, period))
    return out


METHODS = {
    "threshold": (threshold_drift, threshold_period, lambda: ThresholdWatch(WATCH_PCT)),
    "changepoint": (changepoint_drift, changepoint_period, lambda: SlowWatch(WATCH_PCT, K)),
}


def evaluate(method: str, seeds: int) -> list[dict]:
    drift_of, period_of, new_watch = METHODS[method]
    rows = []
    for family in FAMILIES:
        stats = {"family": family, "series": 0, "drift": 0, "onset_err": [], "onset_pct": [], "period_found": 0,
                 "period_exact": 0, "period_due": 0, "period_said_wrongly": 0, "right": 0, "wrong": 0,
                 "windows": 0, "recall_due": 0, "recall_hit": 0, "ci_width_pct": [], "ci_holds": 0, "drift_s": [],
                 "oracle_pct": [], "known_pct": []}
        for seed in range(seeds):
            s = series(family, seed)
            t, y, tr = s["t"], s["y"], s["truth"]
            stats["series"] += 1
            t0 = time.perf_counter()
            onset = drift_of(t, y)
            stats["drift_s"].append(time.perf_counter() - t0)
            onset, low, high = onset if isinstance(onset, tuple) else (onset, None, None)
            if onset is not None:
                stats["drift"] += 1
                if tr["onset"] is not None:
                    stats["onset_err"].append(abs(onset - tr["onset"]))
                    stats["onset_pct"].append(100 * abs(onset - tr["onset"]) / tr["n"])
                    if low is not None:  # the onset's range: its width, and whether it holds the truth
                        stats["ci_width_pct"].append(100 * (high - low) / tr["n"])
                        stats["ci_holds"] += low <= tr["onset"] <= high
            best = oracle_onsets(t, y, tr)
            if best is not None:
                stats["oracle_pct"].append(100 * abs(best[0] - tr["onset"]) / tr["n"])
                stats["known_pct"].append(100 * abs(best[1] - tr["onset"]) / tr["n"])
            period = period_of(t, y)
            if tr["stall"]:
                stats["period_due"] += 1
                stats["period_found"] += period is not None
                stats["period_exact"] += period == tr["period"]
            elif period is not None:
                stats["period_said_wrongly"] += 1
            wins = watch_windows(new_watch(), t, y)
            stats["windows"] += len(wins)
            # a trigger is right when it records what is there: a drift after its onset (a climb that goes on
            # may be recorded again, higher), a stall at its period (or a multiple, placed on one), once
            drift_seen = stall_seen = False
            for step, kind, per in wins:
                if kind == "slower" and tr["drift"] and step >= tr["onset"]:
                    stats["right"] += 1
                    drift_seen = True
                elif kind == "stall" and tr["stall"] and not stall_seen and (per is None or per % tr["period"] == 0):
                    stats["right"] += 1
                    stall_seen = True
                else:
                    stats["wrong"] += 1
            big = tr["drift"] and float(np.median(y[-K:])) >= 1.6 * float(np.median(y[:K]))  # what --when-slower 50 must see
            due = big or tr["stall"]
            if due:
                stats["recall_due"] += 1
                stats["recall_hit"] += (drift_seen if big else True) and (stall_seen if tr["stall"] else True)
        rows.append(stats)
    return rows


def _pct(a, b):
    return f"{100 * a / b:.1f} %" if b else "–"


def table(method: str, rows: list[dict]) -> str:
    out = [f"### {method}", "",
           "| Family | Series | Drift found | Onset error, steps (median / p95) | Onset error, % of run (p95) | "
           "Onset within ±5 % | Period exact (≥ 3 recurrences) | Period named wrongly | Watch windows per series | "
           "Watch precision | Watch recall |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        e, p = r["onset_err"], r["onset_pct"]
        onset = f"{np.median(e):.0f} / {np.percentile(e, 95):.0f}" if e else "–"
        within = _pct(sum(1 for v in p if v <= 5.0), len(p)) if p else "–"
        exact = f"{r['period_exact']}/{r['period_due']}" if r["period_due"] else "–"
        trig = r["right"] + r["wrong"]
        out.append(f"| {r['family']} | {r['series']} | {_pct(r['drift'], r['series'])} | {onset} | "
                   f"{np.percentile(p, 95):.1f} |" if p else f"| {r['family']} | {r['series']} | "
                   f"{_pct(r['drift'], r['series'])} | – | – |")
        out[-1] += (f" {within} | {exact} | {_pct(r['period_said_wrongly'], r['series'])} | "
                    f"{r['windows'] / r['series']:.2f} | {_pct(r['right'], trig)} | "
                    f"{_pct(r['recall_hit'], r['recall_due'])} |")
    return "\n".join(out)


def targets(rows: list[dict]) -> list[str]:
    by = {r["family"]: r for r in rows}
    lines = []
    for fam in ("step", "linear", "exponential", "slow growth", "warm-up then climb", "n log n", "quadratic",
                "kinked climb", "climb with a dip", "heavy-tailed climb", "autocorrelated climb"):
        p = by[fam]["onset_pct"]
        found = len(p) / by[fam]["series"]
        within = sum(1 for v in p if v <= 5.0) / max(len(p), 1)
        line = (f"{fam}: drift found in {100 * found:.1f} %, onset within ±5 % of the run in {100 * within:.1f} % "
                "of those found")
        w = by[fam]["ci_width_pct"]
        if w and len(w) == len(p):
            # resolvable: the onset's range is at most 10 % of the run wide (±5 %); a wider one says the
            # data cannot date it that closely, whatever the method
            ok = [e for e, width in zip(p, w) if width <= 10.0]
            line += (f"; its interval holds the truth in {100 * by[fam]['ci_holds'] / len(w):.1f} %, is at most 10 % "
                     f"of the run wide in {len(ok)}/{len(w)} (median width {np.median(w):.1f} %, p95 "
                     f"{np.percentile(w, 95):.1f} %), and of those the onset is within ±5 % in "
                     f"{100 * sum(1 for e in ok if e <= 5.0) / max(len(ok), 1):.1f} %")
        best, known = by[fam]["oracle_pct"], by[fam]["known_pct"]
        if best:
            line += (f"; the yardsticks: the least-squares fit of the true shape is within ±5 % in "
                     f"{100 * sum(1 for e in best if e <= 5.0) / len(best):.1f} %, and the onset alone, with the true "
                     f"level and {'jump' if fam == 'step' else 'slope'} given, in "
                     f"{100 * sum(1 for e in known if e <= 5.0) / len(known):.1f} %")
        lines.append(line)
    for fam, name in (("noise", "pure noise"), ("autocorrelated noise", "autocorrelated noise")):
        noise = by[fam]
        lines.append(f"{name}: no drift in {100 - 100 * noise['drift'] / noise['series']:.1f} %, no periodic stall in "
                     f"{100 - 100 * noise['period_said_wrongly'] / noise['series']:.1f} % (target ≥ 99 %)")
    cost = [1e3 * v for r in rows if r["family"] in DRIFTS for v in r["drift_s"]]
    lines.append(f"drift analysis per series (150–600 steps, drift families): median {np.median(cost):.1f} ms, p95 "
                 f"{np.percentile(cost, 95):.1f} ms")
    ps = by["periodic stall"]
    lines.append(f"periodic stall: exact period in {ps['period_exact']}/{ps['period_due']} that recur ≥ 3 times; "
                 f"a period named in {ps['period_said_wrongly']} of {ps['series'] - ps['period_due']} that recur twice")
    return lines


# -- real CPU loops, profiled ---------------------------------------------------------------------------------

# A training loop whose host work starts growing at step AT, by one growth law: the work is real (a list
# scanned, sorted, compared pairwise; a fixed sort that starts at AT), timed by the step record
# `gpuadvise profile` writes. Its step N runs from the N-th optimizer step to the next, so the work after
# `opt.step()` in the loop's step N is the record's step N: the step law's onsets, found exactly, check it.
LOOP = """
import itertools, random, sys, time
import torch

torch.set_num_threads(1)
law, steps, at, size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
chunk = [rng.random() for _ in range(size)]  # the step law's table; what the linear laws' history grows by
history = []
dip = at + int((steps - at) * rng.uniform(0.4, 0.7))  # the dip law's step where most of the history is dropped
keep = rng.uniform(0.0, 0.5)  # and the share of it kept
for i in range(steps):
    step = i + 1
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.006 + rng.uniform(0, 0.004))  # host jitter: data loading, logging
    if step < at or law == "steady":
        continue
    if law == "step":  # a fixed extra pass over a table every step from AT (a cache that stops fitting)
        sum(v * v for v in chunk)
    elif law == "n log n":  # a growing history, sorted every step
        history.extend(rng.random() for _ in range(size))
        sorted(history)
    elif law == "quadratic":  # every pair of a growing history compared every step
        history.extend(chunk)
        sum(a < b for a, b in itertools.combinations(history, 2))
    else:  # linear: a growing history scanned in full every step
        history.extend(chunk)
        if law == "dip" and step == dip:  # a cache flushed once: the climb falls back, then climbs again
            del history[int(keep * len(history)):]
        sum(v * v for v in history)
"""
# per law: the items the work grows by each step (a list scanned: thousands; sorted: a couple of thousand;
# compared pairwise: a dozen), or the fixed table's size for the step law: chosen (on this kind of machine,
# ~20 ns an item scanned) so that the extra work reaches the steps' noise (~2 ms on a 10 ms step) within a few
# percent of the run, whatever it does later (a list that outgrows a cache makes each item slower)
LOOP_SIZES = {"linear": (8_000, 20_000), "n log n": (1_500, 3_000), "quadratic": (10, 16),
              "step": (300_000, 800_000), "dip": (8_000, 20_000), "steady": (1, 2)}
LOOP_LAWS = tuple(LOOP_SIZES)


def loop_plan(law: str, run: int) -> dict:
    """One run of a law: its length (150 or 200 steps), onset (a quarter to 60 % of the way in) and size,
    from a seed."""
    rng = np.random.default_rng([zlib.crc32(law.encode()), run])
    steps = int(rng.choice([150, 200]))
    lo, hi = LOOP_SIZES[law]
    return {"law": law, "run": run, "steps": steps, "at": int(rng.integers(int(0.25 * steps), int(0.6 * steps))),
            "size": int(rng.integers(lo, hi + 1)), "seed": int(rng.integers(1 << 30))}


def profile_loop(plan: dict, folder: Path, script: Path) -> None:
    """`gpuadvise profile --when-slower 50` of the loop, as in the report's own test, into `folder`."""
    import os
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", str(folder), "--wait", "3",
                    "--warmup", "1", "--active", "3", "--when-slower", "50", "--slower-steps", "20", str(script),
                    plan["law"], str(plan["steps"]), str(plan["at"]), str(plan["size"]), str(plan["seed"])],
                   check=True, env=env, cwd=folder.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def loop_levels(folder: Path):
    """What the run-level report says about the run's step record (its `long_runs[].levels`)."""
    from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis
    from gpuadvise.analyzer.read.steprecord import load_step_record

    return RunAnalysis(record=load_step_record(folder / "steps.jsonl"), k=K).levels


def packed_records(path: Path):
    """The runs a `--pack` file holds: (plan, the step record's text), one a line."""
    import gzip
    import json

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            run = json.loads(line)
            yield {k: v for k, v in run.items() if k != "steps_jsonl"}, run["steps_jsonl"]


def pack(rows: list[dict], out: Path) -> None:
    """The runs' plans and step records, one JSON line each, gzipped: what `--again FILE` reads (a few KB a run;
    the traces are left out, the onsets come from the step record)."""
    import gzip
    import json
    import os

    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        for r in rows:
            plan = {k: r[k] for k in ("law", "run", "steps", "at", "size", "seed", "load", "seconds", "machine") if k in r}
            fh.write(json.dumps({**plan, "steps_jsonl": r["record"]}) + "\n")
    os.replace(tmp, out)


def loops(runs: int, keep: Path | None = None, again: Path | None = None) -> list[dict]:
    """Each law's loop `runs` times under `gpuadvise profile --when-slower 50` (or the run folders kept
    by an earlier `--keep`, or the runs a `--pack` file holds, read again), then the run-level levels of its
    step record against the truth."""
    import json
    import os
    import shutil
    import tempfile

    rows = []
    if again is not None and again.is_file():  # a --pack file: every run it holds, whatever --runs says
        tmp = Path(tempfile.mkdtemp(prefix="loops-"))
        try:
            for plan, text in packed_records(again):
                (tmp / "steps.jsonl").write_text(text)
                rows.append(_judged(plan, loop_levels(tmp), text))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return rows
    tmp = Path(tempfile.mkdtemp(prefix="loops-"))
    try:
        base = again or keep or tmp
        base.mkdir(parents=True, exist_ok=True)
        script = tmp / "loop.py"
        script.write_text(LOOP)
        for law in LOOP_LAWS:
            for run in range(runs):
                plan = loop_plan(law, run)
                folder = base / f"{law.replace(' ', '-')}-{run:03d}"
                if again is None:
                    if folder.exists():
                        shutil.rmtree(folder)
                    t0, plan["load"] = time.perf_counter(), os.getloadavg()[0]
                    profile_loop(plan, folder, script)
                    plan["seconds"] = time.perf_counter() - t0
                    (folder / "truth.json").write_text(json.dumps(plan))
                elif (folder / "truth.json").exists():
                    plan = json.loads((folder / "truth.json").read_text())  # as it was run
                else:
                    continue
                rows.append(_judged(plan, loop_levels(folder), (folder / "steps.jsonl").read_text()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _judged(plan: dict, lv, record: str) -> dict:
    """A run's plan with what the report said of it: a drift found, its onset, shape and range."""
    row = {**plan, "found": lv is not None and lv.began_at is not None, "onset": lv.began_at if lv else None,
           "shape": lv.shape if lv else None, "record": record,
           "between": (lv.began_between or (lv.began_at, lv.began_at)) if lv and lv.began_at else None}
    print(f"  {plan['law']} {plan['run']}: {plan['steps']} steps, onset {plan['at']} → {row['shape']} "
          f"{row['onset']} {row['between']}", file=sys.stderr, flush=True)
    return row


def loop_table(rows: list[dict]) -> str:
    """Per law: how often a drift was found, how often the onset's interval held the true onset, its median
    width and the point's error, and among the runs whose interval is at most 10 % of the run wide, how
    often the point is within ±5 % of the run."""
    out = ["| Growth law | Runs | Drift found | Interval holds the true onset | Median interval width, % of run | "
           "Point error, % of run (median / max) | Interval ≤ 10 % of the run | of those, point within ±5 % |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for law in LOOP_LAWS:
        rs = [r for r in rows if r["law"] == law]
        if not rs:
            continue
        n = len(rs)
        found = [r for r in rs if r["found"]]
        if law == "steady":
            out.append(f"| steady (no growth) | {n} | {_pct(len(found), n)} | – | – | – | – | – |")
            continue
        holds = sum(1 for r in found if r["between"][0] <= r["at"] <= r["between"][1])
        width = [100 * (r["between"][1] - r["between"][0]) / r["steps"] for r in found]
        err = [100 * abs(r["onset"] - r["at"]) / r["steps"] for r in found]
        tight = [e for e, w in zip(err, width) if w <= 10.0]
        out.append(f"| {law} | {n} | {_pct(len(found), n)} | {_pct(holds, n)} | "
                   f"{np.median(width):.1f} | {np.median(err):.1f} / {max(err):.1f} | {len(tight)}/{len(found)} | "
                   f"{_pct(sum(1 for e in tight if e <= 5.0), len(tight))} |" if found else
                   f"| {law} | {n} | 0 % | 0 % | – | – | – | – |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=120, help="series per family (default 120)")
    ap.add_argument("--method", choices=["both", *METHODS], default="both")
    ap.add_argument("--loops", action="store_true",
                    help="real CPU loops instead: each growth law's loop profiled --runs times (up to a minute a run "
                         "on a busy machine)")
    ap.add_argument("--runs", type=int, default=20, help="with --loops: runs per growth law (default 20)")
    ap.add_argument("--keep", type=Path, help="with --loops: keep the run folders (and their truth) here")
    ap.add_argument("--again", type=Path, help="with --loops: read the run folders an earlier --keep kept (or the runs "
                    "a --pack file holds), profile none")
    ap.add_argument("--pack", type=Path, help="with --loops: also write the runs' plans and step records to this file "
                    "(gzipped JSON lines), for --again to read")
    args = ap.parse_args(argv)
    if args.again is not None and not args.again.exists():
        ap.error(f"{args.again}: no such folder or --pack file")
    if args.loops:
        import os

        t0, load = time.perf_counter(), os.getloadavg()
        rows = loops(args.runs, args.keep, args.again)
        if args.pack:
            pack(rows, args.pack)
        print(loop_table(rows))
        print(f"\n({time.perf_counter() - t0:.1f} s; load average {load[0]:.1f} at the start, "
              f"{os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} CPUs)")
        return 0
    for method in (METHODS if args.method == "both" else [args.method]):
        t0 = time.perf_counter()
        rows = evaluate(method, args.seeds)
        print(table(method, rows))
        print()
        for line in targets(rows):
            print(f"- {line}")
        if method == "changepoint":
            print(f"- {long_series_cost()}")
        print(f"\n({time.perf_counter() - t0:.1f} s)\n")
    return 0


def long_series_cost(n: int = 10_000, seeds: int = 3) -> str:
    """What a run's longest series costs: a step record keeps 10 000 exact steps, then a point per bucket. A
    climb of each growth law starting 40 % of the way in, under 10 % noise."""
    cost = []
    for seed in range(seeds):
        rng = np.random.default_rng([n, seed])
        t = np.arange(1, n + 1, dtype=float)
        u = np.maximum(t - 0.4 * n, 0.0) / n
        for grown in (u, u * u, np.expm1(5 * u)):
            y = 10.0 + rng.normal(0, 1.0, n) + 10.0 * grown / grown[-1]
            t0 = time.perf_counter()
            find_change(t, y)
            cost.append(time.perf_counter() - t0)
    return (f"drift analysis of a {n:,}-step series (a linear, quadratic or exponential climb, {len(cost)} series): "
            f"median {np.median(cost):.2f} s, max {max(cost):.2f} s")


if __name__ == "__main__":
    raise SystemExit(main())

"""Change points on seeded step-time series whose truth is known (the fast version of
bench/bench_changepoints.py): a drift's onset and shape, a warm-up left out, a stall's period beyond
chance, and nothing named on noise or random pauses."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from gpuadvise.analyzer.measure.longrun.changepoints import find_change, periodic, stall_steps
from gpuadvise.harness.windows.slowwatch import SlowWatch

SEEDS = 60


def _noise(rng, n, base):
    cv = rng.choice([0.01, 0.05, 0.15])
    kind = rng.integers(3)
    if kind == 0:
        return rng.normal(0, cv * base, n)
    if kind == 1:
        return rng.uniform(-1.7 * cv * base, 1.7 * cv * base, n)
    return base * (rng.lognormal(0, cv, n) - np.exp(cv * cv / 2))


def _series(shape: str, seed: int):
    rng = np.random.default_rng([ord(shape[0]), len(shape), seed])
    n = int(rng.choice([150, 300]))
    base = float(rng.choice([2.0, 10.0, 50.0]))
    t = np.arange(3, n + 3)
    y = base + _noise(rng, n, base)
    onset = int(rng.integers(int(0.2 * n), int(0.8 * n)))
    if shape == "step":
        y += np.where(t >= onset, base * rng.uniform(0.25, 1.0), 0.0)
    elif shape == "climb":
        y += np.where(t >= onset, base * rng.uniform(0.4, 2.0) * (t - onset) / (t[-1] - onset), 0.0)
    return t, np.maximum(y, 0.05 * base), onset, n


@pytest.mark.parametrize("shape", ["step", "climb"])
def test_a_drift_is_dated_within_5_percent_of_the_run_and_told_by_its_shape(shape):
    errors, shapes = [], []
    for seed in range(SEEDS):
        t, y, onset, n = _series(shape, seed)
        c = find_change(t, y)
        assert c.is_drift, (seed, c)
        errors.append(abs(c.onset - onset) / n)
        shapes.append(c.shape)
    assert np.mean(np.array(errors) <= 0.05) >= 0.95, sorted(errors)[-5:]
    assert shapes.count(shape) >= 0.9 * SEEDS, shapes


def test_pure_noise_and_random_pauses_name_no_drift_and_no_period():
    for seed in range(2 * SEEDS):
        t, y, _, n = _series("noise", seed)
        if seed % 2:  # GC-like pauses: a few steps far slower, at random
            rng = np.random.default_rng(seed)
            y[rng.choice(n, int(rng.integers(3, 16)), replace=False)] *= rng.uniform(3, 10)
        c = find_change(t, y)
        assert not c.is_drift, (seed, c)
        hot, _ = stall_steps(t, y, 20, 2.0, 1.0)
        assert periodic(t, hot) is None, seed


def test_a_warm_up_is_left_out_and_a_later_climb_still_dated():
    t = np.arange(3, 203)
    rng = np.random.default_rng(7)
    y = 10 + rng.normal(0, 0.3, len(t))
    y[:8] += 20 * np.exp(-np.arange(8) / 3)  # slow first steps: caches, allocator, autotuning
    steady = find_change(t, y)
    assert steady.shape == "steady" and steady.warmup_until is not None and steady.warmup_until <= 12
    climb = find_change(t, y + np.where(t >= 120, 0.05 * (t - 120), 0.0))
    assert climb.shape == "climb" and abs(climb.onset - 120) <= 5 and climb.before_ms == pytest.approx(10, abs=0.2)


def test_a_rise_that_came_back_ends_where_it_fell():
    t = np.arange(3, 203)
    y = 10 + np.random.default_rng(3).normal(0, 0.3, len(t)) + np.where((t >= 60) & (t < 140), 4.0, 0.0)
    c = find_change(t, y)
    assert (c.shape, c.onset, c.until) == ("step", 60, 139)


@pytest.mark.parametrize("period", [7, 16, 40])
def test_a_period_is_found_exactly_from_three_recurrences_and_never_from_two(period):
    rng = np.random.default_rng(period)
    t = np.arange(3, 303)
    y = 10 + rng.normal(0, 0.5, len(t))
    for repeats in (2, 3, 5):
        first = 300 - (repeats - 1) * period - 3
        s = y.copy()
        s[np.searchsorted(t, first + period * np.arange(repeats))] += 40
        hot, _ = stall_steps(t, s, 20, 2.0, 1.0)
        found = periodic(t, hot)
        assert (found.period if found else None) == (period if repeats >= 3 else None), repeats


def test_the_watch_records_a_recurring_stall_once_and_a_noisy_steady_loop_not_at_all():
    rng = np.random.default_rng(1)
    noisy = SlowWatch(50, k=20)
    stalls = SlowWatch(50, k=20)
    fired = {"noisy": [], "stalls": []}
    for n in range(3, 400):
        ms = 3.0 + float(rng.uniform(2, 6))  # 2–6 ms of host jitter on a 3 ms step
        noisy.observe(n, ms)
        stalls.observe(n, ms + (40.0 if n % 25 == 0 else 0.0))
        for name, w in (("noisy", noisy), ("stalls", stalls)):
            seen = w.check()
            if seen is not None:
                fired[name].append(seen)
    assert fired["noisy"] == []
    assert [(s.kind, s.period) for s in fired["stalls"]] == [("stall", 25)]
    assert "beyond chance" in fired["stalls"][0].detail


@pytest.mark.parametrize("seed", range(5))
def test_a_few_slightly_slower_steps_before_a_step_are_not_where_it_began(seed):
    """A busy machine makes steps 16–32 5 % slower, then the loop really slows 4× at step 40 (as a
    profiled loop did under a loaded test run): the slowdown began at step 40, not at the bump."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, 91)
    level = np.where(steps < 16, 11.2, np.where(steps <= 32, 11.8, np.where(steps < 40, 11.4, 45.0)))
    ms = level * (1 + 0.01 * rng.standard_normal(len(steps)))
    change = find_change(steps, ms, k=10)
    assert change.shape == "step" and change.onset == 40 and change.until is None


def _exponential(seed: int):
    """An exponential climb; its truth is where its excess reached the noise's standard deviation."""
    rng = np.random.default_rng([5, seed])
    n = int(rng.choice([150, 300]))
    base, cv = float(rng.choice([2.0, 10.0, 50.0])), float(rng.choice([0.01, 0.05]))
    t = np.arange(3, n + 3)
    start = int(rng.integers(int(0.2 * n), int(0.7 * n)))
    efold = (t[-1] - start) * rng.uniform(0.15, 0.35)
    excess = np.where(t >= start, base * rng.uniform(0.5, 3.0) * np.expm1((t - start) / efold)
                      / np.expm1((t[-1] - start) / efold), 0.0)
    return t, base + rng.normal(0, cv * base, n) + excess, int(t[np.argmax(excess >= cv * base)]), n


def test_an_exponential_climb_is_dated_where_it_left_the_noise_within_5_percent_of_the_run():
    errors = []
    for seed in range(SEEDS):
        t, y, onset, n = _exponential(seed)
        c = find_change(t, y)
        assert c.is_drift, (seed, c)
        errors.append(abs(c.onset - onset) / n)
        assert c.onset_low <= c.onset <= c.onset_high, (seed, c)
    assert np.mean(np.array(errors) <= 0.05) >= 0.95, sorted(errors)[-5:]


def test_the_onsets_interval_is_narrow_on_a_clear_climb_and_wide_where_noise_hides_the_start():
    t = np.arange(3, 303)
    rng = np.random.default_rng(11)
    clear = 10 + rng.normal(0, 0.1, len(t)) + np.where(t >= 150, 0.05 * (t - 150), 0.0)
    c = find_change(t, clear)
    assert c.shape == "climb" and c.onset_low <= 150 <= c.onset_high and c.onset_high - c.onset_low <= 6
    # a 30 % rise over the whole run under 15 % noise: beyond chance, but its start cannot be told to ±5 %
    hidden = 10 + rng.normal(0, 1.5, len(t)) + np.where(t >= 60, 3.0 * (t - 60) / (t[-1] - 60), 0.0)
    h = find_change(t, hidden)
    assert h.is_drift and h.onset_low <= 60 <= h.onset_high and h.onset_high - h.onset_low >= 0.1 * len(t)


def _grown(law: str, noise: str, seed: int):
    """A loop whose step time starts growing at a known step by a law the fits do not hold (n log n with
    any n per step, quadratic but for a cubic's reach, a slope that doubles or more where a list outgrows a
    cache, a climb that falls back part of the way once), under heavy-tailed noise (Student's t, 3 degrees
    of freedom) or noise whose steps follow each other (AR(1), lag-1 correlation 0.3–0.6). The truth is the
    first step of the new regime."""
    rng = np.random.default_rng([zlib.crc32(f"{law} {noise}".encode()), seed])
    n = int(rng.choice([150, 300]))
    base, cv = float(rng.choice([2.0, 10.0, 50.0])), float(rng.choice([0.02, 0.05, 0.1]))
    t = np.arange(3, n + 3)
    onset = int(rng.integers(int(0.2 * n), int(0.7 * n)))
    u = np.where(t >= onset, t - onset + 1, 0).astype(float)
    if law == "n log n":
        m = rng.uniform(30, 1000)
        grown = u * np.log(np.maximum(m * u, 1.0))
    elif law == "quadratic":
        grown = u * u
    elif law == "kinked":
        grown = u + rng.uniform(1.0, 4.0) * np.maximum(t - onset - int(rng.uniform(0.3, 0.6) * u[-1]), 0)
    else:  # a dip
        dip = onset + int(rng.uniform(0.4, 0.7) * u[-1])
        grown = np.where(t >= dip, u - rng.uniform(0.5, 1.0) * (dip - onset + 1), u)
    if noise == "student":
        e = rng.standard_t(3, n) / np.sqrt(3.0)
    else:
        rho = rng.uniform(0.3, 0.6)
        e = np.empty(n)
        e[0], z = rng.normal(), rng.normal(0, np.sqrt(1 - rho * rho), n)
        for i in range(1, n):
            e[i] = rho * e[i - 1] + z[i]
    y = base * (1 + rng.uniform(0.5, 3.0) * grown / grown[-1] + cv * e)
    return t, np.maximum(y, 0.05 * base), onset, n


HARD = [("n log n", "student"), ("quadratic", "ar"), ("kinked", "student"), ("dip", "ar")]


@pytest.fixture(scope="module")
def hard_onsets():
    """(law, noise) → [(truth, run length, found Change)] over 30 seeded series each."""
    out = {}
    for law, noise in HARD:
        rows = []
        for seed in range(30):
            t, y, onset, n = _grown(law, noise, seed)
            rows.append((onset, n, find_change(t, y)))
        out[law, noise] = rows
    return out


@pytest.mark.parametrize("law, noise", HARD)
def test_the_onsets_interval_holds_the_truth_for_laws_and_noise_the_fits_do_not_assume(hard_onsets, law, noise):
    """95 % by design; 30 series here (the bench measures 120 a family), so at least 27."""
    rows = hard_onsets[law, noise]
    missed = [(onset, c.onset_low, c.onset_high) for onset, _, c in rows
              if not (c.is_drift and c.onset_low <= onset <= c.onset_high)]
    assert len(missed) <= 3, missed


def test_where_the_interval_is_narrow_the_onset_is_within_5_percent_of_the_run(hard_onsets):
    """Where the interval is at most a tenth of the run wide, the onset found is within ±5 % of the run of the
    truth: in 95 % of such series by design; here about 60 series, so at least 90 % (the bench measures it
    on 120 a family)."""
    narrow = [abs(c.onset - onset) / n for rows in hard_onsets.values()
              for onset, n, c in rows if c.is_drift and c.onset_high - c.onset_low <= 0.1 * n]
    assert len(narrow) >= 30 and np.mean(np.array(narrow) <= 0.05) >= 0.9, sorted(narrow)[-5:]


def test_noise_whose_steps_follow_each_other_names_a_drift_no_more_often_than_the_test_allows():
    """A busy machine slows a run of steps, not one (AR(1) noise, lag-1 correlation 0.3–0.6): beyond chance
    for steps taken one by one, not for such noise. The test's level is 1 %: at most 2 of 100."""
    named = []
    for seed in range(100):
        rng = np.random.default_rng([17, seed])
        rho, n = rng.uniform(0.3, 0.6), int(rng.choice([150, 300]))
        e = np.empty(n)
        e[0], z = rng.normal(), rng.normal(0, np.sqrt(1 - rho * rho), n)
        for i in range(1, n):
            e[i] = rho * e[i - 1] + z[i]
        c = find_change(np.arange(3, n + 3), 10.0 * (1 + 0.05 * e))
        named += [(seed, c.shape, c.onset)] if c.is_drift else []
    assert len(named) <= 2, named

#!/usr/bin/env python3
"""What the GPU telemetry sampler (gpuadvise/harness/steps/telemetry.py) costs the training thread, per step.

    python bench/nvml_cost.py              # the real pynvml where it works (an NVIDIA GPU), else the fake
    python bench/nvml_cost.py --fake       # the fake NVML (fixtures/nvml.py), on any machine
    python bench/nvml_cost.py --seconds 20 --interval 1.0 --step-us 5

A loop of small steps (pure Python work of about `--step-us` µs, the cheapest step a training loop has:
any cost shows most there) runs in rounds, alternately without and with the sampler thread running at
`--interval` (the session's 1 s). Each round reports the training thread's wall time per step; the cost
is the median over the paired rounds of (with − without). The sampler never runs code on the training
thread; what the training thread can lose is the time the sampler holds the GIL while it samples (pynvml
releases it inside the NVML calls), so the run also times one `sample()` call on its own and gives the
bound: sample time × samples per step (step time / interval). A last pair of rounds samples 100 times
a second (`stress_…`): a cost 100 times the session's, lifted above the machine's noise, then scaled
back to `--interval`. Target: < 1 µs per step (`meets_target`: the measured cost, the bound and the
scaled stress cost all below it).

Prints one JSON object; runs in about `--seconds` (default 20 s, under 30 s in all).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _load(rel: str, name: str):
    """A module of this checkout by its file (the sampler and the fake use only the standard library), so
    the bench runs where gpuadvise is not installed: a bare GPU machine with Python and pynvml."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / rel)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

TARGET_US = 1.0
STRESS_INTERVAL_S = 0.01


def nvml_module(force_fake: bool):
    """('real', pynvml) when NVML starts on this machine and the fake is not forced, else ('fake', module)."""
    if not force_fake:
        try:
            import pynvml

            pynvml.nvmlInit()
            pynvml.nvmlShutdown()
            return "real", pynvml
        except Exception:
            pass
    fake = _load("fixtures/nvml.py", "gpuadvise_bench_fake_nvml").FakeNVML()
    return "fake", fake.module


def work(n: int) -> int:
    """About a step's worth of Python: n additions."""
    total = 0
    for i in range(n):
        total += i
    return total


def calibrate(step_us: float) -> int:
    n = 100
    while True:
        t0 = time.perf_counter()
        for _ in range(200):
            work(n)
        per = (time.perf_counter() - t0) / 200 * 1e6
        if per >= step_us or n > 10**6:
            return max(1, int(n * step_us / per))
        n *= 2


def round_us(n: int, seconds: float) -> tuple[float, int]:
    """Run steps for `seconds`; (wall µs per step, steps)."""
    steps = 0
    end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while True:
        for _ in range(200):
            work(n)
        steps += 200
        now = time.perf_counter()
        if now >= end:
            return (now - t0) / steps * 1e6, steps


def paired_rounds(Telemetry, d: Path, n: int, seconds: float, interval: float, step: dict):
    """Rounds of steps alternately without and with the sampler: (µs per step without, with, samples taken)."""
    pairs = max(2, int(seconds / 2))
    per_round = seconds / (2 * pairs)
    without, with_, samples = [], [], 0
    for i in range(pairs):
        without.append(round_us(n, per_round)[0])
        t = Telemetry.start(d / f"telemetry-{interval}-{i}.jsonl", lambda: step["n"], interval_s=interval)
        if t is None:
            return None
        with_.append(round_us(n, per_round)[0])
        t.stop()
        samples += t.samples
    return without, with_, samples


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fake", action="store_true", help="use the fake NVML even where pynvml works")
    p.add_argument("--seconds", type=float, default=20.0, help="total time of the loop rounds (default 20)")
    p.add_argument("--interval", type=float, default=1.0, help="the sampler's interval in s (the session's: 1)")
    p.add_argument("--step-us", type=float, default=5.0, help="the work of one step in µs (default 5)")
    args = p.parse_args(argv)
    kind, nvml = nvml_module(args.fake)
    sys.modules["pynvml"] = nvml
    Telemetry = _load("gpuadvise/harness/steps/telemetry.py", "gpuadvise_bench_telemetry").Telemetry

    n = calibrate(args.step_us)
    step = {"n": 0}
    with tempfile.TemporaryDirectory() as d:
        round_us(n, 0.5)  # warm-up: caches, the CPU's clock
        main_rounds = paired_rounds(Telemetry, Path(d), n, 0.8 * args.seconds, args.interval, step)
        # the same at 100 samples a second: a cost 100 times the session's, measurable above the noise
        stress = paired_rounds(Telemetry, Path(d), n, 0.2 * args.seconds, STRESS_INTERVAL_S, step)
        if main_rounds is None or stress is None:
            print(json.dumps({"error": "the sampler did not start (NVML failed)", "nvml": kind}))
            return 1
        without, with_, samples = main_rounds
        # one sample on its own: the most GIL time the training thread can wait for, per sample
        probe = Telemetry.start(Path(d) / "probe.jsonl", lambda: 0, interval_s=3600)
        probe.stop()
        sample_us = []
        probe_t = Telemetry(nvml, probe.handle, Path(d) / "x.jsonl", lambda: 0, probe.device)
        nvml.nvmlInit()
        for _ in range(50):
            t0 = time.perf_counter()
            probe_t.sample()
            sample_us.append((time.perf_counter() - t0) * 1e6)
        one = probe_t.sample()
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
        device = probe.device
    step_us = statistics.median(without)
    diffs = [w - o for w, o in zip(with_, without)]
    stress_cost = statistics.median([w - o for w, o in zip(stress[1], stress[0])])
    cost = statistics.median(diffs)
    sample = statistics.median(sample_us)
    bound = sample * (step_us / 1e6) / args.interval
    out = {
        "nvml": kind, "device": device.get("name"), "interval_s": args.interval, "rounds": len(without),
        "samples_taken": samples,
        "step_us_without": round(step_us, 3), "step_us_with": round(statistics.median(with_), 3),
        "cost_us_per_step": round(cost, 4), "cost_us_per_step_rounds": [round(x, 4) for x in diffs],
        "stress_interval_s": STRESS_INTERVAL_S, "stress_samples_taken": stress[2],
        "stress_cost_us_per_step": round(stress_cost, 4),
        "stress_cost_scaled_to_interval_us_per_step": round(stress_cost * STRESS_INTERVAL_S / args.interval, 6),
        "sample_us": round(sample, 1), "bound_us_per_step": round(bound, 6),
        "one_sample": one, "device_header": device, "target_us_per_step": TARGET_US,
        "meets_target": bool(cost < TARGET_US and bound < TARGET_US
                             and stress_cost * STRESS_INTERVAL_S / args.interval < TARGET_US),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

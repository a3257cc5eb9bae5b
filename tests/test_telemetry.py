"""The GPU's own telemetry: NVML sampled in a daemon thread for the whole run (harness/steps/telemetry.py),
read beside the step record (analyzer/read/telemetry.py), and what it tells a drift (measure/longrun/throttling.py):
clocks that fell with thermal or power throttle reasons are named as throttling, with the machine's fix.
Every test runs against a fake NVML module (fixtures/nvml.py) put in place of `pynvml`."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.measure.longrun.throttling import clock_gap, throttling_evidence
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.read.telemetry import load_telemetry
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.fixtures.nvml import FakeNVML, write_telemetry
from gpuadvise.harness.steps.telemetry import Telemetry, reasons_in_words
from gpuadvise.rules import find_rule

READINGS = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons"}


def _with(monkeypatch, fake: FakeNVML):
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


def _wait_for(cond, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_the_sampler_runs_in_its_own_thread_and_stops_cleanly(monkeypatch, tmp_path):
    fake = _with(monkeypatch, FakeNVML(reasons=lambda n: 0x4 if n >= 2 else 0x1))
    step = {"n": 0}
    t = Telemetry.start(tmp_path / "telemetry.jsonl", lambda: step["n"], interval_s=0.01, env={})
    assert t is not None and t.running
    for n in range(1, 200):  # the training loop: it only counts its steps
        step["n"] = n
        if t.samples >= 4:
            break
        time.sleep(0.002)
    assert _wait_for(lambda: t.samples >= 4)
    t.stop()
    assert not t.running and t.error is None
    assert not any(th.name == "gpuadvise-telemetry" for th in threading.enumerate())
    main = threading.get_ident()
    readings = [ident for name, ident in fake.calls if name in READINGS]
    assert readings and main not in readings  # nothing sampled on the training thread
    assert [name for name, _ in fake.calls].count("nvmlShutdown") == 1

    lines = (tmp_path / "telemetry.jsonl").read_text().splitlines()
    header, samples = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
    assert header["format"] == "gpuadvise telemetry" and header["device"]["max_sm_clock_mhz"] == 1980
    assert header["device"]["name"] == "NVIDIA H100 80GB HBM3" and header["device"]["power_limit_w"] == 700.0
    assert len(samples) >= 4
    assert samples[0]["sm_clock_mhz"] == 1980 and samples[0]["power_w"] == 400.0 and samples[0]["temp_c"] == 60
    assert "reasons" not in samples[0]  # "gpu idle" is no slowdown
    assert samples[-1]["reasons"] == ["software power cap"]
    steps = [s["step"] for s in samples]
    assert steps == sorted(steps)


@pytest.mark.parametrize("how", ["no pynvml", "no driver", "no GPU"])
def test_without_pynvml_or_an_nvidia_gpu_nothing_is_sampled(monkeypatch, tmp_path, how):
    if how == "no pynvml":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    else:
        _with(monkeypatch, FakeNVML(fail_init=how == "no driver", gpus=0))
    assert Telemetry.start(tmp_path / "telemetry.jsonl", lambda: 0, interval_s=0.01, env={}) is None
    assert not (tmp_path / "telemetry.jsonl").exists()


def test_the_process_gpu_follows_torchrun_and_cuda_visible_devices(monkeypatch, tmp_path):
    _with(monkeypatch, FakeNVML(gpus=4))
    t = Telemetry.start(tmp_path / "t.jsonl", lambda: 0, interval_s=0.01,
                        env={"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"})
    t.stop()
    assert t.device["index"] == 3 and t.device["chosen_by"] == "CUDA_VISIBLE_DEVICES and LOCAL_RANK"


def test_throttle_reasons_read_as_words():
    assert reasons_in_words(0x1) == []
    assert reasons_in_words(0x20 | 0x40 | 0x4) == ["software power cap", "software thermal slowdown",
                                                    "hardware thermal slowdown"]


def test_a_cut_last_line_is_skipped_and_another_file_is_refused(tmp_path):
    path = write_telemetry(tmp_path / "telemetry.jsonl", range(10))
    with open(path, "a") as fh:
        fh.write('{"t": 9.5, "st')  # killed while writing
    t = load_telemetry(path)
    assert t.samples == 10 and t.damaged_lines == 1 and list(t.step) == list(range(10))
    (tmp_path / "other.jsonl").write_text('{"format": "something else"}\n')
    with pytest.raises(InputError, match="not a gpuadvise telemetry file"):
        load_telemetry(tmp_path / "other.jsonl")


def test_a_fall_needs_evidence_beyond_chance(tmp_path):
    rng = np.random.default_rng(7)
    jitter = {s: 1980 - int(rng.integers(0, 30)) for s in range(120)}
    steady = load_telemetry(write_telemetry(tmp_path / "a.jsonl", range(120), sm_clock=jitter.get))
    assert throttling_evidence(steady, (0, 59), (60, None)) is None
    few = load_telemetry(write_telemetry(tmp_path / "b.jsonl", range(120), every=50,
                                         sm_clock=lambda s: 1980 if s < 60 else 1200))
    assert throttling_evidence(few, (0, 59), (60, None)) is None  # 2 samples a side prove nothing
    fell = load_telemetry(write_telemetry(tmp_path / "c.jsonl", range(120), sm_clock=lambda s: 1980 if s < 60 else 1400,
                                          reasons=lambda s: 0x4 if s >= 60 else 0))
    found = throttling_evidence(fell, (0, 59), (60, None))
    assert found is not None and found.cause == "power" and round(found.fell_pct) == 29
    # a slow rank: its clock against the other ranks' over the same steps
    others = [load_telemetry(write_telemetry(tmp_path / f"r{r}.jsonl", range(40))) for r in range(3)]
    hot = load_telemetry(write_telemetry(tmp_path / "hot.jsonl", range(40), sm_clock=lambda s: 1500,
                                         reasons=lambda s: 0x40, temperature=lambda s: 88))
    gap = clock_gap(hot, others)
    assert gap is not None and gap.cause == "thermal" and gap.reasons == ["hardware thermal slowdown"]
    assert clock_gap(others[0], others[1:]) is None


@pytest.fixture(scope="module")
def drifts(tmp_path_factory):
    """A run whose step rises from step 60 on, analysed with the GPU's telemetry beside its step record:
    +35 % with the clocks falling under thermal throttling at step 60 (the clock explains it all), the
    same with steady clocks, and +199 % from a DataLoader that slowed while the GPU also throttled."""
    from gpuadvise.rules.step_time_drift import _drifting_run

    out = {}
    falling, hot = (lambda s: 1980 if s < 60 else 1410), (lambda s: 0x20 if s >= 60 else 0)
    for name, run, clock, reasons in (("throttled", _drifting_run(2.7), falling, hot),
                                      ("steady", _drifting_run(2.7), lambda s: 1980 - 15 * (s % 2), lambda s: 0),
                                      ("loader too", _drifting_run(6.0), falling, hot)):
        folder = run.write(tmp_path_factory.mktemp("run") / "run")
        write_telemetry(folder / "telemetry.jsonl", range(1, 121), every=2, sm_clock=clock, reasons=reasons,
                        temperature=lambda s: 62 if s < 60 else 87)
        found = [f for f in all_findings(analyze_paths([str(folder)], jobs=1)) if f.topic == "step-time-drift"]
        assert len(found) == 1, name
        out[name] = found[0]
    return out


def test_a_drift_with_falling_clocks_names_throttling_and_the_machines_fix(drifts):
    f = drifts["throttled"]
    assert "thermal throttling, not the code, slowed the steps" in f.message
    assert "1980 MHz to 1410 MHz" in f.message and "software thermal slowdown" in f.message and "87 °C" in f.message
    assert f.advice.startswith("The GPU slows itself down") and "cooling" in f.advice
    assert "nvidia-smi -q -d PERFORMANCE" in f.advice
    assert f.evidence.numbers["sm_clock_fell_pct"] == pytest.approx(28.8, abs=0.1)
    assert f.evidence.numbers["throttle_reasons"] == ["software thermal slowdown"]
    assert f.evidence.numbers["clock_share_of_drift_pct"] == 100.0


def test_a_drift_with_steady_clocks_is_not_blamed_on_the_gpu(drifts):
    f = drifts["steady"]
    assert "throttl" not in f.message and "nvidia-smi" not in f.advice
    assert "sm_clock_fell_pct" not in f.evidence.numbers


def test_throttling_that_explains_part_of_a_drift_stands_beside_its_cause(drifts):
    f = drifts["loader too"]
    assert "dataloader-stall grew" in f.message and "not the code" not in f.message
    assert "makes GPU-bound work up to 40 % slower, at most 20 % of this drift" in f.message
    assert f.advice.startswith("Fix what grew: GA102") and "The GPU also throttled" in f.advice


def test_a_straggler_on_a_throttled_gpu_is_named_with_its_clocks(tmp_path):
    """A job of 3 ranks whose rank 1 is slower, every rank's telemetry beside its trace: rank 1's GPU hot
    and throttled. (Even clocks add nothing: test_a_fall_needs_evidence_beyond_chance.)"""
    from gpuadvise.fixtures.builder import job_folder

    folder = job_folder(ranks=3, straggler=1, slowdown=1.4).write(tmp_path / "job")
    for r in range(3):
        hot = r == 1
        write_telemetry(folder / f"telemetry.rank{r}.jsonl", range(12), sm_clock=lambda s, hot=hot: 1410 if hot else 1980,
                        reasons=lambda s, hot=hot: 0x40 if hot else 0, temperature=lambda s, hot=hot: 89 if hot else 64)
    (f,) = [f for f in analyze_paths([str(folder)], jobs=1).job.findings if f.topic == "straggler"]
    assert f.rank == 1
    assert "Rank 1's GPU ran at a median SM clock of 1410 MHz against 1980 MHz on the other ranks" in f.message
    assert "hardware thermal slowdown" in f.message and "89 °C (the others 64 °C)" in f.message
    assert f.advice.startswith("Rank 1's GPU: The GPU slows itself down") and "nvidia-smi -q -d PERFORMANCE" in f.advice
    assert f.evidence.numbers["throttle_reasons"] == ["hardware thermal slowdown"]

"""gpuadvise against fixes measured on a real H100 (`../shared/traces/h100`, its README and pairs.json).

Each pair is a training loop with one planted pitfall (`before`) and its fix (`after`), timed without the
profiler (`pairs.json`: mean step, measured saving) and captured with `gpuadvise profile`. What a user
would check, pair by pair:

- the pitfall's topic is found on the `before` run, with a predicted saving within ±25 % of the measured
  one (or ±5 points, whichever is larger);
- on the `after` run the topic is gone, or predicts under a third as much;
- a change that measured no real effect (`expected_topic` null) gets no finding predicting ≥ 10 % for
  what it changed;
- memory fragmentation is never medium or high while the run uses under a quarter of the GPU's memory;
- where the traced loop is GPU-bound (the profiler costs it nothing: README), the median step on the
  GPU timeline is the measured step.

Each run folder is analysed once, in-process, the way `gpuadvise analyze RUN` does. The checks run twice:
on the folders as they are (run.json without step times: the replay is not calibrated) and with the
unprofiled step time pairs.json measured written into run.json's `steps` (as `gpuadvise profile` records
it now: the replay is calibrated to it); the other files are linked, not copied. Without the shared folder the
module is skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from _cli_support import REPO

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
H100 = TRACES / "h100"
if not (H100 / "pairs.json").is_file():
    pytest.skip(f"H100 pairs not found at {H100}", allow_module_level=True)

PAIRS: dict = json.loads((H100 / "pairs.json").read_text())["pairs"]
REL_TOL, ABS_TOL = 0.25, 5.0  # ±25 % of the measured saving, or ±5 points
AFTER_FRACTION = 1 / 3  # the fixed run may keep the topic only under a third of the prediction
UNAFFECTED_PCT = 10.0
# What each change that measured no effect touched: no finding on these topics may promise ≥ 10 %.
# `None`: nothing changed at all (the healthy loop twice), so no finding may promise it.
CHANGED = {"zerograd": {"zero-grad"}, "cudnn": {"no-tensor-cores", "cudnn-benchmark"}, "healthy": None}
GPU_BOUND_BUSY_PCT = 90.0
STEP_TOL = 0.10

_CACHE: dict[tuple[str, bool], dict] = {}
MODES = ["trace-only", "step-times"]


def measured_step_ms(run: str) -> float:
    return next(p[f"{side}_step_ms"] for p in PAIRS.values() for side in ("before", "after") if p[side] == run)


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def report(mode, tmp_path_factory):
    """The JSON report of one run folder (None for a folder without a trace: launch-after); in the
    step-times mode, of a folder that links the trace and adds the measured step time to run.json."""
    timed = mode == "step-times"

    def get(run: str) -> dict | None:
        folder = H100 / run
        if not (folder / "trace.json.gz").is_file():
            return None
        if (run, timed) not in _CACHE:
            from gpuadvise.analyzer.report.json import document
            from gpuadvise.analyzer.run import analyze

            if timed:
                facts = json.loads((folder / "run.json").read_text())
                facts["steps"] = {**(facts.get("steps") or {}), "unprofiled_median_ms": measured_step_ms(run), "clock": "cuda_event"}
                folder = tmp_path_factory.mktemp(run)
                for f in (H100 / run).iterdir():  # the trace, the memory snapshot: linked as they are
                    if f.name != "run.json":
                        (folder / f.name).symlink_to(f)
                (folder / "run.json").write_text(json.dumps(facts))
            _CACHE[(run, timed)] = json.loads(json.dumps(document(analyze([str(folder)]))))
        return _CACHE[(run, timed)]

    return get


def on_topic(doc: dict, topic: str) -> list[dict]:
    return [f for f in doc["findings"] if f["topic"] == topic]


def saving(f: dict) -> float:
    return f["impact"]["est_step_saving_pct"]


def tolerance(measured: float) -> float:
    return max(REL_TOL * abs(measured), ABS_TOL)


AFFECTED = sorted(k for k, p in PAIRS.items() if p["expected_topic"])
UNAFFECTED = sorted(k for k, p in PAIRS.items() if not p["expected_topic"])
RUNS = sorted({p[side] for p in PAIRS.values() for side in ("before", "after")})


def test_the_pairs_are_there():
    assert AFFECTED and UNAFFECTED
    assert set(UNAFFECTED) <= set(CHANGED), f"say what these changes touched: {sorted(set(UNAFFECTED) - set(CHANGED))}"


@pytest.mark.parametrize("pair", AFFECTED)
def test_pitfall_found_with_the_measured_saving(pair, report):
    p = PAIRS[pair]
    doc = report(p["before"])
    assert doc is not None, f"{p['before']} has no trace"
    found = on_topic(doc, p["expected_topic"])
    topics = sorted({f["topic"] for f in doc["findings"]})
    assert found, f"{pair}: {p['expected_topic']} not reported on {p['before']} (reported: {topics})"
    predicted, measured = saving(found[0]), p["measured_saving_pct"]
    assert abs(predicted - measured) <= tolerance(measured), (
        f"{pair}: predicted {predicted:.1f} % saved, the fix ({p['the_fix']}) measured {measured:.1f} %; "
        f"basis: {found[0]['impact']['basis']}")
    r = found[0]["impact"]["range_pct"]
    if r is not None:  # a stated range holds its own headline
        assert r[0] <= predicted <= r[1], r


@pytest.mark.parametrize("pair", AFFECTED)
def test_topic_gone_after_the_fix(pair, report):
    p = PAIRS[pair]
    before, after = report(p["before"]), report(p["after"])
    if after is None:
        pytest.skip(f"{p['after']} has no trace (README: a CUDA-graph replay never steps the profiler)")
    left = on_topic(after, p["expected_topic"])
    if not left:
        return
    was = saving(on_topic(before, p["expected_topic"])[0])
    assert saving(left[0]) < AFTER_FRACTION * max(was, 1e-9) or (was == 0 and saving(left[0]) == 0), (
        f"{pair}: {p['expected_topic']} still predicts {saving(left[0]):.1f} % after the fix (before: {was:.1f} %)")


@pytest.mark.parametrize("pair", UNAFFECTED)
def test_no_promise_for_a_change_that_did_nothing(pair, report):
    p = PAIRS[pair]
    touched = CHANGED[pair]
    for side in ("before", "after"):
        doc = report(p[side])
        if doc is None:
            continue
        promised = [(f["topic"], saving(f)) for f in doc["findings"]
                    if saving(f) >= UNAFFECTED_PCT and not f["impact"]["upper_bound"]
                    and (touched is None or f["topic"] in touched)]
        assert not promised, (f"{pair} ({p['the_fix']}) measured {p['measured_saving_pct']:+.1f} %, "
                              f"yet {p[side]} promises {promised}")


@pytest.mark.parametrize("run", RUNS)
def test_fragmentation_graded_by_memory_pressure(run, report):
    doc = report(run)
    if doc is None:
        pytest.skip(f"{run} has no trace")
    mem = doc["traces"][0]["memory"] or {}
    peak = max(mem.get("peak_reserved_pct_of_capacity") or 0, mem.get("peak_allocated_pct_of_capacity") or 0)
    for f in on_topic(doc, "memory-fragmentation"):
        if mem.get("capacity_bytes") and peak < 25 and not mem.get("ooms"):
            assert f["severity"] not in ("medium", "high"), f"{run}: {f['severity']} at {peak:.1f} % of the device"


@pytest.mark.parametrize("run", RUNS)
def test_gpu_bound_step_is_the_measured_step(run, report):
    doc = report(run)
    if doc is None:
        pytest.skip(f"{run} has no trace")
    s = doc["traces"][0]
    measured = measured_step_ms(run)
    if (s["gpu_busy_in_steps_pct"] or 0) < GPU_BOUND_BUSY_PCT:
        pytest.skip(f"{run} is not GPU-bound under the profiler: its step carries profiler overhead")
    if s["step_breakdown_ms"].get("dataloader", 0) > 0:
        pytest.skip(f"{run} reads from a DataLoader: the three traced steps may sit on prefetched batches")
    assert s["median_step_ms"] == pytest.approx(measured, rel=STEP_TOL), (
        f"{run}: {s['median_step_ms']} ms on the GPU timeline (CPU spans {s['median_step_cpu_ms']} ms), "
        f"measured {measured} ms")
    assert s["median_step_ms"] >= s["median_step_cpu_ms"]

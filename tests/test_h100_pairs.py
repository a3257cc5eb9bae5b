"""gpuadvise against fixes measured on a real H100 (`../shared/traces/h100`, its README and pairs.json).

Each pair is a training loop with one planted pitfall (`before`) and its fix (`after`), timed without the
profiler (`pairs.json`: mean step, measured saving) and captured with `gpuadvise profile`. What a user
would check, pair by pair:

- the pitfall's topic is found on the `before` run, with a predicted saving (for the fix that was applied,
  where a finding predicts several) within ±25 % of the measured one (or ±5 points, whichever is larger);
- on the `after` run the topic is gone, or predicts under a third as much;
- a change that measured no real effect (`expected_topic` null) gets no finding predicting ≥ 10 % for
  what it changed;
- memory fragmentation is never medium or high while the run uses under a quarter of the GPU's memory;
- where the traced loop is GPU-bound (the profiler costs it nothing: README), the median step on the
  GPU timeline is the measured step;
- docs/accuracy.md is what bench/accuracy.py renders from these same analyses;
- every run folder here (the pairs' and quickstart) gives the same topics from its files without run.json
  as with it, with savings within 5 points, but for the topics docs/rule-api.md lists as needing run.json.

Each run folder is analysed once, in-process, the way `gpuadvise analyze RUN` does (bench/accuracy.py's
`analyse_folder`). The checks run three times: on the files without run.json (a trace from another tool:
the typical profiler cost is assumed), on the folders as they are (run.json without step times: the
same) and with the unprofiled step time pairs.json measured written into run.json's `steps` (as
`gpuadvise profile` records it now: the replay is calibrated to it); the other files are linked, not
copied. Without the shared folder the module is skipped.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from _cli_support import REPO

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
H100 = TRACES / "h100"
if not (H100 / "pairs.json").is_file():
    pytest.skip(f"H100 pairs not found at {H100}", allow_module_level=True)
pytestmark = pytest.mark.slow  # the real H100 run folders, three ways

# bench/accuracy.py writes docs/accuracy.md from the same analyses: its modes, tolerance and pair tables
_spec = importlib.util.spec_from_file_location("accuracy", REPO / "bench" / "accuracy.py")
accuracy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(accuracy)

PAIRS: dict = accuracy.load_pairs(H100)
AFTER_FRACTION = 1 / 3  # the fixed run may keep the topic only under a third of the prediction
UNAFFECTED_PCT = accuracy.UNAFFECTED_PCT
CHANGED = accuracy.CHANGED
GPU_BOUND_BUSY_PCT = 90.0
STEP_TOL = 0.10
ACCURACY_DOC = REPO / "docs" / "accuracy.md"

_CACHE: dict[tuple[str, str], dict | None] = {}
MODES = list(accuracy.MODES)  # no run.json / run.json without step times / with the measured step time


def measured_step_ms(run: str) -> float:
    return accuracy.measured_step_ms(PAIRS, run)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("h100")


def analysed(run: str, mode: str, scratch: Path) -> dict | None:
    """The JSON report of one run in one mode (None for a folder without a trace: launch-after), once per
    session: its files without run.json, the folder as recorded, or with the measured step time added."""
    if (run, mode) not in _CACHE:
        _CACHE[(run, mode)] = accuracy.analyse_folder(H100, PAIRS, run, mode, scratch)
    return _CACHE[(run, mode)]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture
def report(mode, scratch):
    return lambda run: analysed(run, mode, scratch)


def on_topic(doc: dict, topic: str) -> list[dict]:
    return [f for f in doc["findings"] if f["topic"] == topic]


def saving(f: dict) -> float:
    return f["impact"]["est_step_saving_pct"]


tolerance = accuracy.tolerance


AFFECTED = sorted(k for k, p in PAIRS.items() if p["expected_topic"])
UNAFFECTED = sorted(k for k, p in PAIRS.items() if not p["expected_topic"])
RUNS = sorted({p[side] for p in PAIRS.values() for side in ("before", "after")})


def test_the_pairs_are_there():
    assert AFFECTED and UNAFFECTED
    assert set(UNAFFECTED) <= set(CHANGED), f"say what these changes touched: {sorted(set(UNAFFECTED) - set(CHANGED))}"


@pytest.mark.parametrize("pair", AFFECTED)
def test_pitfall_found_with_the_measured_saving(pair, mode, report):
    """Every expected topic fires in every mode, run.json removed too; the prediction for the fix that was
    applied is within tolerance, or (without run.json) the miss is listed in docs/accuracy.md."""
    p = PAIRS[pair]
    doc = report(p["before"])
    assert doc is not None, f"{p['before']} has no trace"
    found = on_topic(doc, p["expected_topic"])
    topics = sorted({f["topic"] for f in doc["findings"]})
    assert found, f"{pair}: {p['expected_topic']} not reported on {p['before']} (reported: {topics})"
    predicted, measured = accuracy.predicted(doc, p["expected_topic"], accuracy.FIX.get(pair)), p["measured_saving_pct"]
    listed = mode == "no-run-json" and (pair, mode) in accuracy.listed_misses(ACCURACY_DOC.read_text())
    assert abs(predicted - measured) <= tolerance(measured) or listed, (
        f"{pair}: predicted {predicted:.1f} % saved, the fix ({p['the_fix']}) measured {measured:.1f} %; "
        f"basis: {found[0]['impact']['basis']}")
    r = found[0]["impact"]["range_pct"]
    if r is not None:  # a stated range holds its own headline
        assert r[0] <= saving(found[0]) <= r[1], r


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


# the loops whose models are convnets (exps.py): NCHW tensors, and one already in channels_last
NCHW_CONVNETS = ("loader", "pageable")
CHANNELS_LAST_CONVNETS = ("cudnn",)


@pytest.mark.parametrize("run", RUNS)
def test_layout_conversions_are_named_on_nchw_convnets_only(run, report):
    """cuDNN's NCHW↔NHWC conversions are named, with a replayed prediction, on the convnets that run NCHW;
    never on the channels_last convnet, the transformers or the MLPs."""
    doc = report(run)
    if doc is None:
        pytest.skip(f"{run} has no trace")
    found = on_topic(doc, "channels-last")
    pair = next(p for p, v in PAIRS.items() if run in (v["before"], v["after"]))
    if pair in NCHW_CONVNETS:
        assert len(found) == 1, f"{run}: the NCHW convnet's conversions are not named"
        f = found[0]
        assert "critical-path replay" in f["impact"]["basis"]
        assert {i["name"] for i in f["evidence"]["items"]} <= {"aten::cudnn_convolution", "aten::convolution_backward"}
    else:
        assert not found, f"{run}: {found[0]['message']}"


def test_precision_fixes_are_predicted_separately(report):
    """The tf32 loop: bf16 autocast and TF32 get their own predictions, bf16's the larger (it halves the
    bytes as well), each near what its own fix measured."""
    doc = report(PAIRS["tf32"]["before"])
    by_fix = on_topic(doc, "no-tensor-cores")[0]["evidence"]["numbers"]["saving_by_fix_pct"]
    assert by_fix["bf16"] > by_fix["tf32"]
    for pair in ("tf32", "tf32-tf32"):
        fix, measured = accuracy.FIX[pair], PAIRS[pair]["measured_saving_pct"]
        assert abs(by_fix[fix] - measured) <= tolerance(measured), (pair, by_fix, measured)


def test_accuracy_doc_is_current(scratch):
    """docs/accuracy.md is what bench/accuracy.py gives on the pairs now: a change to a rule shows its
    effect on the table in review (regenerate: python bench/accuracy.py -o docs/accuracy.md)."""
    fresh = accuracy.render(PAIRS, lambda run, mode: analysed(run, mode, scratch))
    assert ACCURACY_DOC.is_file(), "docs/accuracy.md is missing: python bench/accuracy.py -o docs/accuracy.md"
    # the section on the pairs shipped in bench/h100-pairs is tests/test_shipped_pairs.py's to check
    assert accuracy.split_shipped(ACCURACY_DOC.read_text())[0] == fresh, (
        f"docs/accuracy.md is stale (now: {accuracy.summary_line(fresh)}): python bench/accuracy.py -o docs/accuracy.md")


# every run folder here, the pairs' and the others (quickstart): with run.json and without it
FOLDERS = sorted(p.name for p in H100.iterdir() if (p / "trace.json.gz").is_file() and (p / "run.json").is_file())


@pytest.mark.parametrize("run", FOLDERS)
def test_the_trace_alone_agrees_with_the_run_folder(run, scratch):
    """The folder as recorded and its files without run.json (the trace, and a memory snapshot where one
    was captured: it is not run.json) give the same topics with savings within 5 points, but for the
    topics docs/rule-api.md lists as needing run.json facts."""
    from _trace_alone import disagreements

    recorded, alone = analysed(run, "trace-only", scratch), analysed(run, "no-run-json", scratch)
    found = disagreements(recorded["findings"], alone["findings"], run)
    assert not found, "\n".join(found)

"""gpuadvise against the H100 pairs that ship with the project (bench/h100-pairs, its README and pairs.json).

Three loops measured on an H100 without the profiler, each with one pitfall (`before`) and its fix
(`after`): ResNet-50 in NCHW against channels_last (fp32, and under bf16 autocast), and a compiled model
with a graph break against the same model without it. What a user would check:

- the pitfall's topic is found on the `before` run from every input (its trace alone, the run folder as
  recorded, with the measured unprofiled step), and where the prediction misses the measured saving
  (bench/accuracy.py's tolerance) docs/accuracy.md lists the miss rather than hiding it;
- the topic is gone after the fix;
- docs/accuracy.md's section on these pairs is what bench/accuracy.py renders from these analyses now.

Unlike tests/test_h100_pairs.py these folders are in the repository: nothing skips.
"""

from __future__ import annotations

import importlib.util

import pytest

from _cli_support import REPO

pytestmark = pytest.mark.slow  # real H100 run folders, analysed three ways

_spec = importlib.util.spec_from_file_location("accuracy", REPO / "bench" / "accuracy.py")
accuracy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(accuracy)

SHIPPED = accuracy.SHIPPED
PAIRS: dict = accuracy.load_pairs(SHIPPED)
_CACHE: dict[tuple[str, str], dict | None] = {}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("shipped")


def analysed(run: str, mode: str, scratch) -> dict | None:
    if (run, mode) not in _CACHE:
        _CACHE[(run, mode)] = accuracy.analyse_folder(SHIPPED, PAIRS, run, mode, scratch)
    return _CACHE[(run, mode)]


def test_every_pair_has_its_run_folders_and_a_measured_saving():
    assert PAIRS
    for name, p in PAIRS.items():
        for side in ("before", "after"):
            assert (SHIPPED / p[side] / "run.json").is_file(), f"{name}: {p[side]} has no run.json"
        measured = 100 * (1 - p["after_step_ms"] / p["before_step_ms"])
        assert measured == pytest.approx(p["measured_saving_pct"], abs=0.1), name


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("mode", list(accuracy.MODES))
def test_the_pitfall_is_found_from_every_input(pair, mode, scratch):
    p = PAIRS[pair]
    doc = analysed(p["before"], mode, scratch)
    topics = [f["topic"] for f in doc["findings"]]
    if p["expected_topic"] == "compile-graph-breaks" and mode == "no-run-json":
        # a break that makes dynamo skip the whole outer frame leaves no nested region in the trace: the
        # inner frame's compiled calls look like regional compilation, so the trace alone cannot tell
        assert "compile-graph-breaks" not in topics or pytest.fail("the trace now tells: record it in docs/accuracy.md")
        return
    assert p["expected_topic"] in topics, f"{pair} ({accuracy.MODES[mode]}): {topics}"


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_topic_is_gone_after_the_fix(pair, scratch):
    p = PAIRS[pair]
    doc = analysed(p["after"], "trace-only", scratch)
    assert p["expected_topic"] not in [f["topic"] for f in doc["findings"]]


def test_accuracy_doc_lists_these_pairs_as_they_are_predicted_now(scratch):
    fresh = "\n".join(accuracy.shipped_section(PAIRS, lambda run, mode: analysed(run, mode, scratch))).rstrip("\n")
    doc = (REPO / "docs" / "accuracy.md").read_text()
    assert accuracy.split_shipped(doc)[1].rstrip("\n") == fresh, (
        "docs/accuracy.md's shipped pairs are stale: python bench/accuracy.py -o docs/accuracy.md")


def test_a_step_near_the_gpus_pace_moves_the_prediction_little(scratch):
    """The fp32 ResNet-50's unprofiled step is 37.0 ms in its run.json and 37.19 ms in pairs.json, both
    near the GPU's own pace: the profiler's fitted cost is then only a lower bound, and half a percent of
    step time must not move the channels-last prediction by more than a few points (it moved 21.0 → 11.5 %
    when the fitted cost was taken as it came)."""
    def saving(mode):
        doc = analysed(PAIRS["channels-last"]["before"], mode, scratch)
        return next(f["impact"]["est_step_saving_pct"] for f in doc["findings"] if f["topic"] == "channels-last")

    assert abs(saving("trace-only") - saving("step-times")) <= 3.0

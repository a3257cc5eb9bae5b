"""The profiler's own cost: run.json's unprofiled step time calibrates the replay, and every
CPU-dependent prediction is made on the calibrated replay."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpuadvise.analyzer.measure.replay.calibration import NOISE, TYPICAL_PER_EVENT_US, unprofiled_step_ms
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.report import render
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.rules import find_rule


@pytest.fixture(scope="module")
def launch_bound(tmp_path_factory):
    """A loop of tiny kernels whose CPU side sets the pace (the launch-bound rule's own positive)."""
    path = tmp_path_factory.mktemp("cal") / "trace.json.gz"
    find_rule("launch-bound").positive().write(path)
    return load_trace(path)


def _figures(report) -> dict:
    """The trace's summary figures as the JSON document names them."""
    return dataclasses.asdict(report.figures)


def _facts(unprofiled_ms):
    return {"steps": {"clock": "cuda_event", "unprofiled_median_ms": unprofiled_ms}}


def _saving(report, topic):
    return next((f.impact.est_step_saving_pct for f in report.findings if f.topic == topic), 0.0)


def test_a_profiler_slowed_cpu_stops_looking_launch_bound(launch_bound):
    plain = analyze_model(launch_bound, facts={})
    traced_ms = _figures(plain)["median_step_ms"]
    assert _saving(plain, "launch-bound") > 10  # the fixture is launch-bound as traced

    # the same loop measured at 40 % of the traced step without the profiler: most of the CPU time
    # between launches was the profiler's, and removing the rest buys much less
    calibrated = analyze_model(launch_bound, facts=_facts(0.4 * traced_ms))
    s = _figures(calibrated)
    assert s["unprofiled_median_step_ms"] == pytest.approx(0.4 * traced_ms, rel=1e-3)
    assert s["profiler_overhead_x"] == pytest.approx(2.5, abs=0.01)
    assert calibrated.calibration.applied
    assert _saving(calibrated, "launch-bound") < _saving(plain, "launch-bound")
    basis = next(f.impact.basis for f in calibrated.findings if f.topic == "launch-bound")
    assert "calibrated to the unprofiled step" in basis


def test_the_calibrated_replay_matches_the_unprofiled_step(launch_bound):
    traced_ms = _figures(analyze_model(launch_bound, facts={}))["median_step_ms"]
    a = analyze_model(launch_bound, facts=_facts(0.6 * traced_ms))
    from gpuadvise.analyzer.measure.analysis import Analysis
    from gpuadvise.analyzer.measure.replay.calibration import scenario_on
    from gpuadvise.analyzer.measure.basics.metrics import compute
    from gpuadvise.analyzer.measure.replay.whatif import Scenario

    analysis = Analysis(launch_bound, compute(launch_bound), _facts(0.6 * traced_ms))
    replay, cal = analysis.replay, analysis.calibration
    ratio = replay.simulate(scenario_on(cal, Scenario(name="x"))) / replay.baseline_us
    assert ratio == pytest.approx(0.6 * traced_ms / _figures(a)["median_step_ms"], rel=0.02)


def test_within_noise_the_typical_profiler_cost_is_taken(launch_bound):
    # a traced step as long as the unprofiled one says nothing about what the profiler cost the CPU (a
    # GPU-bound loop hides it): the typical per-event cost is taken, as for a trace without run.json
    plain = analyze_model(launch_bound, facts={})
    traced_ms = _figures(plain)["median_step_ms"]
    same = analyze_model(launch_bound, facts=_facts(traced_ms / (NOISE - 0.01)))
    assert same.calibration.source == plain.calibration.source == "typical"
    assert _saving(same, "launch-bound") == _saving(plain, "launch-bound")
    assert "the GPU hid the profiler's cost" in next(f.impact.basis for f in same.findings if f.topic == "launch-bound")


def test_without_step_times_the_typical_profiler_cost_is_taken(launch_bound):
    r = analyze_model(launch_bound, facts={})
    cal = r.calibration
    assert _figures(r)["unprofiled_median_step_ms"] is None and _figures(r)["profiler_overhead_x"] is None
    assert cal.source == "typical" and cal.per_event_us == TYPICAL_PER_EVENT_US and cal.events_per_step > 0
    said = f"no unprofiled step time: predicted with the typical profiler cost for {cal.events_per_step:,.0f} recorded events per step"
    assert any(said in n for n in r.notes)
    assert said in next(f.impact.basis for f in r.findings if f.topic == "launch-bound")
    # the typical cost shortens the CPU side the launches wait on: less to gain than the raw trace shows
    from gpuadvise.analyzer.measure.analysis import Analysis
    from gpuadvise.analyzer.measure.replay.calibration import scenario_on
    from gpuadvise.analyzer.measure.basics.metrics import compute
    from gpuadvise.analyzer.measure.replay.whatif import Scenario

    analysis = Analysis(launch_bound, compute(launch_bound), {})
    assert analysis.replay.simulate(scenario_on(analysis.calibration, Scenario(name="x"))) < analysis.replay.baseline_us


def test_every_format_reports_the_overhead(launch_bound):
    traced_ms = _figures(analyze_model(launch_bound, facts={}))["median_step_ms"]
    r = analyze_model(launch_bound, facts=_facts(0.5 * traced_ms))
    doc = json.loads(render([r], "json"))
    assert doc["summary"]["profiler_overhead_x"] == pytest.approx(2.0, abs=0.01)
    assert "unprofiled" in render([r], "md") and "2.00×" in render([r], "md")
    assert "unprofiled" in render([r], "text")


@pytest.mark.parametrize("bad", [None, "12", -1, 0, float("nan"), True, {"x": 1}])
def test_a_hand_edited_run_json_is_ignored(bad):
    assert unprofiled_step_ms({"steps": {"unprofiled_median_ms": bad}})[0] is None
    assert unprofiled_step_ms({"steps": "oops"})[0] is None

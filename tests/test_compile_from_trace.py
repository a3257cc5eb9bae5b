"""torch.compile read from the trace alone (a trace recorded with plain torch.profiler, no run.json):
graph breaks, recompiles and compiling inside the window, with the numbers run.json's facts give; and
the compiler's own work (its syncs, copies and autotuning kernels) kept out of every other finding.

Fixtures build GPU traces (fixtures/compiled.py); end to end, one Python records four tiny compiled CPU
loops with plain torch.profiler and Inductor (tests/probes/compiled_profiler_loops.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.compiled import TRAIN, compiled_facts, compiled_loop, first_compiled_call
from gpuadvise.rules import find_rule

HERE = Path(__file__).resolve().parent
COMPILE = {"compile-graph-breaks", "compile-recompiles", "compile-in-window"}
LOOP_WORK = {"host-sync", "pageable-memcpy", "launch-bound", "low-gpu-utilization"}


def analyse(load_built, builder, facts: dict | None = None):
    return analyze_model(load_built(builder), facts)


def by_name(report) -> dict:
    return {find_rule(f.rule).name: f for f in report.findings}


# -- graph breaks ----------------------------------------------------------------------------------------

def test_graph_break_from_the_trace_alone_names_the_frames(load_built):
    found = by_name(analyse(load_built, compiled_loop(breaks=1, island_us=3_000)))
    f = found["compile-graph-breaks"]
    assert "broke the graph at 1 place(s)" in f.message
    assert "compiled frame 1 (resumed inside frame 0)" in f.message
    assert "torch._dynamo.explain" in f.message  # how to get the reason the trace does not hold
    assert f.evidence.numbers["regions_per_step"] == 2
    assert f.impact.est_step_saving_pct > 0


def test_compiled_loop_without_breaks_gets_no_compile_finding(load_built):
    assert not COMPILE & set(by_name(analyse(load_built, compiled_loop(steps=4))))


def test_graph_break_numbers_are_the_same_from_run_json_and_from_the_trace(load_built):
    trace = compiled_loop(breaks=1, island_us=3_000)
    facts = compiled_facts(breaks=[{"where": f"{TRAIN}:25", "reason": "torch._dynamo.graph_break()", "count": 3,
                                    "steps": [8, 9, 10]}])
    alone = by_name(analyse(load_built, trace))["compile-graph-breaks"]
    with_run = by_name(analyse(load_built, trace, facts))["compile-graph-breaks"]
    for key in ("graph_breaks", "island_pct", "island_ms_per_step", "regions_per_step"):
        assert alone.evidence.numbers[key] == with_run.evidence.numbers[key], key
    assert alone.impact.est_step_saving_pct == pytest.approx(with_run.impact.est_step_saving_pct)
    assert f"first at {TRAIN}:25" in with_run.message and "first at compiled frame 1" in alone.message


# -- recompiles ------------------------------------------------------------------------------------------

RECOMPILES = {3: 400_000.0, 4: 400_000.0, 5: 400_000.0}  # step index → compile µs: 0/1, 0/2, 0/3


def test_recompiles_after_warm_up_from_the_trace_alone(load_built):
    report = analyse(load_built, compiled_loop(steps=6, first_step=0, recompile_at=RECOMPILES))
    found = by_name(report)
    f = found["compile-recompiles"]
    assert f.evidence.numbers["recompiles_after_warmup"] == 3
    assert f.evidence.steps == [3, 4, 5]
    assert f.evidence.numbers["compile_seconds"] == pytest.approx(1.2, abs=0.01)
    assert "compiled frame 0" in f.message and "TORCH_LOGS=recompiles" in f.message
    window = found["compile-in-window"]  # the recompiles also landed in the recorded steps
    assert "3 of them recompile(s)" in window.message


def test_recompile_numbers_are_the_same_from_run_json_and_from_the_trace(load_built):
    trace = compiled_loop(steps=6, first_step=0, recompile_at=RECOMPILES)
    facts = compiled_facts([{"step": 0, "seconds": 2.0}] + [
        {"step": s, "seconds": 0.4, "recompile_reason": f"0/{i}: tensor 'x' size mismatch at index 0"}
        for i, s in enumerate((3, 4, 5))])
    alone = by_name(analyse(load_built, trace))["compile-recompiles"]
    with_run = by_name(analyse(load_built, trace, facts))["compile-recompiles"]
    for key in ("recompiles_after_warmup", "compile_seconds", "limit_hit"):
        assert alone.evidence.numbers[key] == pytest.approx(with_run.evidence.numbers[key], abs=0.01), key
    assert alone.evidence.steps == with_run.evidence.steps


def test_recompiles_without_compile_ids_take_the_frame_that_runs_next(load_built):
    """Without dynamo's compile-id annotations (older PyTorch), a compile belongs to the compiled frame
    that starts running right after it."""
    plain = compiled_loop(steps=6, first_step=0, recompile_at=RECOMPILES, frame_ids=False)
    f = by_name(analyse(load_built, plain))["compile-recompiles"]
    assert f.evidence.numbers["recompiles_after_warmup"] == 3
    assert f.evidence.numbers["compile_seconds"] == pytest.approx(1.2, abs=0.01)


def test_a_recompile_compiled_in_the_first_recorded_step_counts(load_built):
    """Compile 0/1 is frame 0's first recompile wherever the window starts: the compile id says so."""
    late_window = compiled_loop(steps=3, first_step=5, recompile_at={0: 400_000.0, 1: 400_000.0})
    f = by_name(analyse(load_built, late_window))["compile-recompiles"]
    assert f.evidence.steps == [5, 6]


def test_a_recompile_in_the_first_steps_is_warm_up(load_built):
    found = by_name(analyse(load_built, compiled_loop(steps=5, first_step=0, recompile_at={1: 400_000.0})))
    assert "compile-recompiles" not in found


# -- compiling inside the window, and the compiler's own work --------------------------------------------

def test_first_compile_in_the_window_from_the_trace_alone(load_built):
    found = by_name(analyse(load_built, compiled_loop(steps=4, first_step=0, compile_in={0: 1_700_000.0})))
    f = found["compile-in-window"]
    assert f.evidence.steps == [0]
    assert f.evidence.numbers["compile_seconds"] == pytest.approx(1.7, abs=0.05)
    assert "the window fell on the first compiled steps" in f.message
    assert "compile-recompiles" not in found and "warm-up-capture" not in found  # one cost, reported once


def test_compile_spans_without_compile_ids_still_count(load_built):
    plain = compiled_loop(steps=4, first_step=0, compile_in={0: 1_700_000.0}, frame_ids=False)
    f = by_name(analyse(load_built, plain))["compile-in-window"]
    assert f.evidence.numbers["compiles_in_window"] == 1
    assert f.evidence.numbers["compile_seconds"] == pytest.approx(1.7, abs=0.05)


FIRST_CALLS = {"one step": lambda: compiled_loop(steps=1, first_step=0, compile_in={0: 1_700_000.0}),
               "no steps": first_compiled_call}
# what the compiler's work is blamed as once it is taken for the loop's (the renamed spans below)
MISREAD = {"one step": {"pageable-memcpy", "low-gpu-utilization"},
           "no steps": {"pageable-memcpy", "low-gpu-utilization", "launch-bound"}}


@pytest.mark.parametrize("capture", FIRST_CALLS)
def test_the_autotuners_syncs_and_copies_are_the_compilers(load_built, capture):
    """A capture of the first, compiling call: the autotuner's 80 device syncs and 24 pageable copies
    are counted by compile-in-window and blamed on nothing else."""
    report = analyse(load_built, FIRST_CALLS[capture]())
    found = by_name(report)
    assert not LOOP_WORK & set(found)
    assert "80 blocking calls, 24 copy calls" in found["compile-in-window"].message
    assert "cudaDeviceSynchronize" not in set(report.metrics.syncs["name"][~report.metrics.syncs["profiler_sync"]])
    assert not (report.metrics.copies["src"] == "Pageable").any()


@pytest.mark.parametrize("capture", FIRST_CALLS)
def test_the_same_syncs_and_copies_outside_compile_spans_are_the_loops(load_built, capture):
    """The counterpart: the very same calls under an op of the user's are the loop's work."""
    data = FIRST_CALLS[capture]().to_dict()
    for e in data["traceEvents"]:
        if e.get("name", "").endswith(" (dynamo_timed)"):
            e["name"] = e["name"].replace(" (dynamo_timed)", "")
    found = by_name(analyze_model(load_built(data)))
    assert MISREAD[capture] <= set(found)
    assert "compile-in-window" not in found


# -- end to end: compiled CPU loops recorded with plain torch.profiler -------------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The four loops of tests/probes/compiled_profiler_loops.py, recorded in one Python, analysed here."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("compiled_loops")
    proc = subprocess.run([sys.executable, str(HERE / "probes" / "compiled_profiler_loops.py"), str(out)],
                          capture_output=True, text=True, timeout=600, env=_env())
    if proc.returncode != 0 and ("InvalidCxxCompiler" in proc.stderr or "C++ compiler" in proc.stderr):
        pytest.skip(f"Inductor finds no C++ compiler here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    return {case: analyze_model(load_trace(out / f"{case}.json")) for case in ("first", "clean", "breaks", "recompile")}


def _env() -> dict:
    import os

    return dict(os.environ, OMP_NUM_THREADS="1")


@pytest.mark.slow
def test_recorded_loops_are_read_as_compiled(recorded):
    for case, report in recorded.items():
        assert any("torch.compile:" in n for n in report.notes), case
        raw = json.dumps([f.message for f in report.findings])
        assert "dynamo_timed" not in raw, case  # the compiler's spans are never quoted as the user's ops


@pytest.mark.slow
def test_recorded_clean_loop_gets_no_compile_finding(recorded):
    assert not COMPILE & set(by_name(recorded["clean"]))


@pytest.mark.slow
def test_recorded_graph_break_is_found_from_the_trace(recorded):
    found = by_name(recorded["breaks"])
    assert COMPILE & set(found) == {"compile-graph-breaks"}
    assert found["compile-graph-breaks"].evidence.numbers["regions_per_step"] == 2


@pytest.mark.slow
def test_recorded_recompiles_are_found_from_the_trace(recorded):
    found = by_name(recorded["recompile"])
    f = found["compile-recompiles"]
    assert f.evidence.steps == [5, 6]  # the batch size changes at steps 5 and 6
    assert f.evidence.numbers["recompiles_after_warmup"] == 2
    assert "compile-graph-breaks" not in found


@pytest.mark.slow
def test_recorded_first_compile_is_found_in_the_window(recorded):
    found = by_name(recorded["first"])
    f = found["compile-in-window"]
    assert f.evidence.steps == [0]
    assert COMPILE & set(found) == {"compile-in-window"}
    assert not LOOP_WORK & set(found)

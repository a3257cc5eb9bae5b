"""Findings that never contradict their input, each other, or the next run: settings the input records,
the device that failed, one statistic per report, one-time costs kept out of the steady-state figures.
Each test builds the input that showed the problem and asserts what a user reading the report checks."""

from __future__ import annotations

import os
import re

import pytest

from gpuadvise.analyzer.model.findings import Evidence, Finding, Impact, order
from gpuadvise.analyzer.run.single import analyze_snapshot
from gpuadvise.fixtures.snapshot import GiB, DeviceSet, SnapshotBuilder, free, live

WEIGHTS = ("train.py", 30, "build_model")
ATTN = ("model.py", 88, "attention")
MLP = ("model.py", 120, "mlp")


def three_devices_oom_on_one() -> DeviceSet:
    """Three devices, expandable segments on; device 1 ran out of memory while 77.5 GiB was allocated and
    78.3 GiB reserved (almost nothing cached), then its activations were freed before the dump, leaving
    20 GiB of holes that were not there when it failed. Device 0 holds the most memory at the dump."""
    on = {"expandable_segments": True, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    d0 = SnapshotBuilder(device=0, settings=on)
    d0.segment(live(69 * GiB, site=WEIGHTS), free(1 * GiB))
    d1 = SnapshotBuilder(device=1, settings=on)
    d1.segment(live(40 * GiB, site=WEIGHTS))
    d1.segment(live(1 * GiB, site=WEIGHTS), free(20 * GiB))
    a = d1.alloc(int(20.5 * GiB), site=ATTN)
    b = d1.alloc(16 * GiB, site=MLP)
    d1.oom(int(4.94 * GiB), device_free=int(0.13 * GiB))
    d1.free(a)
    d1.free(b)
    d1.segment_free(int(17.3 * GiB))  # the cache handed back while the failure unwound
    d2 = SnapshotBuilder(device=2, settings=on)
    d2.segment(live(30 * GiB, site=WEIGHTS), free(2 * GiB))
    return DeviceSet(d0, d1, d2)


@pytest.fixture(scope="module")
def oom_report():
    return analyze_snapshot(three_devices_oom_on_one().to_dict(), source="three.pickle")


def _finding(report, topic):
    return next(f for f in report.findings if f.topic == topic)


def test_never_prescribes_expandable_segments_when_the_snapshot_records_it_on(oom_report):
    for f in oom_report.findings:  # neither the instance's advice nor the rule's general fix
        assert "expandable_segments:True" not in f.recommendation, (f.topic, f.recommendation)


def test_fragmentation_keeps_the_rest_of_its_fix_when_expandable_segments_is_on():
    """memory-fragmentation's general fix opens with the setting: with it recorded on, that part goes and
    the rest (steady shapes, long-lived tensors first) stays; with it off, the setting is prescribed."""
    from gpuadvise.rules.memory_fragmentation import RULE

    def frag(settings):
        b = RULE.positive()
        b.settings = dict(b.settings or {}, **settings)
        return _finding(analyze_snapshot(b.to_dict(), source="frag.pickle"), "memory-fragmentation")

    on = frag({"expandable_segments": True})
    assert "expandable_segments:True" not in on.recommendation and "Keep shapes steady" in on.fix
    assert "expandable_segments:True" in frag({"expandable_segments": False}).recommendation


def test_the_oom_is_judged_at_the_failure_not_at_dump_time(oom_report):
    f = _finding(oom_report, "memory-pressure")
    n = f.evidence.numbers
    assert n["allocated_at_oom_gib"] == pytest.approx(77.5, abs=0.01)
    assert n["reserved_at_oom_gib"] == pytest.approx(78.3, abs=0.01)
    # what filled the device then: the two activations live at the failure, biggest first
    assert f.message.index("model.py:88 (attention)") < f.message.index("model.py:120 (mlp)")
    assert "after the failure unwound" in f.message
    # 0.8 GiB cached at the failure is less than the 4.94 GiB request: the device was full, not fragmented
    assert "fragmentation first" not in f.advice


def test_every_device_is_reported_leading_with_the_one_that_failed(oom_report):
    mem = oom_report.memory
    assert mem.snapshot.device == 1
    assert [d["device"] for d in mem.other_devices] == [0, 2]
    f = _finding(oom_report, "memory-pressure")
    assert "device 0: 70.00 GiB reserved, 69.00 GiB allocated" in f.message
    assert "device 2: 32.00 GiB reserved, 30.00 GiB allocated" in f.message
    assert [d["device"] for d in f.evidence.numbers["other_devices"]] == [0, 2]


def test_a_snapshot_alone_states_what_the_bf16_estimate_rests_on(oom_report):
    f = _finding(oom_report, "memory-pressure")
    assert f.evidence.numbers["half_precision_already"] is None
    line = next(x for x in f.recommendation.split("; ") if "bf16 autocast: frees" in x)
    assert "if the activations are fp32 today" in line


def _f(severity, saving, rule="GA1"):
    return Finding(rule=rule, topic=rule, severity=severity, title="", message="", evidence=Evidence(),
                   impact=Impact(est_step_saving_pct=saving, basis=""), advice="")


def test_findings_order_by_severity_then_saving():
    got = order([_f("info", 0.0, "a"), _f("low", 2.0, "b"), _f("medium", 4.0, "c"), _f("medium", 8.0, "d"),
                 _f("high", 12.0, "e")])
    assert [f.rule for f in got] == ["e", "d", "c", "b", "a"]


# ----------------------------------------------------------------------------------------------------
# compare on a fixed loader (a CPU example pair: num_workers=0, then 4, with a slow __getitem__)
# The samples wait (slow storage) rather than compute: W = 64 samples × 2 ms = 128 ms per batch whatever
# the machine's load, which the workers overlap with the step however many cores are free. Both verdicts
# hold for any step S (its compute: ~120 ms on one thread of the two-core test machine, idle) between
# W/4 = 32 ms (4 workers keep up: only the hand-over is left, which the rule leaves out) and 19 W = 2.4 s
# (the wait is still 5 % of the step): only a machine 3.7 times faster, or a load that slows the step
# 20 times, would break them.


@pytest.mark.slow
def test_compare_reports_the_fixed_dataloader_stall_resolved(tmp_path, capsys):
    import json
    import subprocess
    import sys

    from _cli_support import REPO, call_main

    script = REPO / "examples" / "train_stall.py"
    window = ["-q", "--wait", "3", "--warmup", "1", "--active", "4"]
    for name, workers in (("before", "0"), ("after", "4")):
        proc = subprocess.run([sys.executable, "-m", "gpuadvise", "profile", *window, "-o", str(tmp_path / name),
                               str(script), "--steps", "12", "--batch-size", "64", "--delay", "0.002", "--io",
                               "--width", "128", "--workers", workers],
                              env={**os.environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    rc, out, err = call_main(capsys, "compare", tmp_path / "before", tmp_path / "after", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    findings = doc.get("findings") or doc
    resolved = [e["topic"] for e in findings["resolved"]]
    still = [e["topic"] for e in findings["still_there"]]
    assert "dataloader-stall" in resolved and "dataloader-stall" not in still, json.dumps(findings)[:3000]
    # on the same CPU run: one device description, the same in every format
    outs = {}
    for fmt in ("text", "md", "json"):
        rc, outs[fmt], err = call_main(capsys, "analyze", tmp_path / "after", "--format", fmt)
        assert rc == 0, err
    desc = "CPU only (run.json: no GPU was available)"
    assert json.loads(outs["json"])["summary"]["device_description"] == desc
    assert desc in outs["text"] and desc in outs["md"]


def _loader_trace(first_wait_us: float, wait_us: float, steps: int = 3,
                  loader: str = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"):
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for i in range(steps):
        with b.step():
            b.cpu(loader, first_wait_us if i == 0 else wait_us)
            for _ in range(20):
                b.kernel("ampere_bf16_s16816gemm_bf16_128x128_nn", 400)
            b.sync()
    b.finish()
    return b


def _analyze(load_built, builder):
    from gpuadvise.analyzer.run.single import analyze_model

    return analyze_model(load_built(builder))


def test_one_slow_first_step_is_an_outlier_not_a_stall(load_built):
    # the first batch after the workers start waits 20 ms, the others 0.1 ms of an ~8 ms step
    r = _analyze(load_built, _loader_trace(20_000, 100))
    assert "dataloader-stall" not in {f.topic for f in r.findings}


def test_share_wait_and_step_come_from_the_median_step(load_built):
    r = _analyze(load_built, _loader_trace(40_000, 4_000, steps=5))
    f = next(f for f in r.findings if f.topic == "dataloader-stall")
    n = f.evidence.numbers
    # the headline share is the median wait beyond the hand-over over the median step, give or take the spread
    removable = n["median_dataloader_ms_per_step"] - n["handover_floor_ms"]
    assert n["dataloader_share_pct"] == pytest.approx(100 * removable / n["median_step_ms"], rel=0.05)
    assert f"{n['dataloader_share_pct']:.1f}%" in f.message
    # the slow first step (workers starting) is said as such: an outlier here, or a one-time cost left out
    # of every figure (one-time costs), named in the report's header
    first = min(s.number for s in r.metrics.steps + r.metrics.left_out_steps)
    left = [s.step for s in r.figures.steps_left_out]
    assert (n["outlier_steps"] and n["outlier_steps"][0] == first and "outlier" in f.message) or left == [first]


# ----------------------------------------------------------------------------------------------------
# one-time costs: a warm-up capture (the first forward pass, with lazy module loading inside one launch)


def test_one_time_costs_are_reported_as_a_capture_problem_with_the_way_to_steady_state(load_built):
    from gpuadvise.rules import find_rule

    r = _analyze(load_built, find_rule("GA111").positive())
    f = next(f for f in r.findings if f.topic == "warm-up-capture")
    kinds = {c["kind"] for c in f.evidence.items}
    assert "module-loading" in kinds
    assert "630 ms" in f.message
    assert f.severity == "medium" and "--wait" in f.advice


def test_a_steady_capture_has_no_one_time_costs(load_built):
    from gpuadvise.rules import find_rule

    r = _analyze(load_built, find_rule("GA101").positive())
    assert not any(f.topic == "warm-up-capture" for f in r.findings)


def test_warm_up_steps_are_left_out_of_every_figure_and_said_so_in_every_format(load_built):
    import json

    from gpuadvise.analyzer.report import render
    from gpuadvise.rules import find_rule

    r = _analyze(load_built, find_rule("GA111").positive())  # step #0 holds a 630 ms module load
    m = r.metrics
    assert [s.number for s in m.steps] == [1, 2] and [s.number for s in m.left_out_steps] == [0]
    # the figures are the steady steps': nothing quoted anywhere comes from the 637 ms step
    assert r.figures.median_step_ms == pytest.approx(7.0, abs=0.5)
    assert [t.step for t in r.figures.step_times_ms] == [1, 2]
    assert m.busy_in_steps_pct > 90 and m.temporal["busy_pct"] > 90
    topics = {f.topic for f in r.findings}
    assert not topics & {"low-gpu-utilization", "launch-bound"}
    assert [s.step for s in r.figures.steps_left_out] == [0] and "aten::conv2d" in r.figures.steps_left_out[0].reason
    outs = {fmt: render([r], fmt) for fmt in ("text", "md", "html", "json")}
    for fmt, out in outs.items():
        flat = " ".join(out.split())
        assert "step #0" in flat and "one-time costs" in flat, fmt
    trace = json.loads(outs["json"])["traces"][0]
    assert [s["step"] for s in trace["steps_left_out"]] == [0] and trace["one_time_note"] == r.figures.one_time_note
    f = next(f for f in r.findings if f.topic == "warm-up-capture")
    assert f.evidence.numbers["steps_left_out"] == [0] and "Step #0 is left out" in f.message


def test_nested_one_time_costs_are_counted_once(load_built):
    from gpuadvise.rules import find_rule

    r = _analyze(load_built, find_rule("GA111").positive())
    f = next(f for f in r.findings if f.topic == "warm-up-capture")
    items = {c["kind"]: c for c in f.evidence.items}
    # the launch inside the first convolution inside the first step: one cost, said to nest
    assert items["module-loading"]["within"].startswith("the first aten::conv2d")
    assert items["first-call"]["within"].startswith("step #0")
    step0 = r.figures.steps_left_out[0].ms
    assert f.evidence.numbers["one_time_ms"] == pytest.approx(step0, abs=1.0)  # the union, not 630 + 630 + 637
    assert f.evidence.numbers["one_time_pct_of_window"] <= 100.0
    assert f"Together {step0:.0f} ms" in f.message


def _first_step_compiles():
    """Recorded steps 8-10 of a compiled model; the window fell on the first compiled step (3 s compiling)."""
    from gpuadvise.fixtures.builder import TraceBuilder
    from gpuadvise.fixtures.compiled import WINDOW, compiled_facts

    b = TraceBuilder()
    b.step_no = WINDOW[0]
    for i in range(3):
        with b.step():
            with b.op("Torch-Compiled Region: 0/0"):
                if i == 0:
                    b.idle(3_000_000)  # dynamo tracing and Inductor codegen
                with b.op("CompiledFunction"):
                    for _ in range(4):
                        b.kernel("triton_poi_fused_add_relu_0", 400)
            b.sync()
    b.finish()
    b.facts = compiled_facts([{"step": WINDOW[0], "seconds": 3.0}])
    return b


def test_compilation_in_the_first_step_is_reported_once(tmp_path):
    from gpuadvise.analyzer.run.engine import analyze_paths
    from gpuadvise.fixtures.compiled import WINDOW

    run = _first_step_compiles().write_run_folder(tmp_path / "run")
    r = analyze_paths([str(run)])[0]
    topics = [f.topic for f in r.findings]
    owner = next(f for f in r.findings if f.rule == "GA152")  # compile-in-window owns the compilation
    assert owner.evidence.steps == [WINDOW[0]]
    assert "warm-up-capture" not in topics
    # and the compiling step is still kept out of the figures, said so in the header
    assert [s.step for s in r.figures.steps_left_out] == [WINDOW[0]]
    assert not {"low-gpu-utilization", "launch-bound"} & set(topics)


def test_a_one_step_warm_up_capture_drives_no_other_finding(load_built):
    from gpuadvise.fixtures.builder import TraceBuilder
    from gpuadvise.rules.warmup_capture import CONV, GEMM

    GiB_ = 2**30
    b = TraceBuilder()  # the first forward pass alone: the first convolution loads its module (630 ms)
    with b.step():
        b.memory(GiB_, GiB_, 2 * GiB_)  # 2.5 % of the 80 GiB device: room that the busy GPU does not need
        with b.op("aten::conv2d"):
            b.launch_us = 630_000.0
            b.kernel(CONV, 2_000)
            b.launch_us = 5.0
        for _ in range(10):
            b.kernel(GEMM, 500)
        b.sync()
    b.finish()
    r = _analyze(load_built, b)
    topics = {f.topic for f in r.findings}
    assert "warm-up-capture" in topics
    assert not topics & {"low-gpu-utilization", "launch-bound", "memory-headroom"}
    # the window's figures are the forward pass without the load, and the report says what was cut
    assert r.figures.median_step_ms == pytest.approx(7.0, abs=0.5)
    assert r.figures.gpu_busy_in_steps_pct > 90
    assert "630.0 ms of one-time costs are cut out" in r.figures.one_time_note
    f = next(f for f in r.findings if f.topic == "warm-up-capture")
    assert f.evidence.numbers["cut_from_figures_ms"] == pytest.approx(630.0, abs=1.0)


@pytest.mark.slow  # the real H100 runs
def test_steady_h100_runs_leave_no_step_out():
    """A false drop would change every number of a report: `gpuadvise profile` runs (steady, after
    --wait) keep all their steps."""
    import pathlib

    from gpuadvise.analyzer.read.sources import resolve
    from gpuadvise.analyzer.run.single import analyze_source

    traces = os.environ.get("GPUADVISE_TRACES") or pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "traces"
    h100 = pathlib.Path(traces) / "h100"
    runs = sorted(p for p in h100.glob("*") if p.is_dir() and any(p.glob("*.json.gz"))) if h100.is_dir() else []
    if not runs:
        pytest.skip(f"no H100 run folders at {h100}")
    for run in runs[:: max(1, len(runs) // 8)]:  # a spread of them: each takes a second on two cores
        [r] = analyze_source(resolve([str(run)])[0])
        assert r.figures.steps_left_out == [] and r.figures.one_time_note is None, run.name


# ----------------------------------------------------------------------------------------------------
# launch-bound says where the CPU time per kernel goes


def test_launch_bound_splits_the_cpu_time_per_kernel(load_built):
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder(launch_us=6.0)
    for _ in range(4):
        with b.step():
            for _ in range(200):
                with b.op("aten::add"):
                    b.idle(20)  # dispatch: inside the op, before its launch
                    b.kernel("void at::native::vectorized_elementwise_kernel<4, add>", 3)
                b.idle(30)  # Python between ops
            b.sync()
    b.finish()
    r = _analyze(load_built, b)
    f = next(f for f in r.findings if f.topic == "launch-bound")
    cost = f.evidence.numbers["cpu_per_kernel_us"]
    assert cost["launch_us"] == pytest.approx(6.0, abs=0.5)
    assert cost["dispatch_us"] == pytest.approx(21.0, abs=1.5)  # 20 µs before the launch and the op's closing 1 µs
    assert cost["other_us"] == pytest.approx(30.0, abs=2.0)
    assert cost["total_us"] == pytest.approx(cost["launch_us"] + cost["dispatch_us"] + cost["other_us"], rel=0.01)
    # the message leads with the biggest part, not with the launch call
    assert f.message.index("outside any recorded op") < f.message.index("PyTorch op dispatch") < f.message.index("launch call")


def test_text_and_markdown_list_every_device(oom_report):
    from gpuadvise.analyzer.report import render

    text, md = render([oom_report], "text"), render([oom_report], "md")
    for out in (text, md):
        assert "device 0" in out.lower() and "device 2" in out.lower()
        assert "70.00 GiB" in out and "32.00 GiB" in out


# ----------------------------------------------------------------------------------------------------
# words and numbers that agree


def test_header_share_of_the_device_matches_the_finding(load_built):
    from gpuadvise.analyzer.report import render
    from gpuadvise.rules import find_rule

    r = _analyze(load_built, find_rule("GA123").positive())
    f = next(f for f in r.findings if f.topic == "memory-headroom")
    assert f"({f.evidence.numbers['peak_pct_of_capacity']:.1f} % of the device)" in render([r], "text")


def test_no_batch_multiple_for_a_forward_pass_only(load_built):
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.memory(2**30, 6 * 2**30, 8 * 2**30)
            b.idle(3_000)
            with b.op("aten::linear"):
                for _ in range(10):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 100)
            b.sync()
    b.finish()
    f = next(f for f in _analyze(load_built, b).findings if f.topic == "memory-headroom")
    assert "× the batch" not in f.advice
    assert "no training step" in f.recommendation


def test_profiler_overhead_below_one_is_no_measurable_overhead():
    from gpuadvise.analyzer.model.report import overhead_words

    assert overhead_words(0.68) == "no measurable profiler overhead"
    assert overhead_words(1.8) == "the profiler made the traced steps 1.80× slower"


def test_a_one_step_capture_is_not_called_a_median_of_1_steps(load_built):
    from gpuadvise.analyzer.report import render
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    with b.step():
        for _ in range(10):
            b.kernel("ampere_tf32_s1688gemm_64x64_nn", 100)
        b.sync()
    b.finish()
    r = _analyze(load_built, b)
    text = render([r], "text")
    assert r.figures.steps == 1
    assert "1 step," in text and "1 steps" not in text and "median of 1" not in text


def test_the_device_is_described_once_from_run_json_first():
    from gpuadvise.analyzer.model.runfacts import describe_device

    cpu_run = {"environment": {"cuda_available": False}}
    assert describe_device(cpu_run, None, has_gpu=False) == "CPU only (run.json: no GPU was available)"
    assert describe_device({"environment": {"device": {"name": "NVIDIA H100 80GB HBM3"}}}) == "NVIDIA H100 80GB HBM3"


# ----------------------------------------------------------------------------------------------------
# one statistic per report. Python between launches takes 2, 2 and 8 ms in three steps:
# the median step idles 2 ms on it, the mean 4 ms; the header quotes the median step.


def _uneven_idle():
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for python_us in (2_000, 2_000, 8_000):
        with b.step():
            b.idle(python_us)
            for _ in range(10):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 100)
            b.sync()
    b.finish()
    return b


def test_idle_causes_and_step_are_the_median_step(load_built):
    from gpuadvise.analyzer.report import render

    r = _analyze(load_built, _uneven_idle())
    f = next(f for f in r.findings if f.topic == "low-gpu-utilization")
    median_ms = r.metrics.median_step_us / 1e3
    assert f.evidence.numbers["median_step_ms"] == pytest.approx(median_ms, abs=0.01)
    assert f"median {median_ms:.1f} ms" in f.message and "mean" not in f.message
    python = next(c for c in f.evidence.numbers["cpu_during_idle"] if c["kind"] == "python")
    assert python["ms_per_step"] == pytest.approx(2.0, abs=0.05)  # the median step's 2 ms, not the mean 4 ms
    assert f"{python['ms_per_step']:.2f} ms (" in f.message
    # the header's median step and the idle split are of the same step: the split adds up to its idle time
    idle = r.figures.idle_breakdown_ms
    assert sum(idle.values()) == pytest.approx(r.figures.step_breakdown_ms["idle"], abs=0.05)
    assert f"median {r.figures.median_step_ms:.1f} ms" in render([r], "text")


def test_profile_prints_the_profilers_overhead_once(tmp_path, capsys, load_built):
    """`gpuadvise profile`'s summary: run.json's step-time line and the report header stated two ratios for
    the same overhead (1.17× and 1.18×, from the harness's timing and from the trace); the header's stays."""
    import json

    from gpuadvise.harness import cli
    from gpuadvise.harness.runfolder import layout

    _uneven_idle().write(tmp_path / layout.trace_name(None))
    traced_ms = 4.0  # about the fixture's median step; the harness's own figure differs a little, as it does
    (tmp_path / "run.json").write_text(json.dumps({"steps": {
        "clock": "cpu", "unprofiled_median_ms": traced_ms / 1.5, "unprofiled_n": 4,
        "profiled_median_ms": traced_ms * 1.02, "profiled_n": 3, "overhead_x": 1.53}}))
    cli._summary(tmp_path, None)
    err = capsys.readouterr().err
    ratios = set(re.findall(r"(\d+\.\d+)×", err))
    assert len(ratios) == 1, err  # one figure for the one ratio
    assert "unprofiled (median of 4 steps)" in err


# ----------------------------------------------------------------------------------------------------
# dataloader-stall on a busy machine: with workers running, each batch still costs the training
# process its hand-over (unpickling a ready batch, 1-2 ms on a busy machine); more workers cannot remove it.


def _handover_run(tmp_path, name: str, build_ms: float, wait_us: float = 1_500, cpus: int = 16):
    """4 workers, 1.5 ms waits in every ~9.5 ms step; run.json says what a batch costs to build."""
    b = _loader_trace(wait_us, wait_us, steps=4)
    b.facts = {
        "environment": {"machine": {"cpu": {"logical": cpus, "usable": cpus, "cgroup_limit": None}}},
        "dataloaders": [{"created_at": "train.py:12", "num_workers": 4, "pin_memory": False}],
        "capture": {"loader": {"num_workers": 4, "build_ms_per_batch": build_ms, "between_batches_ms": 8.0,
                               "wait_ms_per_batch": wait_us / 1e3, "fetch_ms_per_sample": build_ms / 64,
                               "collate_ms_per_batch": 0.1, "fetch": "__getitem__", "functions": []}},
    }
    return b.write_run_folder(tmp_path / name)


def _stall(folder):
    from gpuadvise.analyzer.run.engine import analyze_paths

    (r,) = analyze_paths([str(folder)], jobs=1)
    return next((f for f in r.findings if f.topic == "dataloader-stall"), None), r


def test_workers_that_keep_up_leave_a_handover_not_a_stall(tmp_path):
    # 4 workers build a batch every 2.5 ms, the step uses one every 8 ms: the 1.5 ms waits are the hand-over
    f, r = _stall(_handover_run(tmp_path, "keeps-up", build_ms=10.0))
    assert f is None, f.message
    share = 100 * float(r.metrics.per_step["dataloader_us"].median()) / r.metrics.median_step_us
    assert share >= 5.0  # above the threshold on its own: what used to fire "add workers"


def test_workers_that_lag_still_stall_and_get_more_workers(tmp_path):
    # 4 workers build a batch every 11 ms, the step uses one every 8 ms: 3 ms of lag per batch
    f, _ = _stall(_handover_run(tmp_path, "lags", build_ms=44.0, wait_us=3_000))
    assert f is not None and f.evidence.numbers["handover_floor_ms"] == pytest.approx(0.0, abs=0.05)
    assert "num_workers=" in f.recommendation


def test_a_long_wait_from_workers_that_keep_up_is_not_all_hand_over(tmp_path):
    # workers keep up on average (2.5 ms per batch against 8 ms between batches) yet each step waits 6 ms:
    # no hand-over takes that long, so at most 2 ms of it is left out and the rest is a stall
    f, _ = _stall(_handover_run(tmp_path, "uneven", build_ms=10.0, wait_us=6_000))
    assert f is not None and f.evidence.numbers["handover_floor_ms"] == pytest.approx(2.0, abs=0.05)


def test_trace_only_handover_floor_is_not_a_stall(load_built):
    # no run.json: steady 1.5 ms waits of a multi-process loader (a batch was ready each time) in a ~9.5 ms step
    r = _analyze(load_built, _loader_trace(1_500, 1_500, steps=4))
    assert 100 * float(r.metrics.per_step["dataloader_us"].median()) / r.metrics.median_step_us >= 5.0
    assert "dataloader-stall" not in {f.topic for f in r.findings}
    # the same waits on the training thread (num_workers=0) are loading: a stall
    from gpuadvise.rules.dataloader_stall import SINGLE

    b = _loader_trace(1_500, 1_500, steps=4, loader=SINGLE)
    assert "dataloader-stall" in {f.topic for f in _analyze(load_built, b).findings}


# ----------------------------------------------------------------------------------------------------
# one statistic, in every rule: every count and time a finding quotes "per step" is the median over the steps (the
# header's statistic), never a total divided by the number of steps. Each fixture has three steps, one
# of them (the middle one) holding ten times the work of the other two: the mean per step is four times
# the median, so a mean sneaking back shows at once.

OUTLIER = (1, 10, 1)  # work per step, as a multiple of the usual step's


def _rule_finding(load_built, builder, topic):
    r = _analyze(load_built, builder)
    found = [f for f in r.findings if f.topic == topic]
    assert found, [f.topic for f in r.findings]
    return r, found[0]


def _syncs_trace():
    """2 syncs in a usual step, 20 in the outlier: each after GPU work the CPU could have overlapped."""
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for times in OUTLIER:
        with b.step():
            for _ in range(2 * times):
                for _ in range(10):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 200)
                b.sync()
                b.idle(1_500)  # Python work the GPU waits for
    b.finish()
    return b


def test_host_sync_counts_and_blocked_time_are_the_median_step(load_built):
    from gpuadvise.analyzer.measure.basics import perstep

    r, f = _rule_finding(load_built, _syncs_trace(), "host-sync")
    n, m = f.evidence.numbers, r.metrics
    assert n["blocking_calls"] == 24 and n["per_step"] == 2  # 2, 20 and 2 syncs: the median 2, not the mean 8
    assert "a median 2 per step" in f.message
    s = m.syncs[~m.syncs["profiler_sync"]]
    blocked = sorted(perstep.issued(m, s["ts"], s["dur"]))
    assert n["blocked_ms_per_step"] == pytest.approx(blocked[1] / 1e3, abs=0.01)  # the middle step of three
    assert n["blocked_share_pct"] == pytest.approx(100 * blocked[1] / m.median_step_us, abs=0.1)
    assert f"{n['blocked_share_pct']:.1f}%" in f.message and n["statistic"] == "median step"
    # the step that blocks ten times as long is named, and left out of the figures and of the saving alike
    assert n["outlier_steps"] == [m.steps[1].number] and f"Step {m.steps[1].number} blocked far longer" in f.message
    assert f"outlier step {m.steps[1].number} left as" in f.impact.basis


def test_one_steps_syncs_never_carry_host_sync(load_built):
    # syncs in one step of five (a one-off evaluation or checkpoint): an outlier, not the loop's habit
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for i in range(5):
        with b.step():
            for _ in range(20 if i == 2 else 1):
                for _ in range(10):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 200)
                if i == 2:
                    b.sync()
                    b.idle(1_500)
    b.finish()
    from gpuadvise.analyzer.run.single import analyze_model

    r = analyze_model(load_built(b))
    assert "host-sync" not in {f.topic for f in r.findings}


def _launches_trace():
    """200 tiny kernels in a usual step, 2000 in the outlier, each behind 8 µs of Python."""
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder(launch_us=12.0)
    for times in OUTLIER:
        with b.step():
            for _ in range(200 * times):
                b.kernel("void at::native::vectorized_elementwise_kernel<4, add>", 3)
                b.idle(8)
            b.sync()
    b.finish()
    return b


def test_launch_bound_kernels_per_step_are_the_median_step(load_built):
    _, f = _rule_finding(load_built, _launches_trace(), "launch-bound")
    assert f.evidence.numbers["kernels_per_step"] == 200  # not the mean 800
    assert f.message.startswith("A median 200 kernels per step")


def _zeroing_trace(work=OUTLIER):
    """zero_grad(set_to_none=False): 40 parameters zeroed in a usual step, 400 in the outlier (`work`: the
    multiple per step; 0, a micro-step of gradient accumulation that does not call zero_grad)."""
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for times in work:
        with b.step():
            if not times:
                for _ in range(30):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 150)
                b.sync()
                continue
            with b.op("Optimizer.zero_grad#SGD.zero_grad", cat="user_annotation"):
                for _ in range(40 * times):
                    with b.op("aten::zero_"):
                        with b.op("aten::fill_"):
                            b.kernel("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>", 8)
                b.idle(5)
            for _ in range(30):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 150)
            b.sync()
    b.finish()
    return b


def test_zero_grad_counts_are_the_median_step(load_built):
    _, f = _rule_finding(load_built, _zeroing_trace(), "zero-grad")
    n = f.evidence.numbers
    assert n["zero_ops_per_step"] == 40 and n["fill_kernels_per_step"] == 40  # not the mean 160
    assert "a median 40 `aten::zero_` ops per step" in f.message and "a median 40 fill kernels" in f.message
    assert f"({n['cpu_ms_per_step']:.2f} ms of CPU time)" in f.message


def _per_tensor_optimizer_trace(work=OUTLIER):
    """AdamW on the per-tensor path: 60 parameters × 3 kernels in a usual step, 600 × 3 in the outlier
    (`work`: the multiple per step; 0, a micro-step of gradient accumulation without an optimizer step)."""
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for times in work:
        with b.step():
            for _ in range(30):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 20)
            if not times:
                b.sync()
                continue
            with b.op("Optimizer.step#AdamW.step", cat="user_annotation"):
                for _ in range(60 * times):
                    for _ in range(3):
                        b.kernel("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", 3)
                        b.idle(10)
            b.sync()
    b.finish()
    return b


def test_single_tensor_optimizer_counts_are_the_median_step(load_built):
    _, f = _rule_finding(load_built, _per_tensor_optimizer_trace(), "single-tensor-optimizer")
    n = f.evidence.numbers
    assert n["kernels_per_step"] == 180 and n["statistic"] == "median step"  # not the mean 720
    assert "a median 180 kernels per step" in f.message
    assert f"takes a median {n['optimizer_cpu_ms']:.2f} ms of CPU time" in f.message


def _cpu_created_trace():
    """A position tensor built on the CPU and copied: 2 in a usual step, 20 in the outlier."""
    from gpuadvise.fixtures.builder import TraceBuilder

    gemm = "ampere_tf32_s1688gemm_64x64_nn"
    b = TraceBuilder()
    for times in OUTLIER:
        with b.step():
            for _ in range(2 * times):
                for _ in range(10):
                    with b.op("aten::linear"):
                        b.kernel(gemm, 300)
                b.cpu("aten::arange", 12)
                with b.op("aten::to"):
                    with b.op("aten::_to_copy"):
                        with b.op("aten::copy_"):
                            b.copy("HtoD", "Pageable", "Device", nbytes=4096, dur=3)
                b.idle(1_500)
            b.sync()
    b.finish()
    return b


def test_cpu_created_tensors_copies_per_step_are_the_median_step(load_built):
    _, f = _rule_finding(load_built, _cpu_created_trace(), "cpu-created-tensors")
    n = f.evidence.numbers
    assert n["copies_per_step"] == 2 and n["statistic"] == "median step"  # not the mean 8
    assert f.message.startswith("A median 2 small host→device copies per step")
    assert f"{n['copy_ms_per_step']:.3f} ms of copy time" in f.message


def test_optimizer_counts_under_gradient_accumulation_are_the_median_step_that_runs_it(load_built):
    """One optimizer step (and zero_grad) in four micro-steps: the median over all steps would be 0 and
    silence both rules; the figures are the median over the steps that run them, and say so."""
    _, f = _rule_finding(load_built, _per_tensor_optimizer_trace(work=(0, 0, 0, 1)), "single-tensor-optimizer")
    assert f.evidence.numbers["kernels_per_step"] == 180
    assert "a median 180 kernels per step that runs it (1 of 4)" in f.message
    _, f = _rule_finding(load_built, _zeroing_trace(work=(0, 1, 0, 1)), "zero-grad")
    assert f.evidence.numbers["zero_ops_per_step"] == 40
    assert "a median 40 `aten::zero_` ops per step that calls it (2 of 4)" in f.message

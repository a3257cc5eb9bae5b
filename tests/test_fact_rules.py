"""The rules that read run facts (GA140-GA144) and memory-pressure's ranked remedies, on synthetic traces:
where they must fire, the near misses where they must not, and what their estimates are based on.
Each rule's own positive/negative fixtures run in test_rules.py; the end-to-end runs of real scripts are
in test_fact_rules_profile.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model, analyze_snapshot
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.fixtures.builder import GEMM, TraceBuilder
from gpuadvise.fixtures.runjson import run_json
from gpuadvise.fixtures.snapshot import GiB, SnapshotBuilder, live
from gpuadvise.rules import all_rules, find_rule
from gpuadvise.rules import cudnn_benchmark, debug_settings, inference_with_grad

NEW = ("debug-settings", "cudnn-benchmark", "inference-with-grad", "cpu-created-tensors", "model-on-cpu")
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "h100"


def run(load_built, builder: TraceBuilder, facts: dict | None = None):
    return analyze_model(load_built(builder), facts)


def finding(report, topic: str):
    found = [f for f in report.findings if f.topic == topic]
    assert len(found) <= 1
    assert not any("failed" in n for n in report.notes), report.notes
    return found[0] if found else None


def test_new_rules_are_in_the_catalog_and_the_docs():
    codes = {r.name: r.code for r in all_rules()}
    assert [codes[n] for n in NEW] == ["GA140", "GA141", "GA142", "GA143", "GA144"]
    table = (Path(__file__).resolve().parents[1] / "docs" / "rules" / "index.md").read_text(encoding="utf-8")
    for rule in all_rules():
        assert f"| `{rule.topic}` |" in table, f"the docs' rule catalog lacks {rule.topic}"


# ----------------------------------------------------------------------------------------------------
# debug-settings


def test_blocking_launch_prediction_matches_the_run_without_them(load_built):
    """The fixture pair is the same loop with and without blocking launches: the prediction made on the
    blocking trace must come close to the step time the non-blocking trace really has."""
    rule = find_rule("debug-settings")
    blocking, free = rule.positive(), rule.negative()
    f = finding(run(load_built, blocking, blocking.facts), "debug-settings")
    assert f is not None and "CUDA_LAUNCH_BLOCKING=1" in f.message
    step = lambda b: compute(load_built(b)).median_step_us  # noqa: E731
    actual = 100 * (1 - step(free) / step(blocking))
    assert f.impact.est_step_saving_pct == pytest.approx(actual, abs=3.0), (f.impact.est_step_saving_pct, actual)
    assert actual > 20  # the Python work between launches overlaps the GPU once launches return at once
    assert f.severity == "high" and f.evidence.numbers["blocking_launches"]["blocked"] == 80


def test_blocking_launches_are_found_without_run_json(load_built):
    f = finding(run(load_built, find_rule("debug-settings").positive()), "debug-settings")
    assert f is not None and "blocking kernel launches" in f.message


def test_blocking_variable_on_a_cpu_only_run_costs_nothing(load_built):
    b = TraceBuilder(device=None)
    for _ in range(3):
        with b.step():
            b.cpu("aten::addmm", 500)
    f = finding(run(load_built, b, run_json(env={"CUDA_LAUNCH_BLOCKING": "1"}, cuda_available=False)), "debug-settings")
    assert f is not None and "cost nothing here" in f.message
    assert f.severity == "low" and f.impact.est_step_saving_pct == 0.0


def _backward_loop(nan_checks: bool) -> TraceBuilder:
    """Forward, then backward functions; with anomaly detection each is followed by its NaN check, whose
    `.item()` copies the flag to the host and syncs."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(6):
                with b.op("aten::linear", **{"Sequence number": 1}):
                    b.kernel(GEMM, 100)
            for i in range(6):
                with b.op(f"{debug_settings.BACKWARD} AddmmBackward0", **{"Sequence number": i}):
                    b.kernel(GEMM, 200)
                    if nan_checks:
                        with b.op("aten::isnan"):
                            b.kernel("void at::native::vectorized_elementwise_kernel<4, isnan>", 5)
                        with b.op("aten::_is_any_true"):
                            b.kernel("void at::native::reduce_kernel<512, 1, any>", 5)
                        b.item()
                b.idle(50)
            b.sync()
    b.finish()
    return b


def test_anomaly_detection_seen_in_the_trace(load_built):
    f = finding(run(load_built, _backward_loop(nan_checks=True)), "debug-settings")
    assert f is not None and "anomaly detection (seen in the trace)" in f.message
    checks = f.evidence.numbers["nan_checks"]
    assert checks["checks"] == 24 and checks["backward_functions"] == 24 and checks["syncs"] >= 24
    assert f.impact.est_step_saving_pct > 10 and "replay" in f.impact.basis and "lower bound" in f.impact.basis
    assert finding(run(load_built, _backward_loop(nan_checks=False)), "debug-settings") is None


def test_anomaly_detection_recorded_without_a_backward_in_the_window(load_built):
    b = find_rule("debug-settings").negative()  # no backward ops at all
    f = finding(run(load_built, b, run_json(settings={"anomaly_detection": True})), "debug-settings")
    assert f is not None and f.severity == "medium" and f.impact.est_step_saving_pct == 0.0
    assert "only its forward cost" in f.message


def test_determinism_and_debug_variables_are_listed_but_not_predicted(load_built):
    facts = run_json(env={"NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"},
                     settings={"deterministic_algorithms": True})
    f = finding(run(load_built, find_rule("debug-settings").negative(), facts), "debug-settings")
    names = [i["name"] for i in f.evidence.items]
    assert names == ["torch.use_deterministic_algorithms(True)", "NCCL_DEBUG=INFO", "TORCH_DISTRIBUTED_DEBUG=DETAIL"]
    assert f.impact.est_step_saving_pct == 0.0 and f.impact.basis.startswith("not predicted")
    assert f.severity == "low"  # doctor rates all three warn, none bad


@pytest.mark.parametrize("facts", [
    {"settings": "yes", "environment": [1, 2]},
    {"settings": {"anomaly_detection": "true"}, "environment": {"machine": {"env": {"CUDA_LAUNCH_BLOCKING": 1}}}},
    {"optimizers": [{"param_devices": {"cpu": "8"}}], "environment": {"cuda_available": "yes"}},
])
def test_malformed_run_json_is_ignored(tmp_path, facts):
    """run.json is the user's file: wrong types never fail a rule, they just say nothing."""
    d = tmp_path / "run"
    d.mkdir()
    find_rule("debug-settings").negative().write(d / "trace.json.gz")
    (d / "run.json").write_text(json.dumps(facts))
    (report,) = analyze_paths([str(d)], jobs=1)
    assert not any("failed" in n for n in report.notes), report.notes
    assert not {f.topic for f in report.findings} & set(NEW)


# ----------------------------------------------------------------------------------------------------
# cudnn-benchmark


OFF = run_json(settings={"cudnn_benchmark": False})


def test_varying_shapes_leave_benchmark_off(load_built):
    b = cudnn_benchmark._convnet(generic=True, shapes=[160, 128, 160, 96])
    assert finding(run(load_built, b, OFF), "cudnn-benchmark") is None


def test_needs_the_recorded_setting(load_built):
    b = cudnn_benchmark._convnet(generic=True)
    assert finding(run(load_built, b), "cudnn-benchmark") is None  # a plain trace does not say
    assert finding(run(load_built, b, run_json(settings={"cudnn_benchmark": None})), "cudnn-benchmark") is None


def test_tensor_core_convolutions_get_no_predicted_saving(load_built):
    f = finding(run(load_built, cudnn_benchmark._convnet(generic=False), OFF), "cudnn-benchmark")
    assert f is not None and f.severity == "low" and f.impact.est_step_saving_pct == 0.0
    assert f.impact.basis.startswith("not predicted") and "6.4 %" in f.impact.basis
    assert f.evidence.numbers["generic_kernels"] == 0


def test_generic_kernel_saving_comes_from_the_replay(load_built):
    f = finding(run(load_built, cudnn_benchmark._convnet(generic=True), OFF), "cudnn-benchmark")
    assert f.evidence.numbers["generic_kernels"] == 4  # one per step: the first layer's
    assert any("convolve_common_engine" in i["name"] and not i["tensor_cores"] for i in f.evidence.items)
    assert "replay" in f.impact.basis and 0 < f.impact.est_step_saving_pct < 30


def test_unrecorded_shapes_are_said_to_be_unknown(load_built):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(3):
                with b.op("aten::convolution"):
                    with b.op("aten::cudnn_convolution"):
                        b.kernel(cudnn_benchmark.FPROP, 400)
            b.sync()
    b.finish()
    f = finding(run(load_built, b, OFF), "cudnn-benchmark")
    assert f is not None and "not recorded" in f.message and f.evidence.numbers["fixed_shapes"] is None


def test_a_small_convolution_share_is_not_worth_it(load_built):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.op("aten::convolution", **{"Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3]]}):
                b.kernel(cudnn_benchmark.FPROP, 50)
            for _ in range(10):
                b.kernel(GEMM, 500)
            b.sync()
    b.finish()
    assert finding(run(load_built, b, OFF), "cudnn-benchmark") is None


@pytest.mark.skipif(not (SHARED / "cudnn-before").is_dir(), reason="the H100 pairs of the shared corpus are not here")
def test_h100_cudnn_pair():
    """The real pair: benchmark off (before) vs on (after), measured 6.4 % faster after (pairs.json)."""
    (before,) = analyze_paths([str(SHARED / "cudnn-before")], jobs=1)
    (after,) = analyze_paths([str(SHARED / "cudnn-after")], jobs=1)
    f = finding(before, "cudnn-benchmark")
    measured = json.loads((SHARED / "pairs.json").read_text())["pairs"]["cudnn"]["measured_saving_pct"]
    assert f is not None and f.evidence.numbers["fixed_shapes"] is True
    assert any("convolve_common_engine" in i["name"] and not i["tensor_cores"] for i in f.evidence.items)
    assert 0.25 * measured <= f.impact.est_step_saving_pct <= 1.5 * measured, (f.impact.est_step_saving_pct, measured)
    assert finding(after, "cudnn-benchmark") is None


# ----------------------------------------------------------------------------------------------------
# inference-with-grad


def test_training_steps_are_not_inference(load_built):
    b = inference_with_grad._loop(eval_steps=0, grad=True, train_steps=4)
    assert finding(run(load_built, b), "inference-with-grad") is None


def test_evaluation_after_training_in_the_window(load_built):
    b = inference_with_grad._loop(eval_steps=2, grad=True, train_steps=2)
    f = finding(run(load_built, b), "inference-with-grad")
    assert f is not None and f.evidence.steps == [2, 3] and f.severity == "low"
    assert f.evidence.numbers["autograd_nodes_per_step"] == [8, 8]
    # one evaluation step in four is below the threshold
    assert finding(run(load_built, inference_with_grad._loop(eval_steps=1, grad=True, train_steps=3)),
                   "inference-with-grad") is None


def test_a_trace_without_steps_is_described_as_one_window(load_built):
    b = inference_with_grad._loop(eval_steps=2, grad=True)
    b.events = [e for e in b.events if not str(e.get("name", "")).startswith("ProfilerStep#")]
    f = finding(run(load_built, b), "inference-with-grad")
    assert f is not None and f.evidence.steps == []
    assert f.message.startswith("The traced window runs forward ops with autograd recording (16 graph nodes in the trace)")
    assert "per step" not in f.message


def test_grad_mode_without_graph_nodes_is_not_flagged(load_built):
    """A frozen model (no parameter requires grad) runs in grad mode but creates no nodes: every op
    repeats the same sequence number."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(8):
                with b.op("aten::linear", **{"Sequence number": 41, "Fwd thread id": 0}):
                    b.kernel(GEMM, 100)
            b.sync()
    b.finish()
    assert finding(run(load_built, b), "inference-with-grad") is None


def test_old_traces_name_backward_without_the_engine_wrapper(load_built):
    """2021 traces: backward ops are `CudnnConvolutionBackward` etc. with no evaluate_function around them."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for n in range(5):
                with b.op("aten::conv2d", **{"Sequence number": n}):
                    b.kernel(cudnn_benchmark.FPROP, 100)
            for n in range(4, -1, -1):
                with b.op("CudnnConvolutionBackward", **{"Sequence number": n}):
                    b.kernel(cudnn_benchmark.WGRAD, 100)
            b.sync()
    b.finish()
    assert finding(run(load_built, b), "inference-with-grad") is None


# ----------------------------------------------------------------------------------------------------
# cpu-created-tensors


def _copy_after(create: str | None, src: str = "Pageable", loader: bool = False, gap_us: float = 0.0,
                on_gpu: bool = False) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(10):
                b.kernel(GEMM, 300)
            if loader:
                with b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"):
                    b.cpu(create, 10)
            elif create:
                if on_gpu:
                    with b.op(create):
                        b.kernel("void at::native::elementwise_kernel<128, 2, fill>", 3)
                else:
                    b.cpu(create, 10)
            b.idle(gap_us)
            with b.op("aten::to"):
                with b.op("aten::copy_"):
                    b.copy("HtoD", src, "Device", nbytes=4096, dur=3)
            b.idle(1_500)
            for _ in range(10):
                b.kernel(GEMM, 300)
            b.sync()
    b.finish()
    return b


def test_cpu_created_tensor_fires(load_built):
    f = finding(run(load_built, _copy_after("aten::lift_fresh")), "cpu-created-tensors")
    assert f is not None and f.evidence.items[0]["name"] == "aten::lift_fresh → aten::to"
    assert f.impact.est_step_saving_pct >= 0.5 and "replay" in f.impact.basis


@pytest.mark.parametrize("case", ["pinned", "no creation", "inside the DataLoader", "long before", "created on the GPU"])
def test_cpu_created_tensor_near_misses(load_built, case):
    b = {"pinned": lambda: _copy_after("aten::arange", src="Pinned"),
         "no creation": lambda: _copy_after("aten::linear"),
         "inside the DataLoader": lambda: _copy_after("aten::lift_fresh", loader=True),
         "long before": lambda: _copy_after("aten::arange", gap_us=5_000),
         "created on the GPU": lambda: _copy_after("aten::arange", on_gpu=True)}[case]()
    assert finding(run(load_built, b), "cpu-created-tensors") is None


# ----------------------------------------------------------------------------------------------------
# model-on-cpu


def test_some_parameters_on_the_cpu_is_medium(load_built):
    f = finding(run(load_built, find_rule("model-on-cpu").negative(), run_json(param_devices={"cuda": 6, "cpu": 2})),
                "model-on-cpu")
    assert f is not None and f.severity == "medium" and "2 of the 8 parameters" in f.message


def test_no_gpu_no_finding(load_built):
    b = find_rule("model-on-cpu").positive()
    assert finding(run(load_built, b, run_json(param_devices={"cpu": 8}, cuda_available=False)), "model-on-cpu") is None
    assert finding(run(load_built, b, run_json()), "model-on-cpu") is None  # no optimizer recorded


# ----------------------------------------------------------------------------------------------------
# memory-pressure: the remedies, ranked from the memory figures


def _oom(floor_gib: int, activations_gib: int, request_gib: int, free_gib: int) -> dict:
    b = SnapshotBuilder()
    b.segment(live(floor_gib * GiB, site=("train.py", 12, "<module>")))
    a = b.alloc(activations_gib * GiB, site=("train.py", 57, "forward"))
    b.free(a)
    b.oom(request_gib * GiB, device_free=free_gib * GiB)
    return b.to_dict()


def pressure(snapshot: dict, facts: dict | None = None):
    report = analyze_snapshot(snapshot, facts)
    return next(f for f in report.findings if f.topic == "memory-pressure")


def test_activations_dominate_cheapest_remedy_first():
    f = pressure(_oom(floor_gib=10, activations_gib=20, request_gib=8, free_gib=2))  # 6 GiB missing
    n = f.evidence.numbers
    assert (n["floor_gib"], n["activations_gib"], n["missing_gib"]) == (10.0, 20.0, 6.0)
    assert [r["remedy"] for r in n["remedies"]] == ["bf16 autocast", "half the micro-batch, twice the gradient-accumulation steps",
                                                    "activation checkpointing"]
    assert [r["frees_gib"] for r in n["remedies"]] == [10.0, 10.0, 20.0] and all(r["covers_need"] for r in n["remedies"])
    first = f.recommendation.split("\n")[0]
    assert "30.00 GiB at the peak, 10.00 GiB of it outlives the step" in first and "1. bf16 autocast: frees about 10.00 GiB if the activations are fp32 today" in first
    assert "(the input does not record their dtype) (enough)" in first  # what the estimate rests on


def test_only_checkpointing_covers_a_large_gap():
    n = pressure(_oom(floor_gib=10, activations_gib=20, request_gib=14, free_gib=2)).evidence.numbers  # 12 GiB missing
    assert n["remedies"][0]["remedy"] == "activation checkpointing" and n["remedies"][0]["covers_need"]
    assert [r["covers_need"] for r in n["remedies"][1:]] == [False, False]


def test_bf16_already_on_is_not_offered():
    f = pressure(_oom(10, 20, 8, 2), {"autocast": [{"created_at": "train.py:40", "dtype": "torch.bfloat16"}]})
    assert "bf16 autocast" not in [r["remedy"] for r in f.evidence.numbers["remedies"]]
    assert "Already in half precision" in f.recommendation.split("\n")[0]


def test_when_the_floor_dominates_activation_remedies_are_not_enough():
    first = pressure(_oom(floor_gib=60, activations_gib=4, request_gib=8, free_gib=2)).recommendation.split("\n")[0]
    assert "Only 6 % of the peak comes and goes" in first and "FSDP" in first


def test_without_a_history_the_order_is_generic(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"capture": {"memory_stats": {"num_alloc_retries": 2, "num_ooms": 0,
                                                                          "allocated_bytes.all.peak": 30 * GiB}}}))
    find_rule("dataloader-stall").negative().write(d / "trace.json.gz")
    (r,) = analyze_paths([str(d)], jobs=1)
    f = next(f for f in r.findings if f.topic == "memory-pressure")
    assert "do not show how much" in f.recommendation and f.evidence.numbers["activations_gib"] is None

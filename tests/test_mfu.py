"""MFU and HFU (analyzer/measure/efficiency/utilization.py) on H100 traces with real kernel names (fixtures/gpt_flops.py:
a bf16 GPT step with flash or cuDNN attention, optionally every block checkpointed), against the FLOPs on
paper, and what every output says with it."""

from __future__ import annotations

import gzip
import json

import pytest

from gpuadvise.analyzer.model.devices import PRODUCTS
from gpuadvise.analyzer.report import markdown, text
from gpuadvise.analyzer.report.json import document
from gpuadvise.analyzer.run import analyze, resolve_inputs
from gpuadvise.fixtures import gpt_flops as tr

H100_BF16 = 989.4


def _analyzed(tmp_path, name: str, builder):
    path = builder.write(tmp_path / f"{name}.json.gz")
    return analyze(resolve_inputs([str(path)]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mfu")
    return {name: _analyzed(folder, name, tr.gpt_step(attention, checkpoint))
            for name, attention, checkpoint in (("flash", "flash", False), ("cudnn", "cudnn", False),
                                                ("checkpointed", "flash", True))}


@pytest.mark.parametrize("name", ["flash", "cudnn"])
def test_mfu_is_the_paper_flops_over_the_step_and_the_bf16_peak(runs, name):
    reports = runs[name]
    f = reports[0].figures.flops
    assert f.state == "counted" and f.coverage_pct == 100.0
    assert f.model_flops == pytest.approx(tr.model_flops(), rel=1e-9)
    assert f.hardware_flops == pytest.approx(tr.hardware_flops(), rel=1e-9)  # the backward's recomputed scores
    assert [(p.dtype, p.tflops) for p in f.peaks] == [("bf16", H100_BF16)] and f.device == "H100 SXM"
    assert f.step_ms == pytest.approx(reports[0].figures.median_step_ms)
    assert f.mfu_pct == pytest.approx(100 * tr.model_flops() / (f.step_ms / 1e3) / (H100_BF16 * 1e12), abs=0.01)
    # causal attention: what the kernels compute, and counted whole beside it
    attention = sum(c.flops for c in f.classes if c.family == "attention")
    assert attention == pytest.approx(tr.LAYERS * tr.CAUSAL * (tr.attention_whole() + tr.attention_whole(True)))
    assert sum(c.model_flops for c in f.classes) == pytest.approx(f.model_flops)
    assert f.whole_model_flops == pytest.approx(tr.model_flops(causal_whole=True))
    # the kernels' own rate: the fixture's GEMMs run at GEMM_TFLOPS
    matmuls = [c for c in f.classes if c.family == "matmul"]
    assert {c.phase for c in matmuls} == {"forward", "backward"}
    assert all(c.tflops == pytest.approx(tr.GEMM_TFLOPS, rel=1e-3) for c in matmuls)
    assert all(s.mfu_pct is not None for s in f.steps) and len(f.steps) == reports[0].figures.steps


def test_a_well_fed_gemm_bound_step_gets_its_mfu_and_no_finding(runs):
    reports = runs["flash"]
    assert not reports[0].findings
    f = reports[0].figures.flops
    out = " ".join(text.render(reports).split())
    assert out.count(f"MFU {f.mfu_pct:.1f} %") == 1 and "989.4 TFLOP/s (H100 SXM, dense bf16)" in out
    assert f"- **MFU:** {f.mfu_pct:.1f} % (HFU {f.hfu_pct:.1f} %): 1.34 TFLOP per step" in markdown.render(reports)
    assert "## FLOPs and MFU" in markdown.render(reports)
    doc = document(reports)
    assert doc["summary"]["mfu_pct"] == doc["traces"][0]["flops"]["mfu_pct"] == reports[0].figures.flops.mfu_pct


def test_recompute_is_hardware_flops_not_model_flops(runs):
    f = runs["checkpointed"][0].figures.flops
    assert f.model_flops == pytest.approx(tr.model_flops(), rel=1e-9)
    assert f.hardware_flops == pytest.approx(tr.hardware_flops() + tr.recompute_flops(), rel=1e-9)
    assert f.hfu_pct / f.mfu_pct == pytest.approx(f.hardware_flops / f.model_flops, rel=1e-3)
    assert sum(c.flops for c in f.classes if c.phase == "recompute") == pytest.approx(tr.recompute_flops())
    assert {c.phase for c in f.classes} == {"forward", "backward", "recompute"}
    assert "HFU" in text.render(runs["checkpointed"])


def test_a_run_folder_with_an_unprofiled_step_gets_the_mfu_over_it_too(tmp_path):
    b = tr.gpt_step(steps=3)
    b.facts = {"steps": {"unprofiled_median_ms": 2.5}}  # the profiler slowed the recorded steps
    reports = analyze(resolve_inputs([str(b.write_run_folder(tmp_path / "run"))]))
    f = reports[0].figures.flops
    assert f.unprofiled_step_ms == 2.5 and f.step_ms > 2.5
    assert f.unprofiled_mfu_pct == pytest.approx(100 * tr.model_flops() / 2.5e-3 / (H100_BF16 * 1e12), abs=0.01)
    assert f"{f.unprofiled_mfu_pct:.1f} % over the unprofiled 2.5 ms step" in " ".join(text.render(reports).split())


def test_without_shapes_the_report_says_what_is_missing_and_how_to_get_it(tmp_path):
    path = tr.gpt_step().write(tmp_path / "shaped.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for ev in doc["traceEvents"]:
        for key in ("Input Dims", "Input type", "Concrete Inputs"):
            ev.get("args", {}).pop(key, None)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc))
    reports = analyze(resolve_inputs([str(bare)]))
    f = reports[0].figures.flops
    assert f.state == "no shapes" and f.mfu_pct is None
    assert "record_shapes=True" in f.note and "gpuadvise profile" in f.note
    assert f.note in " ".join(text.render(reports).split())  # wrapped to the terminal's width


def test_ops_whose_kernels_cannot_be_linked_get_no_mfu(tmp_path):
    b = tr.gpt_step(steps=3)
    b.events = [e for e in b.events if e.get("cat") != "cuda_runtime"]  # no launch to link a kernel by
    f = _analyzed(tmp_path, "unlinked", b)[0].figures.flops
    assert f.state == "no kernels" and f.mfu_pct is None and "no kernel" in f.note


def test_a_matrix_kernel_without_shapes_makes_the_mfu_a_lower_bound(tmp_path):
    b = tr.gpt_step(steps=3)
    for ev in b.events:  # the fc layers' addmm lost its shapes (as a Triton template or a graph replay would)
        if ev["name"] == "aten::addmm" and ev["args"].get("Input Dims", [[]])[0] == [4 * tr.D_MODEL]:
            ev["args"].pop("Input Dims")
        if ev["name"] == "aten::linear" and ev["args"].get("Input Dims", [[]])[1] == [4 * tr.D_MODEL, tr.D_MODEL]:
            ev["args"].pop("Input Dims")
    reports = _analyzed(tmp_path, "partial", b)
    f = reports[0].figures.flops
    assert 0 < f.coverage_pct < 100 and f.uncounted == [tr.GEMM]
    assert f"MFU ≥ {f.mfu_pct:.1f} %" in text.render(reports) and "lower bound" in " ".join(text.render(reports).split())
    assert f.model_flops == pytest.approx(tr.model_flops() - tr.LAYERS * tr.linear_flops(tr.D_MODEL, 4 * tr.D_MODEL))


def test_a_jobs_mfu_is_every_ranks_flops_over_the_slowest_ranks_step(tmp_path):
    from gpuadvise.analyzer.model.summary import summarize
    from gpuadvise.fixtures.builder import RankFolder

    folder = RankFolder([tr.gpt_step(steps=3, rank=0, world_size=2),
                         tr.gpt_step(steps=3, rank=1, world_size=2, optimizer_us=2400)]).write(tmp_path / "job")
    summary = summarize(analyze(resolve_inputs([str(folder)])))
    ranks = [t.figures.flops for t in summary.traces]
    slowest = max(f.step_ms for f in ranks)
    assert ranks[0].step_ms < ranks[1].step_ms == slowest
    assert summary.figures.model_flops == pytest.approx(2 * tr.model_flops())
    assert summary.figures.mfu_pct == pytest.approx(100 * 2 * tr.model_flops() / (slowest / 1e3) / (2 * H100_BF16 * 1e12),
                                                    abs=0.01)
    assert summary.figures.mfu_pct == pytest.approx(ranks[1].mfu_pct, abs=0.01)
    assert summary.figures.mfu_pct < ranks[0].mfu_pct
    assert "2 ranks" in summary.figures.mfu_basis


def test_one_process_on_two_gpus_is_measured_against_both_peaks(tmp_path):
    """DataParallel: each replica's matmul on its own GPU; the step's FLOPs are both GPUs' and so is the peak."""
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder(device="NVIDIA H100 80GB HBM3", compute=(9, 0))
    dims = {"Input Dims": [[8192, 4096], [4096, 4096]], "Input type": ["c10::BFloat16"] * 2}
    flops = 2.0 * 8192 * 4096 * 4096
    for _ in range(3):
        with b.step():
            for gpu in (0, 1):
                with b.op("aten::mm", **dims):
                    b.kernel(tr.GEMM, flops / 660e6, device=gpu)
    f = _analyzed(tmp_path, "two-gpus", b)[0].figures.flops
    assert f.gpus == 2 and f.model_flops == pytest.approx(2 * flops)
    assert f.peak_tflops == pytest.approx(2 * H100_BF16)
    # step_ms is rounded to the µs: on a 0.4 ms step that is up to 0.2 %
    assert f.mfu_pct == pytest.approx(100 * 2 * flops / (f.step_ms / 1e3) / (2 * H100_BF16 * 1e12), rel=2e-3)


def test_every_listed_gpu_has_dense_peaks_for_its_matrix_dtypes():
    for _, spec in PRODUCTS:
        assert spec.dense_peak("fp32")[0], spec.product
        for dtype in ("tf32", "bf16", "fp16", "fp8"):
            peak, whose = spec.dense_peak(dtype)
            assert peak and whose in (dtype, "fp32"), (spec.product, dtype)
            assert (whose == dtype) == (spec.peak(dtype) is not None)
    h100 = next(s for _, s in PRODUCTS if s.product == "H100 SXM")
    assert (h100.dense_peak("bf16"), h100.dense_peak("tf32"), h100.dense_peak("fp32")) == \
        ((989.4, "bf16"), (494.7, "tf32"), (66.9, "fp32"))

"""A precision fix's predicted kernel time is bounded by the kernel's roofline on the device: large GEMMs
gain the peak ratio, skinny ones (M = 8) the operand widths' ratio, tiny ones nothing; without shapes
the prediction does not claim the peak ratio."""

from __future__ import annotations

import pytest

from gpuadvise.analyzer.measure.efficiency import roofline
from gpuadvise.analyzer.model.devices import spec
from gpuadvise.analyzer.model.trace import Device
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import TraceBuilder

A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
SGEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_ffma_kernel"


def row(device):
    name, (major, minor) = device
    return spec(Device(0, name, major, minor))


# ---- the roofline itself, by hand from the device table ------------------------------------------


@pytest.mark.parametrize("device", [A100, H100])
def test_a_large_gemm_gains_the_peak_ratio(device):
    r = row(device)
    mkn = (1, 8192, 8192, 8192)
    by_hand = (r.bf16 * 0.78) / (r.fp32 * 0.77)  # both compute-bound at the large-GEMM efficiencies
    assert roofline.attainable(mkn, r, "bf16").limiter == "compute"
    assert roofline.speedup(mkn, r, "bf16") == pytest.approx(by_hand, rel=1e-6)
    assert by_hand > 14


@pytest.mark.parametrize("device", [A100, H100])
def test_a_skinny_gemm_gains_only_the_operand_widths(device):
    # 8 tokens times a 4096×4096 weight: 0.27 GFLOP over 67 MB of fp32 operands (4 FLOP/byte): reading the
    # weight sets the time in fp32 and on the Tensor Cores alike, so bf16 halves it and TF32 changes nothing
    r = row(device)
    mkn = (1, 8, 4096, 4096)
    fp32_us = (8 * 4096 + 4096 * 4096 + 8 * 4096) * 4 / (r.memory_gbps * roofline.MEMORY_EFFICIENCY * 1e3)
    assert roofline.attainable(mkn, r, "fp32").us == pytest.approx(fp32_us, rel=1e-6)
    assert roofline.attainable(mkn, r, "bf16").limiter == "memory"
    assert roofline.speedup(mkn, r, "bf16") == pytest.approx(2.0, rel=1e-6)
    assert roofline.speedup(mkn, r, "tf32") == pytest.approx(1.0, rel=1e-6)
    # a kernel that ran at its fp32 bound: half the time in bf16, where the peak ratio would claim 1/16
    assert roofline.predicted_us(fp32_us, mkn, r, "bf16") == pytest.approx(fp32_us / 2, rel=1e-6)


@pytest.mark.parametrize("device", [A100, H100])
def test_a_tiny_gemm_is_bound_by_its_launch(device):
    r = row(device)
    mkn = (1, 16, 16, 16)
    assert roofline.bound(mkn, r, "bf16").limiter == "latency"
    assert roofline.predicted_us(6.0, mkn, r, "bf16") == pytest.approx(6.0)  # no faster than it was
    assert roofline.predicted_us(3.0, mkn, r, "bf16") == pytest.approx(3.0)  # already under the floor: as is


def test_a_kernel_far_below_its_bound_gains_its_bounds_ratio_not_the_peak_ratio():
    # the same skinny GEMM, 10× slower than its bound in fp32 ("0.0 TFLOP/s, 0 % of peak"): it stays as far
    # from its bound in bf16, and the bound halves
    r = row(A100)
    mkn = (1, 8, 4096, 4096)
    slow = 10 * roofline.attainable(mkn, r, "fp32").us
    assert roofline.predicted_us(slow, mkn, r, "bf16") == pytest.approx(slow / 2, rel=1e-6)
    assert slow / roofline.predicted_us(slow, mkn, r, "bf16") < roofline.peak_speedup(r, "bf16") / 5


def test_no_prediction_beats_the_hardware_bound():
    r = row(H100)
    for mkn in [(1, 8, 4096, 4096), (1, 64, 1024, 1024), (1, 2048, 2048, 2048), (1, 4096, 11008, 4096)]:
        hw = roofline.bound(mkn, r, "bf16").us
        for dur in (0.5 * hw, hw, 3 * hw, 100 * hw):  # even a time below the fp32 bound (a bad reading)
            assert roofline.predicted_us(dur, mkn, r, "bf16") >= min(dur, hw) - 1e-9


def test_without_shapes_the_assumption_is_the_operand_widths():
    assert roofline.unknown_shape_speedup("bf16") == 2.0
    assert roofline.unknown_shape_speedup("tf32") == 1.0
    assert roofline.unknown_shape_speedup("fp8") == 4.0


# ---- through no-tensor-cores, on fixtures with known shapes ----------------------------------------


def _gemm_steps(device, dims, us: float, n: int = 20, shapes: bool = True) -> TraceBuilder:
    """GPU-bound steps of n fp32 SIMT GEMMs of `us` each (an aten::mm of `dims`), nothing else."""
    name, compute = device
    b = TraceBuilder(device=name, compute=compute)
    args = {"Input Dims": [list(d) for d in dims], "Input type": ["float", "float"]} if shapes else {}
    for _ in range(4):
        with b.step():
            for _ in range(n):
                with b.op("aten::mm", **args):
                    b.kernel(SGEMM, us)
            b.sync()
    b.finish()
    return b


def finding(builder, load_built):
    report = analyze_model(load_built(builder))
    return next(f for f in report.findings if f.topic == "no-tensor-cores")


def left_of_gemm_time(f, fix: str) -> float:
    """The share of the step a fix leaves (the step is the GEMMs here)."""
    return 1 - f.evidence.numbers["saving_by_fix_pct"][fix] / 100


@pytest.mark.parametrize("device", [A100, H100])
def test_large_gemms_against_skinny_ones_on_the_matrix_units(load_built, device):
    r = row(device)
    large_us = 2 * 4096 ** 3 / (r.fp32 * 0.77 * 1e6)  # at 77 % of the fp32 peak
    large = finding(_gemm_steps(device, ((4096, 4096), (4096, 4096)), large_us), load_built)
    skinny_us = (8 * 4096 * 2 + 4096 * 4096) * 4 / (r.memory_gbps * roofline.MEMORY_EFFICIENCY * 1e3)  # its fp32 bound
    skinny = finding(_gemm_steps(device, ((8, 4096), (4096, 4096)), skinny_us), load_built)
    # large: the peak ratio; skinny: the bytes, half the time in bf16 and all of it with TF32
    assert left_of_gemm_time(large, "bf16") == pytest.approx((r.fp32 * 0.77) / (r.bf16 * 0.78), abs=0.01)
    assert left_of_gemm_time(skinny, "bf16") == pytest.approx(0.5, abs=0.02)
    assert left_of_gemm_time(skinny, "tf32") == pytest.approx(1.0, abs=0.02)
    roof = skinny.evidence.numbers["roofline_by_fix"]["bf16"]
    assert roof["limited_by_pct"]["memory"] == 100.0 and roof["speedup"] == 2.0
    assert "memory-bound" in skinny.impact.basis and "against the peak ratio" in skinny.impact.basis


def test_skinny_gemms_far_below_their_peak_are_not_promised_the_peak_ratio(load_built):
    # GEMMs with 8 tokens that reach 0.0 TFLOP/s (30× slower than reading their weight): bf16 halves them
    r = row(A100)
    slow_us = 30 * (8 * 4096 * 2 + 4096 * 4096) * 4 / (r.memory_gbps * roofline.MEMORY_EFFICIENCY * 1e3)
    f = finding(_gemm_steps(A100, ((8, 4096), (4096, 4096)), slow_us), load_built)
    assert f.evidence.numbers["simt_achieved_tflops"] < 0.5
    assert left_of_gemm_time(f, "bf16") == pytest.approx(0.5, abs=0.02)


def test_tiny_gemms_gain_nothing_from_tensor_cores(load_built):
    f = finding(_gemm_steps(H100, ((16, 16), (16, 16)), 6.0, n=200), load_built)
    assert f.evidence.numbers["saving_by_fix_pct"]["bf16"] < 1.0
    assert f.severity == "info"


def test_without_shapes_the_headline_does_not_claim_the_peak_ratio(load_built):
    r = row(H100)
    f = finding(_gemm_steps(H100, (), 800.0, shapes=False), load_built)
    by_fix = f.evidence.numbers["saving_by_fix_pct"]
    assert by_fix["bf16"] == pytest.approx(50.0, abs=2)  # memory-bound: half the bytes
    assert by_fix["tf32"] < 1.0
    top = 100 * (1 - (r.fp32 * 0.77) / (r.bf16 * 0.78))
    assert f.evidence.numbers["saving_range_by_fix_pct"]["bf16"][1] == pytest.approx(top, abs=1)  # the top: the peak ratio
    assert f.impact.range_pct[1] == pytest.approx(top, abs=1)
    assert "roofline is unknown" in f.impact.basis and "record_shapes" in f.impact.basis


def test_padding_a_skinny_misaligned_gemm_is_bounded_by_its_bytes(load_built):
    # bf16 GEMMs of 8 tokens through a 4095-wide layer on an H100, 200 µs each, nothing aligned to compare
    # with: at 75 % of the bf16 peak their FLOPs would take 0.4 µs, but reading the 33.5 MB weight takes
    # 12.5 µs at 80 % of 3350 GB/s; padding brings them to that, not to the 5 µs floor
    b = TraceBuilder(*H100)
    args = {"Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Dims": [[8, 4095], [4095, 4096]]}
    for _ in range(4):
        with b.step():
            for _ in range(20):
                with b.op("aten::mm", **args):
                    b.kernel("cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1", 200)
            b.sync()
    b.finish()
    report = analyze_model(load_built(b))
    f = next(f for f in report.findings if f.topic == "matmul-alignment")
    bytes_ = (8 * 4095 + 4095 * 4096 + 8 * 4096) * 2
    bound_us = bytes_ / (3350 * roofline.MEMORY_EFFICIENCY * 1e3)
    assert f.impact.est_step_saving_pct == pytest.approx(100 * (1 - bound_us / 200), abs=1.0)

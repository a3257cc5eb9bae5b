"""cudnn-benchmark: `torch.backends.cudnn.benchmark` is off while convolutions with fixed shapes take a real share of the step.

## What it detects
A run whose run.json records `cudnn.benchmark = False` (as the profiled window ended), whose convolution
kernels (launched by `aten::cudnn_convolution` / `aten::convolution_backward`) cover at least 10 % of the
step time, and whose convolution input shapes are the same in every profiled step (`record_shapes`, on
by default in `gpuadvise profile`; when shapes were not recorded the finding says so).

## Why it matters
Without benchmark mode cuDNN picks each convolution's algorithm from a heuristic. With it, the first call
of every new input shape times the candidate algorithms and keeps the fastest, which pays off when the
shapes repeat. How much it pays varies: measured on an H100 (torch 2.11, cuDNN 9.19), a small bf16 convnet
got 6.4 % faster, and ResNet-50 nothing, because cuDNN 9's heuristics already pick its best kernels. The
gain is large where the heuristic falls back to a generic, non-Tensor-Core kernel (the H100 convnet's
first layer, 3 input channels: a `convolve_common_engine` kernel that the autotuner replaced with one
twice as fast).

## Fix
```python
torch.backends.cudnn.benchmark = True  # once, before the first forward pass
```
Leave it off when input shapes change from batch to batch (variable image sizes or sequence lengths):
every new shape is benchmarked again. With `torch.backends.cudnn.deterministic = True` the autotuner only
considers deterministic algorithms.

## Thresholds
Convolution kernels ≥ 10 % of the median step (the median step's convolution time over it), `cudnn_benchmark` recorded False, and the same
multiset of convolution input shapes in every step (silent when they vary). The saving is predicted only
for what the trace shows the heuristic got wrong: convolution kernels without Tensor Cores on a GPU that
has them, replayed at half their time (the H100 convnet's generic kernel was replaced by one 2.05× as
fast; on that pair the rule predicts 3.2 %, the measured saving was 6.4 %: conservative). Otherwise the
predicted saving is 0 and the severity low: the trace cannot tell whether the autotuner would find
anything faster.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.kernels import CONV, is_matmul_like, precision_class
from gpuadvise.analyzer.model.trace import name_mask
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.runjson import run_json

from .base import Rule

SHAPE_OPS = ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::miopen_convolution")
GENERIC = "void convolve_common_engine_float_NHWC<float, float, 128, 5, 5, 3, 3, 3, true, false, false, false, false>"
FPROP = "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel_cudnn"
WGRAD = "sm80_xmma_wgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_warpsize2x2x1_g1_tensor16x8x8_kernel_cudnn"


def _is_conv_op(name: str) -> bool:
    return "convolution" in name or name.startswith("aten::conv")


class CudnnBenchmark(Rule):
    code = "GA141"
    name = "cudnn-benchmark"
    title = "cudnn.benchmark is off while fixed-shape convolutions take a real share of the step"
    thresholds = {"min_conv_pct_of_step": 10.0, "generic_kernel_speedup": 2.0}
    fix_facts = ("settings.cudnn_benchmark",)

    def check(self, a: Analysis):
        if runfacts.flag(a.facts, "cudnn_benchmark") is not False:
            return []  # on, or not recorded: a plain trace does not say
        m, model = a.metrics, a.model
        k = model.kernels
        if k.empty or m.per_step.empty:
            return []
        conv = _conv_kernels(model)
        if conv.empty:
            return []
        ps = m.per_step
        lo, hi = ps["start_us"].to_numpy(), ps["start_us"].to_numpy() + ps["dur_us"].to_numpy()
        conv_us = iv.covered(*iv.union(conv["ts"], conv["end"]), lo, hi)
        pct = 100.0 * perstep.median(conv_us) / max(m.median_step_us, 1e-9)  # the median step's share (perstep)
        if pct < self.thresholds["min_conv_pct_of_step"]:
            return []
        fixed, shapes = _fixed_shapes(model, m)
        if fixed is False:
            return []  # shapes change between steps: benchmark mode would re-tune every new one

        generic = conv[name_mask(conv["name"], lambda n: is_matmul_like(n) and precision_class(n) != "tensor-core")] \
            if a.matrix_units else conv.iloc[0:0]
        saving, basis = 0.0, ("not predicted: cuDNN's heuristic already picks Tensor Core kernels for these "
                              "convolutions, and the trace cannot tell whether the autotuner would find faster ones "
                              "(measured on an H100: +6.4 % for a small convnet, nothing for ResNet-50 with cuDNN 9)")
        if len(generic):
            gen_corr = set(generic["correlation"])
            factor = 1.0 / self.thresholds["generic_kernel_speedup"]
            predicted, how = a.predicted_saving(Scenario(
                f"generic convolution kernels {self.thresholds['generic_kernel_speedup']:g}× faster (autotuned)",
                gpu_scale=lambda ops: np.where(ops["correlation"].isin(gen_corr), factor, 1.0)))
            if predicted is not None:
                saving, basis = predicted, how
        shape_note = {True: f"the same {shapes} convolution input shapes in every step",
                      None: "input shapes were not recorded (run with record_shapes), so whether they are fixed is unknown"}[fixed]
        conv_ms = perstep.median(conv_us) / 1e3  # conv_us is per step already: the report's statistic (perstep)
        conv_n = perstep.median(perstep.sums(m, conv["ts"]))
        message = (f"cudnn.benchmark was off; convolution kernels took {pct:.1f} % of {perstep.the_median_step(m)} "
                   f"({perstep.a_median(m)}{conv_ms:.2f} ms and {perstep.count_of(conv_n, 'kernel')} per step), with {shape_note}.")
        if len(generic):
            generic_ms = perstep.median(perstep.sums(m, generic["ts"], generic["dur"])) / 1e3
            generic_n = perstep.median(perstep.sums(m, generic["ts"]))
            message += (f" {perstep.a_median(m).capitalize()}{perstep.count_text(generic_n)} of them per step ({generic_ms:.2f} ms) are generic "
                        "kernels without Tensor Cores, which the autotuner can replace.")
        by_name = conv.groupby("name", observed=True)["dur"].agg(["size", "sum"]).sort_values("sum", ascending=False)
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            items=[{"name": str(n), "count": int(r["size"]), "total_ms": round(float(r["sum"]) / 1e3, 3),
                    "tensor_cores": precision_class(str(n)) == "tensor-core"} for n, r in by_name.head(6).iterrows()],
            numbers={"conv_pct_of_step": round(float(pct), 1), "conv_ms_per_step": round(conv_ms, 3),
                     "conv_kernels_per_step": round(conv_n, 1), "statistic": "median step",
                     "fixed_shapes": fixed, "distinct_conv_shapes": shapes,
                     "generic_kernels": int(len(generic)), "generic_ms": round(float(generic["dur"].sum()) / 1e3, 3),
                     "cudnn_benchmark": False},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis,
                             severity=None if len(generic) else "low",
                             advice="Turn cudnn.benchmark on before the first forward pass.")]

    def positive(self) -> TraceBuilder:
        b = _convnet(generic=True)
        b.facts = run_json(settings={"cudnn_benchmark": False})
        return b

    def negative(self) -> TraceBuilder:
        b = _convnet(generic=True)  # the same convnet with benchmark mode already on
        b.facts = run_json(settings={"cudnn_benchmark": True})
        return b


def _conv_kernels(model):
    """Kernels launched by convolution ops (by External id), else those named like convolutions."""
    k, cpu = model.kernels, model.cpu
    ops = cpu[name_mask(cpu["name"], _is_conv_op)] if len(cpu) else cpu
    ext = ops["external_id"][ops["external_id"] > 0] if len(ops) else []
    by_op = k[k["external_id"].isin(ext)] if len(ext) else k.iloc[0:0]
    if len(by_op):
        return by_op
    return k[name_mask(k["name"], lambda n: is_matmul_like(n) and bool(CONV.search(n)))]


def _fixed_shapes(model, m) -> tuple[bool | None, int]:
    """(True, n): every step ran the same n convolution input shapes; False: they vary; None: not recorded."""
    cpu = model.cpu
    ops = None
    for name in SHAPE_OPS:  # the outermost conv op a trace has: one per convolution call
        hit = cpu[cpu["name"] == name] if len(cpu) else cpu
        if len(hit):
            ops = hit
            break
    if ops is None:
        return None, 0
    dims = ops["input_dims"].astype(str).to_numpy()
    recorded = (dims != "") & (dims != "null") & (dims != "nan")
    if not recorded.any():
        return None, 0
    if not m.steps:
        return None, int(len(set(dims)))
    starts = np.array([s.start for s in m.steps])
    ends = np.array([s.end for s in m.steps])
    ts = ops["ts"].to_numpy()
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts < ends[np.clip(k, 0, None)])
    per_step = [tuple(sorted(dims[inside & (k == i)])) for i in range(len(m.steps))]
    per_step = [p for p in per_step if p]
    if not per_step:
        return None, 0
    return all(p == per_step[0] for p in per_step), len(set(per_step[0]))


def _convnet(generic: bool, shapes=None) -> TraceBuilder:
    """Three conv layers per step (forward + backward) and a little other work; `shapes` per step (fixed by default)."""
    b = TraceBuilder()
    for step in range(4):
        with b.step():
            b.idle(300)
            size = (shapes or [160] * 4)[step]
            for layer, ch in enumerate((3, 48, 96)):
                dims = [[64, ch, size, size], [48, ch, 3, 3], [48], [], [], [], [], [], []]
                with b.op("aten::convolution", **{"Input Dims": dims}):
                    with b.op("aten::cudnn_convolution", **{"Input Dims": dims[:2]}):
                        b.kernel(GENERIC if (generic and layer == 0) else FPROP, 900 if (generic and layer == 0) else 400)
            b.kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 300)
            for _ in range(3):
                with b.op("aten::convolution_backward"):
                    b.kernel(WGRAD, 500)
            b.sync()
    b.finish()
    return b


RULE = CudnnBenchmark()

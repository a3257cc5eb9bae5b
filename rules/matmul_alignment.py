"""matmul-alignment: fp16/bf16 matrix multiplies with dimensions that are not multiples of 8.

## What it detects
`aten::mm`, `addmm`, `bmm`, `baddbmm`, `matmul` and `linear` ops whose inputs are half or bfloat16 and
where one of the last two dimensions of an input is not a multiple of 8 (from the shapes recorded
with `record_shapes=True`).

## Why it matters
Tensor Cores work on tiles of 8 (fp16/bf16) elements; cuBLAS picks its fastest kernels only when the
matrix dimensions are aligned. An odd vocabulary size, hidden size or batch size makes it fall back
to slower kernels: on an H100, 4095³ bf16 GEMMs ran in an sm75-era `align1` CUTLASS kernel at about
140 TFLOP/s, while 4096³ ones ran at about 790 (5.7× faster, step 68 % shorter).

## Fix
```python
# pad the dimension that is off: vocabulary, hidden size, or the number of classes
vocab = math.ceil(len(tokenizer) / 64) * 64          # e.g. 50257 → 50304, as nanoGPT does
head = torch.nn.Linear(hidden, vocab, bias=False)
# and keep batch × sequence length a multiple of 8
```

## Thresholds
Multiple of 8 (the PyTorch profiler's anti-pattern matcher uses 8). Fires when misaligned ops launch
at least 1 % of GPU kernel time and the replay predicts at least 0.5 % saving. The replay gives each
misaligned op's kernels the time an aligned GEMM of the same FLOPs takes (2·M·K·N from the recorded
shapes, never more than now): at the throughput aligned half-precision GEMMs of a similar size
(¼–4× the FLOPs, at least 3 of them) reach in the same trace, or, when there are none, at 75 % of the
device's dense bf16/fp16 peak (large cuBLAS GEMMs reach 70–85 % of it), with 50–85 % as the range;
never faster than the op's roofline (its operands' bytes over the memory bandwidth, its launch:
analyzer/measure/efficiency/roofline.py). Kernels stay no faster than 5 µs.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.efficiency import roofline
from gpuadvise.analyzer.measure.efficiency.gemm import gemm_ops, kernels_by_op, matmul_mkn, parse_dims
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

MULTIPLE = 8


class MatmulAlignment(Rule):
    code = "GA110"
    name = "matmul-alignment"
    title = "fp16/bf16 matmuls with dimensions not multiple of 8"
    thresholds = {"multiple": MULTIPLE, "min_kernel_share_pct": 1.0, "min_saving_pct": 0.5,
                  "peak_fraction": 0.75, "peak_fraction_range": (0.5, 0.85), "min_reference_ops": 3,
                  "reference_flops_ratio": 4.0, "min_kernel_us": 5.0}

    def check(self, a: Analysis):
        t = self.thresholds
        ops = gemm_ops(a.model)
        if ops.empty:
            return []
        half = ops[ops["half"].astype(bool)]
        bad = half[half["odd"].map(bool)]
        if bad.empty:
            return []
        k = kernels_by_op(a.model)
        k_bad = k[k["op_external_id"].isin(set(bad["external_id"]) - {-1, 0})]
        # of the kernel time the trace can tie to a launch (not what earlier steps left queued)
        share = 100 * k_bad["dur"].sum() / max(k["dur"].sum(), 1e-9)
        if share < t["min_kernel_share_pct"]:
            return []
        # the ops that launched kernels themselves (aten::mm/addmm; not the aten::linear around them)
        launching = bad[bad["kernel_us"] > 0]
        rate, where, span = self._aligned_rate(a, half, launching)
        if rate is None:
            return []
        floor = t["min_kernel_us"]
        # never faster than the op's roofline on this GPU: moving its operands, its launch (measure/efficiency/roofline.py)
        spec, dtype = a.device_spec, ("bf16" if a.device_spec.bf16 else "fp16")
        bound_us = np.array([_bound_us(n, d, spec, dtype) for n, d in zip(launching["name"], launching["dims"])])

        def aligned_time(rate):
            # per op: its kernels shrink together to the aligned op's time (FLOPs / rate), never growing
            factor = (np.maximum(launching["flops"] / rate, bound_us) / launching["kernel_us"]).clip(upper=1.0)
            per_op = dict(zip(launching["external_id"], factor.fillna(1.0)))
            corr_factor = dict(zip(k_bad["correlation"], k_bad["op_external_id"].map(per_op).fillna(1.0)))

            def new_dur(o):
                f = o["correlation"].map(corr_factor).to_numpy(dtype=float)
                dur = o["dur"].to_numpy(dtype=float)
                return np.where(np.isfinite(f), np.maximum(dur * f, np.minimum(dur, floor)), np.nan)
            return new_dur

        saving, basis = a.predicted_saving(Scenario(
            f"misaligned matmul kernels at the aligned GEMM throughput ({rate / 1e6:.0f} TFLOP/s)", gpu_time=aligned_time(rate)))
        if saving is None:
            saving, basis = 0.0, "not predicted: no GPU timeline"
        elif saving < t["min_saving_pct"]:
            return []  # those kernels hide behind other work (or already run fast): padding would not shorten the step
        achieved = float(launching["flops"].sum() / max(launching["kernel_us"].sum(), 1e-9))
        basis += f"; the misaligned GEMMs run at {achieved / 1e6:.0f} TFLOP/s, aligned ones {where}"
        bounds = None
        if span is not None:
            ends = [a.predicted_saving(Scenario("bound", gpu_time=aligned_time(r)))[0] for r in span]
            bounds = tuple(e for e in ends if e is not None)
            if len(bounds) == 2:
                basis += f"; {bounds[0]:.0f}–{bounds[1]:.0f} % for aligned GEMMs at {span[0] / 1e6:.0f}–{span[1] / 1e6:.0f} TFLOP/s"
            else:
                bounds = None
        shapes = bad.groupby(["name", "dims"]).size()
        items = [{"name": n, "input_dims": d, "count": int(c)} for (n, d), c in shapes.sort_values(ascending=False).head(8).items()]
        odd = sorted({d for ds in bad["odd"] for d in ds})[:8]
        message = (f"{len(bad)} half-precision matmuls have dimensions that are not multiples of 8 ({', '.join(map(str, odd))}); "
                   f"their kernels take {share:.1f}% of GPU kernel time and reach {achieved / 1e6:.0f} TFLOP/s, "
                   f"where aligned GEMMs {where}.")
        evidence = Evidence(items=items, numbers={"misaligned_ops": int(len(bad)), "kernel_share_pct": round(share, 1),
                                                  "odd_dimensions": odd, "misaligned_tflops": round(achieved / 1e6, 1),
                                                  "aligned_tflops": round(rate / 1e6, 1)})
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, range_pct=bounds,
                             advice="Pad the odd dimensions to a multiple of 8 (64 is better for vocabularies).")]

    def _aligned_rate(self, a: Analysis, half: pd.DataFrame, launching: pd.DataFrame):
        """(FLOP/µs an aligned GEMM of this size reaches, where that figure comes from, (low, high) or None)."""
        t = self.thresholds
        size = float(launching["flops"].median()) if len(launching) else float("nan")
        if not np.isfinite(size) or size <= 0:
            return None, "", None
        ref = half[~half["odd"].map(bool) & (half["kernel_us"] > 0) & np.isfinite(half["flops"])]
        r = t["reference_flops_ratio"]
        ref = ref[(ref["flops"] >= size / r) & (ref["flops"] <= size * r)]
        if len(ref) >= t["min_reference_ops"]:
            rate = float(ref["flops"].sum() / ref["kernel_us"].sum())
            return rate, f"of a similar size reach {rate / 1e6:.0f} TFLOP/s in this trace ({len(ref)} ops)", None
        peak = a.device_spec.half_peak
        if peak is None:
            return None, "", None
        lo, hi = t["peak_fraction_range"]
        rate = peak * 1e6 * t["peak_fraction"]
        where = (f"reach about {rate / 1e6:.0f} TFLOP/s ({t['peak_fraction']:.0%} of the device's dense half-precision "
                 f"peak, {peak:.0f} TFLOP/s; none of a similar size is in this trace)")
        return rate, where, (peak * 1e6 * lo, peak * 1e6 * hi)

    def positive(self) -> TraceBuilder:
        # an odd inner dimension: cuBLAS falls back to an align1 kernel at ~90 TFLOP/s on an A100
        return _loop("[[4096, 4095], [4095, 4096]]", "cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1", 1_500)

    def negative(self) -> TraceBuilder:
        return _loop("[[4096, 4096], [4096, 4096]]", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 600)


def _loop(dims: str, kernel: str, us: float) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(10):
                with b.op("aten::mm", **{"Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Dims": json.loads(dims)}):
                    b.kernel(kernel, us)
            b.sync()
    b.finish()
    return b


RULE = MatmulAlignment()


def _bound_us(name: str, dims: str, spec, dtype: str) -> float:
    """The attainable roofline of one matmul op in 16 bits (µs; 0 when its shape or the device is unknown)."""
    b = roofline.attainable(matmul_mkn(name, parse_dims(dims)), spec, dtype)
    return b.us if b is not None else 0.0

"""no-tensor-cores: matmul and convolution time spent in fp32 SIMT kernels on a GPU with Tensor Cores.

## What it detects
GEMM and convolution kernels whose names show plain fp32 arithmetic (`sgemm`, `scudnn`, CUTLASS
`simt`, cuDNN `<float>` engines, Tensile `_SB_`) on a GPU that has Tensor Cores (NVIDIA compute
capability 7.0+) or matrix cores (AMD Instinct). Kernels with TF32 (`tensorop`, `s1688`, `xmma`,
`tf32`), fp16/bf16 (`hmma`, `16816`, `bf16`), `nvjet`, `wgmma`/`gmma`, FP8 or MFMA in their names use
them. The architecture decides the advice: TF32 exists from Ampere (8.0) on; Volta and Turing need
fp16. GPUs without matrix units (Pascal and older) are never told to use them.

## Why it matters
Tensor Cores run matrix math many times faster than the fp32 SIMT pipeline: dense bf16 on an H100 is
989 TFLOP/s against 67 TFLOP/s of fp32 (14.8×), TF32 495 (7.4×); on an A100 16× and 8×. When matmuls
and convolutions dominate GPU time, leaving them on SIMT leaves most of the GPU unused.

## Fix
```python
# Any Tensor Core GPU: automatic mixed precision (bf16 from Ampere on; fp16 + GradScaler on V100/T4)
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = model(x).loss
# Ampere and newer, one line, no other change: TF32 for fp32 matmuls/convs (about half of AMP's gain)
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.allow_tf32 = True
```
With fp16 use `torch.amp.GradScaler("cuda")` and keep matrix dimensions multiples of 8.

## Thresholds
Fires when fp32 SIMT kernels take at least 50 % of GEMM/conv time and GEMM/conv kernels take at least
10 % of kernel time. The saving is predicted by replaying the steps with each of those kernels as fast
as the device's matrix units run it: its time divided by the dense peak ratio of the precision the fix
uses (bf16/fp16 or TF32 Tensor Cores vs fp32 CUDA cores, from the device's compute capability: see
`kernels.matrix_speedup`), never below 5 µs (a short kernel is bound by its launch and memory, not its
math). Large GEMMs reach the same fraction of either peak, so the ratio is their speedup; the replay
caps the step's gain by whatever else is on its critical path. The headline is AMP (the recommended
fix); the range spans TF32 to AMP. Without the device's compute capability, the kernels are taken as
2× faster (a floor any Tensor Core GPU clears) and the finding says so. Under 1 % predicted (the
matmuls hide behind CPU work) the finding is informational.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.kernels import matrix_speedup
from gpuadvise.analyzer.model.trace import names_in
from gpuadvise.analyzer.measure.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class NoTensorCores(Rule):
    code = "GA106"
    name = "no-tensor-cores"
    title = "Matmuls and convolutions run without Tensor Cores"
    thresholds = {"min_simt_share_pct": 50.0, "min_matmul_share_pct": 10.0, "fallback_speedup": 2.0,
                  "min_kernel_us": 5.0, "min_saving_pct": 1.0}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        kt = m.kernels
        if kt.empty or a.matrix_units is not True:
            return []
        mm = kt[kt["matmul"].astype(bool)]
        mm_us = float(mm["total_us"].sum())
        all_us = float(kt["total_us"].sum())
        simt = mm[mm["precision"] == "fp32-simt"]
        simt_us = float(simt["total_us"].sum())
        if mm_us <= 0 or 100 * simt_us / mm_us < t["min_simt_share_pct"] or 100 * mm_us / all_us < t["min_matmul_share_pct"]:
            return []
        names = set(simt["name"])
        dev = a.device
        cc = (dev.compute_major, dev.compute_minor) if dev and dev.compute_major is not None else None
        dev_name = dev.name if dev and dev.name else "this GPU"
        ratios = matrix_speedup(dev, a.model.meta.platform)
        # the recommended fix (AMP in the 16-bit type the GPU has) and the one-line alternative (TF32)
        amp = "bf16" if "bf16" in ratios else "fp16" if "fp16" in ratios else None
        options = [(k, ratios[k]) for k in (amp, "tf32") if k in ratios]
        if not options:
            options = [("assumed", t["fallback_speedup"])]
        floor = t["min_kernel_us"]
        savings = {}
        for key, ratio in options:
            def faster(ops, ratio=ratio):
                on = names_in(ops["name"], names)
                dur = ops["dur"].to_numpy(dtype=float)
                return np.where(on, np.maximum(dur / ratio, np.minimum(dur, floor)), np.nan)
            savings[key] = a.predicted_saving(Scenario(f"fp32 SIMT matmul/conv kernels {ratio:g}× faster", gpu_time=faster))
        head_key = options[0][0]
        saving, basis = savings[head_key]
        if saving is None:
            saving, basis = 0.0, "no replay possible"
        arch = f"sm {cc[0]}.{cc[1]}" if cc else "unknown architecture"
        label = {"bf16": "bf16 autocast", "fp16": "fp16 autocast", "tf32": "TF32", "assumed": "Tensor Cores"}
        parts = [f"{label[k]}: {r:g}× ({savings[k][0]:.1f} %)" for k, r in options if savings[k][0] is not None]
        if head_key == "assumed":
            basis += (f"; {dev_name}'s compute capability is not in the trace, so the Tensor Core speedup is "
                      f"assumed {t['fallback_speedup']:g}× (real ones are larger)")
        else:
            basis += (f"; speedups from {dev_name} ({arch}) dense matrix-unit vs fp32 peak throughput, each kernel "
                      f"no faster than {floor:g} µs: " + ", ".join(parts))
        values = [v for v, _ in savings.values() if v is not None]
        span = (min(values), max(values)) if len(values) > 1 else None
        if dev and dev.vendor == "amd":
            advice = f"{dev_name} has matrix cores: run matmuls in bf16 with `torch.autocast`."
        elif amp == "bf16":
            tf32 = savings.get("tf32", (None, ""))[0]
            advice = (f"Run the forward pass under `torch.autocast('cuda', dtype=torch.bfloat16)` ({saving:.0f} % of the step)."
                      + (f" If you cannot change precision that far, TF32 is one line, "
                         f"`torch.set_float32_matmul_precision('high')`, and saves about {tf32:.0f} %."
                         if tf32 is not None and round(tf32) > 0 else
                         " TF32 alone would not shorten the step measurably: bf16 halves the bytes as well."
                         if tf32 is not None else ""))
        else:
            advice = (f"{dev_name}{f' ({arch})' if cc else ''} has fp16 Tensor Cores but no TF32: "
                      "use AMP with fp16 (`torch.autocast('cuda', dtype=torch.float16)` and a GradScaler).")
        recorded = runfacts.settings(a.facts)
        if runfacts.flag(a.facts, "matmul_allow_tf32") is False and "tf32" in ratios:
            advice += " The run had TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`)."
        message = (f"{100 * simt_us / mm_us:.0f}% of matmul/convolution time ({simt_us / 1e3:.1f} ms, "
                   f"{100 * simt_us / all_us:.0f}% of all kernel time) runs in fp32 SIMT kernels that do not use "
                   f"the Tensor Cores {dev_name} has.")
        evidence = Evidence(
            items=[{"name": r.name, "count": int(r.count), "total_ms": a.ms(r.total_us), "share_pct": round(r.share_pct, 1)}
                   for r in simt.head(8).itertuples()],
            numbers={"simt_share_of_matmul_pct": round(100 * simt_us / mm_us, 1),
                     "matmul_share_of_kernels_pct": round(100 * mm_us / all_us, 1),
                     "tensor_core_matmul_ms": a.ms(mm_us - simt_us), "simt_matmul_ms": a.ms(simt_us),
                     "speedups": {k: r for k, r in options},
                     "saving_by_fix_pct": {k: round(v, 1) for k, (v, _) in savings.items() if v is not None},
                     "recorded_settings": {k: recorded[k] for k in ("matmul_allow_tf32", "cudnn_allow_tf32",
                                                                    "float32_matmul_precision") if k in recorded}},
        )
        severity = None
        if saving < t["min_saving_pct"]:
            # true, but the matmuls hide behind other work today: faster ones would not shorten the step, so
            # the fix is not advertised with its near-zero figure; the reason is given instead
            severity = "info"
            message += f" Tensor Cores would not shorten the step yet: {a.bound_by()}."
            advice = ("Not worth changing for step time until the step is bound by these kernels "
                      f"({a.bound_by()}). Once it is, bf16 autocast or TF32 "
                      "(`torch.set_float32_matmul_precision('high')`) moves them onto the Tensor Cores.")
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             range_pct=span, severity=severity)]

    def positive(self) -> TraceBuilder:
        return _loop("NVIDIA A100-SXM4-80GB", (8, 0), "ampere_sgemm_128x64_nn")

    def negative(self) -> TraceBuilder:
        # the same work on a Pascal GPU: no Tensor Cores to use
        return _loop("Tesla P100-PCIE-16GB", (6, 0), "maxwell_sgemm_128x64_nn")


def _loop(device: str, compute: tuple[int, int], gemm: str) -> TraceBuilder:
    b = TraceBuilder(device=device, compute=compute)
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel(gemm, 800)
                b.kernel("void at::native::vectorized_elementwise_kernel<4, relu>", 40)
            b.sync()
    b.finish()
    return b


RULE = NoTensorCores()

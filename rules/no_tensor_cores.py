"""no-tensor-cores: matmul and convolution time spent in fp32 SIMT kernels on a GPU with Tensor Cores.

## What it detects
GEMM and convolution kernels whose names show plain fp32 arithmetic (`sgemm`, `scudnn`, CUTLASS
`simt`, cuDNN `<float>` engines, Tensile `_SB_`) on a GPU that has Tensor Cores (NVIDIA compute
capability 7.0+) or matrix cores (AMD Instinct). Kernels with TF32 (`tensorop`, `s1688`, `xmma`,
`tf32`), fp16/bf16 (`hmma`, `16816`, `bf16`), `nvjet`, `wgmma`/`gmma`, FP8 or MFMA in their names use
them. The architecture decides the advice: TF32 exists from Ampere (8.0) on; Volta and Turing need
fp16. GPUs without matrix units (Pascal and older) are never told to use them.

## Why it matters
Tensor Cores run matrix math 8–16× faster than the fp32 SIMT pipeline (A100: 156 TFLOP/s TF32 vs
19.5 TFLOP/s fp32). When matmuls and convolutions dominate GPU time, leaving them on SIMT leaves most
of the GPU unused.

## Fix
```python
# Ampere and newer: TF32 for fp32 matmuls/convs (tiny precision change, no code change elsewhere)
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.allow_tf32 = True
# Any Tensor Core GPU: automatic mixed precision
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):   # fp16 + GradScaler on V100/T4
    loss = model(x).loss
```
With fp16 use `torch.amp.GradScaler("cuda")` and keep matrix dimensions multiples of 8.

## Thresholds
Fires when fp32 SIMT kernels take at least 50 % of GEMM/conv time and GEMM/conv kernels take at least
10 % of kernel time. The saving is predicted by replaying the steps with those kernels 2× faster,
a conservative figure for TF32/AMP (most real speedups are larger).
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.trace import names_in
from gpuadvise.analyzer.measure.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class NoTensorCores(Rule):
    code = "GA106"
    name = "no-tensor-cores"
    topic = "no-tensor-cores"
    title = "Matmuls and convolutions run without Tensor Cores"
    thresholds = {"min_simt_share_pct": 50.0, "min_matmul_share_pct": 10.0, "assumed_speedup": 2.0}

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
        factor = 1.0 / t["assumed_speedup"]
        saving, basis = a.predicted_saving(Scenario(
            f"fp32 SIMT matmul/conv kernels {t['assumed_speedup']:.0f}× faster",
            gpu_scale=lambda ops: np.where(names_in(ops["name"], names), factor, 1.0)))
        if saving is None:
            saving, basis = 0.0, "no replay possible"
        dev = a.device
        cc = (dev.compute_major, dev.compute_minor) if dev and dev.compute_major is not None else None
        dev_name = dev.name if dev and dev.name else "this GPU"
        if dev and dev.vendor == "amd":
            advice = f"{dev_name} has matrix cores: run matmuls in bf16/fp16 with `torch.autocast`."
        elif cc and cc[0] >= 8:
            advice = (f"{dev_name} (sm {cc[0]}.{cc[1]}) supports TF32: one line, "
                      "`torch.set_float32_matmul_precision('high')`, moves fp32 matmuls onto Tensor Cores; AMP (bf16) goes further.")
        else:
            advice = (f"{dev_name}{f' (sm {cc[0]}.{cc[1]})' if cc else ''} has fp16 Tensor Cores but no TF32: "
                      "use AMP with fp16 (`torch.autocast('cuda', dtype=torch.float16)` and a GradScaler).")
        message = (f"{100 * simt_us / mm_us:.0f}% of matmul/convolution time ({simt_us / 1e3:.1f} ms, "
                   f"{100 * simt_us / all_us:.0f}% of all kernel time) runs in fp32 SIMT kernels that do not use "
                   f"the Tensor Cores {dev_name} has.")
        evidence = Evidence(
            items=[{"name": r.name, "count": int(r.count), "total_ms": a.ms(r.total_us), "share_pct": round(r.share_pct, 1)}
                   for r in simt.head(8).itertuples()],
            numbers={"simt_share_of_matmul_pct": round(100 * simt_us / mm_us, 1),
                     "matmul_share_of_kernels_pct": round(100 * mm_us / all_us, 1),
                     "tensor_core_matmul_ms": a.ms(mm_us - simt_us), "simt_matmul_ms": a.ms(simt_us)},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)]

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

"""matmul-alignment: fp16/bf16 matrix multiplies with dimensions that are not multiples of 8.

## What it detects
`aten::mm`, `addmm`, `bmm`, `baddbmm`, `matmul` and `linear` ops whose inputs are half or bfloat16 and
where one of the last two dimensions of an input is not a multiple of 8 (from the shapes recorded
with `record_shapes=True`).

## Why it matters
Tensor Cores work on tiles of 8 (fp16/bf16) elements; cuBLAS picks its fastest kernels only when the
matrix dimensions are aligned. An odd vocabulary size, hidden size or batch size makes it fall back
to slower, partly unvectorised kernels — NVIDIA's performance guide shows aligned GEMMs running up to
several times faster.

## Fix
```python
# pad the dimension that is off: vocabulary, hidden size, or the number of classes
vocab = math.ceil(len(tokenizer) / 64) * 64          # e.g. 50257 → 50304, as nanoGPT does
head = torch.nn.Linear(hidden, vocab, bias=False)
# and keep batch × sequence length a multiple of 8
```

## Thresholds
Multiple of 8 (the PyTorch profiler's anti-pattern matcher uses 8). Fires when misaligned ops launch
at least 1 % of GPU kernel time and the replay, with those ops' kernels 1.3× faster (a conservative
assumption for aligned shapes), predicts at least 0.5 % saving.
"""

from __future__ import annotations

import json

import numpy as np

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.trace import names_in
from gpuadvise.analyzer.measure.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
HALF = ("Half", "BFloat16", "half", "bfloat16")


def misaligned(dims_text: str) -> list[int]:
    """The last-two dimensions of any input that are not multiples of 8."""
    try:
        dims = json.loads(dims_text)
    except (ValueError, TypeError):
        return []
    bad = []
    for shape in dims if isinstance(dims, list) else []:
        if isinstance(shape, list) and len(shape) >= 2 and all(isinstance(d, int) for d in shape):
            bad += [d for d in shape[-2:] if d % 8]
    return bad


class MatmulAlignment(Rule):
    code = "GA110"
    name = "matmul-alignment"
    topic = "matmul-alignment"
    title = "fp16/bf16 matmuls with dimensions not multiple of 8"
    thresholds = {"multiple": 8, "min_kernel_share_pct": 1.0, "assumed_speedup": 1.3, "min_saving_pct": 0.5}

    def check(self, a: Analysis):
        cpu = a.model.cpu
        if cpu.empty:
            return []
        ops = cpu[names_in(cpu["name"], OPS)]
        ops = ops[ops["input_type"].astype(str).str.contains("|".join(HALF))]
        if ops.empty:
            return []
        bad_dims = ops["input_dims"].astype(str).map(misaligned)
        bad = ops[bad_dims.map(bool).to_numpy()]
        if bad.empty:
            return []
        rt = a.model.runtime
        corr = set(rt.loc[rt["external_id"].isin(set(bad["external_id"]) - {-1, 0}), "correlation"])
        k = a.model.kernels
        k_bad = k[k["correlation"].isin(corr)]
        share = 100 * k_bad["dur"].sum() / max(k["dur"].sum(), 1e-9)
        if share < self.thresholds["min_kernel_share_pct"]:
            return []
        factor = 1 / self.thresholds["assumed_speedup"]
        saving, basis = a.predicted_saving(Scenario(
            f"misaligned matmul kernels {self.thresholds['assumed_speedup']}× faster once padded",
            gpu_scale=lambda o: np.where(o["correlation"].isin(corr), factor, 1.0)))
        if saving is None:
            saving, basis = 0.0, "not predicted: no GPU timeline"
        elif saving < self.thresholds["min_saving_pct"]:
            return []  # those kernels hide behind other work: padding would not shorten the step
        shapes = bad.assign(name=bad["name"].astype(str), dims=bad["input_dims"].astype(str)).groupby(["name", "dims"]).size()
        items = [{"name": n, "input_dims": d, "count": int(c)} for (n, d), c in shapes.sort_values(ascending=False).head(8).items()]
        odd = sorted({d for ds in bad_dims for d in ds})[:8]
        message = (f"{len(bad)} half-precision matmuls have dimensions that are not multiples of 8 ({', '.join(map(str, odd))}); "
                   f"their kernels take {share:.1f}% of GPU kernel time.")
        evidence = Evidence(items=items, numbers={"misaligned_ops": int(len(bad)), "kernel_share_pct": round(share, 1),
                                                  "odd_dimensions": odd})
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis,
                             advice="Pad the odd dimensions to a multiple of 8 (64 is better for vocabularies).")]

    def positive(self) -> TraceBuilder:
        return _loop("[[4096, 50257], [50257, 768]]")

    def negative(self) -> TraceBuilder:
        return _loop("[[4096, 50304], [50304, 768]]")


def _loop(dims: str) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(10):
                with b.op("aten::mm", **{"Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Dims": json.loads(dims)}):
                    b.kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 500)
            b.sync()
    b.finish()
    return b


RULE = MatmulAlignment()

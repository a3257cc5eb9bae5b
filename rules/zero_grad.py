"""zero-grad: `optimizer.zero_grad()` writes zeros into every gradient instead of dropping them.

## What it detects
`aten::zero_` ops inside the `Optimizer.zero_grad#…` span of each step, each launching a fill kernel.
That is `zero_grad(set_to_none=False)` (or a hand-written `p.grad.zero_()` loop), the behaviour of
PyTorch before 2.0.

## Why it matters
Zeroing costs one kernel launch and a full write of every gradient, every step; the next backward then
reads those zeros back to accumulate into them. Setting gradients to `None` skips both: the backward
writes fresh gradients directly. It also lowers the memory peak between steps.

## Fix
```python
optimizer.zero_grad(set_to_none=True)   # the default since PyTorch 2.0
# or, for a manual loop over parameters:
for p in model.parameters():
    p.grad = None
```
Code that reads `.grad` between steps must then handle `None`.

## Thresholds
Fires when at least one `aten::zero_` runs inside `Optimizer.zero_grad` in the median step (the report's
statistic; over the steps that call it when some do not, as with gradient accumulation; the PyTorch profiler's anti-pattern matcher flags any). The saving is the replay without those
ops and kernels; without a GPU timeline, the median step's zeroing CPU time over the median step.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics.spans import annotation_spans, gpu_ops_launched_in, ops_inside
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class ZeroGrad(Rule):
    code = "GA108"
    name = "zero-grad"
    title = "zero_grad() writes zeros instead of setting gradients to None"
    thresholds = {"min_zero_ops_per_step": 1}

    def check(self, a: Analysis):
        m = a.metrics
        spans = annotation_spans(a.model, "Optimizer.zero_grad#")
        if spans.empty:
            return []
        zeros = ops_inside(a.model, spans, {"aten::zero_"})
        if zeros.empty:
            return []
        # per step: the median over the steps, the report's statistic (perstep), over those that call
        # zero_grad when some do not (gradient accumulation)
        runs = perstep.issued(m, spans["ts"]) > 0
        runs = runs if runs.any() else np.ones(len(runs), dtype=bool)
        every = bool(runs.all())
        zeros_per_step = perstep.median(perstep.issued(m, zeros["ts"])[runs])
        if zeros_per_step < self.thresholds["min_zero_ops_per_step"]:
            return []
        kernels = gpu_ops_launched_in(a.model, m.launches, spans)
        kernels_per_step = perstep.median(perstep.issued(m, kernels["launch_ts"])[runs])
        corr = set(kernels["correlation"])
        saving, basis = a.predicted_saving(Scenario(
            "gradients set to None: no zeroing ops or fill kernels",
            cpu_removed=iv.union(zeros["ts"], zeros["end"]),
            gpu_scale=lambda ops: np.where(ops["correlation"].isin(corr), 0.0, 1.0)))
        cpu_us = perstep.median(perstep.issued(m, zeros["ts"], zeros["dur"])[runs])
        if saving is None:  # the median step's zeroing time over the median step
            saving, basis = 100 * cpu_us / max(m.median_step_us, 1e-9), "share of the median step's time"
        cpu_ms = cpu_us / 1e3
        gpu_ms = perstep.median(perstep.sums(m, kernels["gpu_ts"], kernels["gpu_us"])[runs]) / 1e3
        per = ("in the trace" if not m.steps else "per step" if every else
               f"per step that calls it ({int(runs.sum())} of {len(runs)})")
        message = (f"`zero_grad` zeroes gradients in place: {perstep.a_median(m) if m.steps else ''}{perstep.count_of(zeros_per_step, '`aten::zero_` op')} "
                   f"{per} ({cpu_ms:.2f} ms of CPU time), launching {perstep.a_median(m) if m.steps else ''}"
                   f"{perstep.count_of(kernels_per_step, 'fill kernel')} ({gpu_ms:.2f} ms of GPU time).")
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            time_ranges_ms=[(a.rel_ms(t), a.rel_ms(e)) for t, e in zip(spans["ts"].head(5), spans["end"].head(5))],
            items=[{"name": n, "count": int(len(g))} for n, g in spans.groupby("name")],
            numbers={"zero_ops_per_step": round(zeros_per_step, 1), "fill_kernels_per_step": round(kernels_per_step, 1),
                     "cpu_ms_per_step": round(cpu_ms, 3), "gpu_ms_per_step": round(gpu_ms, 3), "statistic": "traced window" if not m.steps else "median step" if every else "median step calling zero_grad"},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis,
                             advice="Call `optimizer.zero_grad(set_to_none=True)`.")]

    def positive(self) -> TraceBuilder:
        return _loop(zeroing=True)

    def negative(self) -> TraceBuilder:
        return _loop(zeroing=False)


def _loop(zeroing: bool) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.op("Optimizer.zero_grad#SGD.zero_grad", cat="user_annotation"):
                for _ in range(40 if zeroing else 0):
                    with b.op("aten::zero_"):
                        with b.op("aten::fill_"):
                            b.kernel("void at::native::vectorized_elementwise_kernel<4, FillFunctor<float>>", 8)
                b.idle(5)
            for _ in range(30):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 150)
            b.sync()
    b.finish()
    return b


RULE = ZeroGrad()

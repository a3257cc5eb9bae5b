"""single-tensor-optimizer: the optimizer updates parameters one tensor at a time.

## What it detects
`Optimizer.step#…` spans that launch many kernels (several per parameter) with no sign of the
multi-tensor paths: no `_foreach_` ops, no `multi_tensor_apply` or fused optimizer kernels. That is
`foreach=False`, an optimizer without a foreach implementation, or one forced onto the per-tensor path.

## Why it matters
The per-tensor path launches a handful of small kernels for every parameter: for a model with hundreds
of parameter tensors that is thousands of launches per step, each costing CPU time while the GPU
waits. The foreach path batches them into a few launches; `fused=True` does the whole update in one
kernel per group.

## Fix
```python
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)    # one kernel per param group (CUDA)
# or
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
```
PyTorch picks foreach by default when all parameters are on CUDA; check that nothing forces
`foreach=False` and that parameters are not split across devices.

## Thresholds
Fires when the optimizer launches at least 20 kernels in the median step (the report's statistic; over
the steps that run it when some do not, as with gradient accumulation; over the optimizer's own steps
when the trace marks no training steps), none of them (nor the ops around them)
is a foreach/fused one, and the replay predicts at least 0.5 % saving (an optimizer whose launches
hide behind GPU work costs nothing). The saving is predicted by replaying the steps with the optimizer's CPU time
cut to a fifth (fewer, larger launches), a conservative figure for foreach.
"""

from __future__ import annotations

import re

import numpy as np

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics.spans import annotation_spans, gpu_ops_launched_in, ops_inside
from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.model.trace import name_mask
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import is_on, switch_off

from .base import Rule

MULTI_TENSOR = re.compile(r"_foreach_|multi_tensor_apply|fused|_fused_", re.I)


class SingleTensorOptimizer(Rule):
    code = "GA109"
    name = "single-tensor-optimizer"
    title = "The optimizer launches kernels one parameter at a time"
    thresholds = {"min_kernels_per_step": 20, "cpu_factor": 0.2, "min_saving_pct": 0.5}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        spans = annotation_spans(a.model, "Optimizer.step#")
        if spans.empty or m.launches.empty:
            return []
        kernels = gpu_ops_launched_in(a.model, m.launches, spans)
        # per step: the median over the steps (the report's statistic, perstep), over those that run the
        # optimizer when some do not (gradient accumulation), or over the optimizer's own steps when the
        # trace marks no training steps
        lo, hi = iv.union(spans["ts"], spans["end"])  # nested or repeated annotations count once
        if m.steps:
            runs = perstep.issued(m, lo) > 0
            runs = runs if runs.any() else np.ones(len(runs), dtype=bool)
            per_step = perstep.median(perstep.issued(m, kernels["launch_ts"])[runs])
            cpu_us = perstep.median(perstep.issued(m, lo, hi - lo)[runs])
            every = bool(runs.all())
            per = "per step" if every else f"per step that runs it ({int(runs.sum())} of {len(runs)})"
        else:
            per_step, cpu_us, every = perstep.median(_per_span(kernels, spans)), float(spans["dur"].median()), True
            per = "per optimizer step"
        if per_step < t["min_kernels_per_step"]:
            return []
        ops = ops_inside(a.model, spans)
        if name_mask(kernels["gpu_name"], MULTI_TENSOR.search).any() or name_mask(ops["name"], MULTI_TENSOR.search).any():
            return []
        saving, basis = a.predicted_saving(Scenario(
            f"optimizer CPU time × {t['cpu_factor']} (foreach/fused launches)",
            cpu_shrink=(iv.union(spans["ts"], spans["end"]), t["cpu_factor"])))
        if saving is None or saving < self.thresholds["min_saving_pct"]:
            return []  # the optimizer's launches hide behind GPU work: nothing to win here
        opt = spans["name"].iloc[0].split("#", 1)[-1].split(".")[0]
        recorded = [o.as_dict() for o in runfacts.optimizers(a.facts, cls=opt)]
        message = (f"`{opt}` launches {perstep.a_median(m)}{perstep.count_of(per_step, 'kernel')} {per} "
                   f"(median {kernels['gpu_us'].median():.1f} µs each) and takes {perstep.a_median(m)}{cpu_us / 1e3:.2f} ms of "
                   "CPU time in them; none of them is a foreach or fused kernel.")
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in zip(spans["ts"].head(5), spans["end"].head(5))],
            items=[{"name": str(n), "count": int(c)} for n, c in kernels["gpu_name"].value_counts().head(6).items()],
            numbers={"kernels_per_step": round(per_step, 1), "optimizer_cpu_ms": round(cpu_us / 1e3, 3),
                     "statistic": "median step" if every else "median step running the optimizer",
                     "optimizer": opt, "recorded_settings": recorded[:1]},
        )
        ask = switches.sentence(switches.fused_optimizer(runfacts.framework(a.facts), opt)) + "."
        had = is_on("fused_optimizer", a)  # on, by run.json or the trace: not asked again
        off = switch_off("fused_optimizer", a)  # recorded on, yet the trace shows the per-tensor path: the trace decides
        if had is not None:
            said = "run.json records" if had.source == "run.json" else "the trace shows"
            advice = (f"{said} {had.what}, yet every update ran one tensor at a time: the multi-tensor path needs all parameters "
                      "(and their gradients and state) on one CUDA device, of one dtype, and no `differentiable=True`; "
                      "check what sends it down the per-tensor path.")
        elif off is not None and off.source == "the trace":
            advice = (f"{off.text}: the optimizer that steps is not that one, or something sends it down the "
                      "per-tensor path (its parameters, gradients and state must be on one CUDA device, of one dtype, "
                      f"without `differentiable=True`). {ask}")
        else:  # a conflict run.json itself shows (a foreach/fused optimizer that did not step) the engine names first
            advice = ask
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)]

    def positive(self) -> TraceBuilder:
        return _loop("void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", per_param=3)

    def negative(self) -> TraceBuilder:
        return _loop("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", per_param=0)


def _per_span(kernels, spans) -> np.ndarray:
    """The kernels launched inside each span, on the span's thread."""
    lt, tid = kernels["launch_ts"].to_numpy(dtype=float), kernels["tid"].to_numpy()
    return np.array([np.count_nonzero((lt >= s.ts) & (lt <= s.end) & (tid == s.tid)) for s in spans.itertuples()],
                    dtype=float)


def _loop(kernel: str, per_param: int) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(30):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 20)
            with b.op("Optimizer.step#AdamW.step", cat="user_annotation"):
                if per_param:
                    for _ in range(60):
                        for _ in range(per_param):
                            b.kernel(kernel, 3)
                            b.idle(10)
                else:
                    for _ in range(4):
                        b.kernel(kernel, 40)
            b.sync()
    b.finish()
    return b


RULE = SingleTensorOptimizer()

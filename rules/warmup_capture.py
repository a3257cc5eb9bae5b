"""warm-up-capture: the profiled window holds one-time start-up costs, not steady-state steps.

## What it detects
Work a job pays once, recorded inside the window (`analyzer/measure/warmup.py`):
- a kernel launch call of 50 ms or more: first-call CUDA module loading (lazy loading of the kernel's
  module, typically inside the first cuDNN/cuBLAS call);
- an op whose first call takes 50 ms or more and 20× its later calls: cuDNN autotuning, compilation,
  CUDA context or library initialisation;
- cudaMalloc calls covering a tenth of the window: the allocator filling its cache;
- a first step 3× the others (and 10 ms longer): DataLoader workers starting, first-call initialisation.
A slow call during which the GPU was busy, or that spends most of its time in a blocking call (a sync,
a synchronous copy), is a wait for the GPU, not a one-time cost, and is not counted.

## Why it matters
A window that starts with the job describes its start: step times, GPU utilization, launch costs and
batch advice read off it are dominated by costs the steady state never pays.

## Fix
Capture steady state: start the window after the first steps.
```bash
gpuadvise profile --wait 10 train.py          # 10 unprofiled steps before the warm-up and the window
```
```python
from torch.profiler import profile, schedule
with profile(schedule=schedule(wait=10, warmup=2, active=3)) as prof:
    for batch in loader:
        train_step(batch)
        prof.step()
```

## Thresholds
The figures above (50 ms launch call; first call 50 ms and 20× the later median; cudaMalloc 10 % of the
window; first step 3× the median of the others). Severity: medium when the one-time costs cover 10 % of
the traced window or more, info otherwise. Not a step-time saving: the capture must be redone.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.warmup import one_time_costs
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

CONV = "cudnn_convolution_fwd_implicit_gemm"
GEMM = "ampere_sgemm_64x64_nn"


class WarmupCapture(Rule):
    code = "GA111"
    name = "warm-up-capture"
    title = "The capture holds one-time start-up costs, not steady-state steps"
    thresholds = {"medium_share_pct": 10.0}

    def check(self, a: Analysis):
        m = a.metrics
        if not m.has_gpu:
            return []
        costs = one_time_costs(a.model, m)
        if not costs:
            return []
        total = sum(c["ms"] for c in costs)
        share = min(100.0, 100 * total * 1e3 / max(m.window_us, 1e-9))
        message = ("The window holds one-time costs a steady-state step never pays: " + "; ".join(c["what"] for c in costs)
                   + f". Together {total:.0f} ms, {share:.0f} % of the {m.window_us / 1e3:.0f} ms traced: step times, "
                     "utilization and launch figures here describe the job's start.")
        return [self.finding(
            message=message,
            evidence=Evidence(items=costs, time_ranges_ms=[(c["at_ms"], round(c["at_ms"] + c["ms"], 1)) for c in costs],
                              numbers={"one_time_ms": round(total, 1), "one_time_pct_of_window": round(share, 1)}),
            saving=0.0, basis="not a time saving: the capture must show steady state first",
            severity="medium" if share >= self.thresholds["medium_share_pct"] else "info",
            advice="Capture steady state: start the window after the first steps (`gpuadvise profile --wait 10 train.py`, "
                   "or `schedule(wait=10, warmup=2, active=3)`).")]

    def positive(self) -> TraceBuilder:
        # the job's first forward passes: the first convolution's launch loads its CUDA module (630 ms)
        return _passes(first_launch_us=630_000.0)

    def negative(self) -> TraceBuilder:
        return _passes(first_launch_us=None)


def _passes(first_launch_us: float | None) -> TraceBuilder:
    b = TraceBuilder()
    for i in range(3):
        with b.step():
            with b.op("aten::conv2d"):
                usual = b.launch_us
                if i == 0 and first_launch_us is not None:
                    b.launch_us = first_launch_us
                b.kernel(CONV, 2_000)
                b.launch_us = usual
            for _ in range(10):
                b.kernel(GEMM, 500)
            b.sync()
    b.finish()
    return b


RULE = WarmupCapture()

"""warm-up-capture: the profiled window holds one-time start-up costs, not steady-state steps.

## What it detects
Work a job pays once, recorded inside the window (`analyzer/measure/basics/warmup.py`):
- a kernel launch call of 50 ms or more: first-call CUDA module loading (lazy loading of the kernel's
  module, typically inside the first cuDNN/cuBLAS call);
- an op whose first call takes 50 ms or more and 20× its later calls: cuDNN autotuning, compilation,
  CUDA context or library initialisation;
- cudaMalloc calls covering a tenth of the window, paid in the first steps only (cudaMalloc time a
  median step pays too is allocator churn, not warm-up: see allocator-churn);
- a first step 3× the others (and 10 ms longer): DataLoader workers starting, first-call initialisation.
A slow call during which the GPU was busy, or that spends most of its time in a blocking call (a sync,
a synchronous copy), is a wait for the GPU, not a one-time cost, and is not counted. One cost is often
seen several ways (the slow launch inside the first convolution inside the first step): each item says
which one it lies `within`, and the total is the union of their time ranges, never their sum.

The costs are kept out of every figure of the report (`analyzer/measure/basics/metrics.py`): a step that is a
tenth or more one-time cost is left out of the step table, the median step, utilization, the idle
breakdown, the replay behind every predicted saving, launch costs and batch advice, as long as one step
without one remains; the report header and this finding name the steps left out and why. When none
remains (a one-step capture of the first forward pass, a trace without ProfilerStep marks), the costs'
time ranges are cut out of those figures instead, so no other finding is driven by them.

Compilation that run.json records in a recorded step, or that the trace shows (torch.compile's
`… (dynamo_timed)` compile and autotuning spans, with everything inside them), is compile-in-window's:
one-time costs in those steps or inside those spans are left to it (the steps are still left out of the
figures, and the spans' syncs, copies and launches out of every table), and this rule stays quiet when
nothing else remains.

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
window and under 10 % of the median step; first step 3× the median of the others). A step is left out
when one-time costs cover 10 % of its time or more. Severity: medium when the one-time costs (their
union) cover 10 % of the traced window or more, info otherwise. Not a step-time saving: the capture must
be redone.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.basics import intervals as iv
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
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
        if not m.has_gpu or m.one_time is None:
            return []
        # compilation run.json places in a recorded step is compile-in-window's to report
        compiling = sorted({c["step"] for c in runfacts.compiles_in_window(a.compile_facts) if isinstance(c.get("step"), int)})
        # torch.compile's compile spans, and what lies inside them, are compile-in-window's too
        compile_labels = {c.label for c in m.one_time.costs if c.kind == "compilation"}
        costs = [c for c in m.one_time.costs if (c.step is None or c.step not in compiling)
                 and c.kind != "compilation" and c.within not in compile_labels]
        if not costs:
            return []
        labels = {c.label for c in costs}
        spans = iv.union([s for c in costs for s in c.starts], [e for c in costs for e in c.ends])
        # the window as recorded: the steps left out are part of what was traced
        every = m.steps + m.left_out_steps
        lo = min([m.window[0]] + [min(s.start, s.window[0]) for s in every])
        hi = max([m.window[1]] + [max(s.end, s.window[1]) for s in every])
        traced = max(hi - lo, 1e-9)
        total = float(iv.covered(*spans, [lo], [hi])[0])
        share = min(100.0, 100 * total / traced)
        listed = "; ".join(c.what + (f" (within {c.within})" if c.within in labels else "") for c in costs)
        message = (f"The window holds one-time costs a steady-state step never pays: {listed}. Together {total / 1e3:.0f} ms"
                   + (" (counted once where they nest)" if any(c.within in labels for c in costs) else "")
                   + f", {share:.0f} % of the {traced / 1e3:.0f} ms traced.")
        left = m.left_out
        if left:
            message += (f" Step{'s' if len(left) > 1 else ''} {', '.join(f'#{n}' for n in left)} "
                        f"{'are' if len(left) > 1 else 'is'} left out of every figure in this report, which describes "
                        f"the other {len(m.steps)} step{'s' if len(m.steps) != 1 else ''}.")
        elif m.one_time_cut is not None:
            message += (" No step without them remains: their time is cut out of the step figures, which describe "
                        f"the remaining {float(m.per_step['dur_us'].sum()) / 1e3:.1f} ms; capture again for steady-state steps.")
        if compiling:
            message += (f" Compilation in step{'s' if len(compiling) > 1 else ''} {', '.join(map(str, compiling))} "
                        "is reported by compile-in-window.")
        items = [dict(c.item(), within=c.within if c.within in labels else "") for c in costs]
        return [self.finding(
            message=message,
            evidence=Evidence(items=items, steps=sorted(left) or sorted({c.step for c in costs if c.step is not None}),
                              time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in zip(*spans)],
                              numbers={"one_time_ms": round(total / 1e3, 1), "one_time_pct_of_window": round(share, 1),
                                       "steps_left_out": sorted(left),
                                       "cut_from_figures_ms": round(iv.total(*m.one_time_cut) / 1e3, 1)
                                       if m.one_time_cut is not None else 0.0}),
            saving=0.0, basis="not a time saving: the capture must show steady state first",
            severity="medium" if share >= self.thresholds["medium_share_pct"] else "info",
            advice="Capture steady state: start the window after the first steps (`gpuadvise profile --wait 10 train.py`, "
                   "or `schedule(wait=10, warmup=2, active=3)`).")]

    def positive(self) -> TraceBuilder:
        # the job's first forward passes: the first convolution's launch loads its CUDA module (630 ms)
        return _passes(first_launch_us=630_000.0)

    def negative(self) -> TraceBuilder:
        return _passes(first_launch_us=None)


def _passes(first_launch_us: float | None, steps: int = 3) -> TraceBuilder:
    b = TraceBuilder()
    for i in range(steps):
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

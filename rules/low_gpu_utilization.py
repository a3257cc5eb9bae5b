"""low-gpu-utilization: the GPU sits idle for much of each step.

## What it detects
The share of step time during which no kernel, copy or memset runs on the GPU (the union of GPU
activity inside each ProfilerStep; without steps, HTA's temporal breakdown over the GPU's active
span). The idle time is split as Holistic Trace Analysis does: *host wait* (the GPU waited for the
CPU to launch the next op), *kernel wait* (short gaps between back-to-back ops) and *other*.

The finding also says what the CPU was doing during the idle time: each idle gap is charged to the
thread that launched the GPU op ending it, and within that thread to the DataLoader wait, a blocking
sync, cudaMalloc/cudaFree, launch calls, the outermost op running, or Python outside any recorded op
(in that order), in ms per step: the median over the steps, as the report's median step, with its share
of the median step's idle time (`analyzer/measure/basics/idle.py`, `analyzer/measure/basics/perstep.py`). A cause that
fills one step's idle time but not the others' is not the typical step's, and is not listed.

## Why it matters
An idle GPU is paid for and does nothing. This finding is the symptom; the other findings (data
loading, syncs, launch overhead) name causes. Its saving is an upper bound: what the step would take
if the GPU never waited for the CPU.

## Fix
Find what the CPU is doing in the gaps, starting with the other findings of this report. The finding's
fix lists only the switches the input does not show on already (run.json or the trace); for a loop
with none of them on:
```python
# feed the GPU faster: parallel, pinned, prefetched input
loader = DataLoader(ds, batch_size=bs, num_workers=8, pin_memory=True, persistent_workers=True)
# fewer, larger kernels: compile the model (or capture CUDA graphs)
model = torch.compile(model)
# more work per launch: a larger batch, if memory and convergence allow
```
A compiled model gets `mode="reduce-overhead"` (CUDA graphs) instead; one that replays CUDA graphs
already, a larger batch.

## Thresholds
Fires below 50 % GPU busy (the PyTorch TensorBoard plugin's low-utilization threshold). A trace with
no GPU activity at all gets `capture-problem` instead, never a 0 % utilization verdict.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics.idle import explain_idle, idle_split
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import switches_on
from gpuadvise.analyzer.model import switches

from .base import Rule


def _fix(a: Analysis) -> str:
    """The general fix with only the switches that are off (run.json or the trace)."""
    on = switches_on(a)
    lines = []
    loader = switches.loader_line(on)
    if loader:
        lines += ["# feed the GPU faster: parallel, pinned, prefetched input", loader]
    lines += switches.launch_fix_lines(on, comment="# fewer, larger kernels: compile the model (or capture CUDA graphs)"
                                       if "cuda_graphs" not in on else "# fewer, larger kernels: compile the model")
    lines.append("# more work per launch: a larger batch, if memory and convergence allow")
    done = [str(on[k]) for k in ("workers", "pin_memory", "compile", "cuda_graphs") if k in on]
    return ("Find what the CPU is doing in the gaps, starting with the other findings of this report. In general:\n"
            "```python\n" + "\n".join(lines) + "\n```"
            + (f"\nAlready on, so not repeated here: {'; '.join(done)}." if done else ""))


class LowGpuUtilization(Rule):
    code = "GA101"
    name = "low-gpu-utilization"
    title = "The GPU is idle for much of each step"
    thresholds = {"max_busy_pct": 50.0}

    def check(self, a: Analysis):
        m = a.metrics
        if not m.has_gpu:
            return []
        busy = m.busy_in_steps_pct if m.steps else m.gpu_busy_pct
        if busy is None or busy >= self.thresholds["max_busy_pct"]:
            return []
        # the split of the idle time inside the steps the busy share is of (HTA's classes, per step)
        per_kind = {k: float(v.sum()) for k, v in idle_split(a.model, m).items()}
        idle_total = sum(per_kind.values())
        split = {k: round(100 * v / idle_total, 1) if idle_total else 0.0 for k, v in per_kind.items()}
        saving, basis = a.predicted_saving(Scenario("upper bound: the GPU never waits for the CPU", cpu_scale=0.0,
                                                    unblock=lambda c: c["blocking"].to_numpy()))
        if saving is None:
            saving, basis = 100 - busy, "idle share of the step"
        gaps = _largest_gaps(m)
        where = "inside the steps" if m.steps else "over the GPU's active span"
        # the report's statistic: the step quoted is the header's median step, and the CPU figures per step
        # below are medians over the same steps (explain_idle); the busy share is the header's, of all their time
        nsteps = max(len(m.steps), 1)
        median_step_ms = m.median_step_us / 1e3
        step_txt = (f"{nsteps} steps, median {median_step_ms:.1f} ms" if len(m.steps) > 1 else
                    f"1 step, {median_step_ms:.1f} ms" if m.steps else f"{median_step_ms:.1f} ms traced")
        message = (f"The GPU is busy only {busy:.1f}% of the time {where} ({step_txt}). "
                   f"Of the idle time, {split['host_wait']:.0f}% is the GPU waiting for the CPU to launch work, "
                   f"{split['kernel_wait']:.0f}% short gaps between kernels, {split['other']:.0f}% other waits.")
        causes = explain_idle(a.model, m)
        named = causes[causes["share_of_idle_pct"] >= 1.0]
        if len(named):
            per = ("in the step; share of its idle time" if len(m.steps) == 1 else
                   "median per step; share of that step's idle time" if m.steps else "in the trace; share of the idle time")
            message += (f" Meanwhile the CPU thread launching the GPU's work was in ({per}): "
                        + "; ".join(f"{r.what} {r.ms_per_step:.2f} ms ({r.share_of_idle_pct:.0f}%)"
                                    for r in named.head(4).itertuples()) + ".")
        low = m.per_step[m.per_step["gpu_busy_pct"] < self.thresholds["max_busy_pct"]]
        worst = low.nsmallest(3, "gpu_busy_pct")
        evidence = Evidence(
            steps=[int(s) for s in low["step"] if s >= 0],
            time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in gaps],
            items=[{"name": f"step #{int(r.step)}" if r.step >= 0 else "whole trace", "busy_pct": round(r.gpu_busy_pct, 1),
                    "step_ms": a.ms(r.dur_us)} for r in worst.itertuples()],
            numbers={"gpu_busy_pct": round(busy, 1), "median_step_ms": round(median_step_ms, 2), "statistic": "median step",
                     "idle_split_pct": split,
                     "hta_temporal_idle_pct": round(m.temporal.get("idle_pct", 0.0), 1),
                     "cpu_during_idle": causes.to_dict("records")},
        )
        advice = ("The GPU mostly waits for the CPU to hand it work: see the other findings for the cause."
                  if split["host_wait"] >= 50 else "The GPU waits on something other than launches (syncs, other streams).")
        f = self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice, fix=_fix(a))
        f.impact.upper_bound = True  # a symptom: its causes' findings carry the real predictions
        return [f]

    def positive(self) -> TraceBuilder:
        return _loop(cpu_us=4_000, kernel_us=100)  # 4 ms of Python, 1 ms of GPU work per step

    def negative(self) -> TraceBuilder:
        return _loop(cpu_us=100, kernel_us=500)


def _loop(cpu_us: float, kernel_us: float) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.idle(cpu_us)
            for _ in range(10):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", kernel_us)
            b.sync()
    b.finish()
    return b


def _largest_gaps(m, n: int = 5) -> list[tuple[float, float]]:
    s, e = m.gpu_union
    if s.size < 2:
        return []
    lo, hi = m.window
    gs, ge = e[:-1], s[1:]
    keep = (ge > lo) & (gs < hi)
    gs, ge = gs[keep], ge[keep]
    # largest gaps first, the earliest of equal ones: a stable sort (numpy's default breaks ties one way on
    # a CPU with AVX-512 and another without)
    order = np.argsort(gs - ge, kind="stable")[:n]
    return [(float(gs[i]), float(ge[i])) for i in sorted(order, key=lambda i: gs[i])]


RULE = LowGpuUtilization()

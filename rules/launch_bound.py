"""launch-bound: many tiny kernels, and the GPU waits for the CPU to launch them.

## What it detects
Steps where most kernels are shorter than the CPU time it takes to launch them: at least half of the
kernels run under 10 µs, the GPU is busy less than 60 % of the step, and most of its idle time is
*host wait* (HTA's term: the next kernel's launch call started only after the previous kernel had
finished). Time the DataLoader already explains is set aside, and steps already replayed through CUDA
graphs are not flagged.

The message says where the launching thread's CPU time per kernel goes (the launch call, PyTorch op
dispatch, Python between ops), since compilation and CUDA graphs remove all three.

## Why it matters
Each launch costs the CPU 5–20 µs of framework and driver work. When kernels are shorter than that,
the GPU finishes each one before the next arrives, and the Python loop, not the GPU, sets the pace:
a faster GPU would not make training faster.

## Fix
```python
model = torch.compile(model)                     # fuse small ops into fewer, larger kernels
# or: torch.compile(model, mode="reduce-overhead")  # also replays the step as a CUDA graph
opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)  # one kernel for the whole update
```
The finding's fix asks only for what the input does not show on: a compiled model (compiled frames or
Inductor kernels in the trace, or run.json's compile facts) gets `mode="reduce-overhead"` (CUDA graphs)
instead of `torch.compile(model)`. A compiled helper whose code launched under a quarter of the model's
matmul kernels does not make a compiled model: the model itself still gets `torch.compile(model)`. One
that replays CUDA graphs already gets larger batches, and a foreach/fused optimizer is not asked for
again. Larger batches (or fewer, larger layers) give each launch more work. For fixed shapes, capture
the step once with `torch.cuda.graphs.make_graphed_callables` or `torch.cuda.CUDAGraph`.

## Thresholds
Short kernel: under 10 µs (TraceLens' short-kernel cut). Fires when ≥ 50 % of kernels are short, GPU
busy < 60 %, host wait ≥ 50 % of GPU idle time, at least 50 % of kernels launched one by one (not from
a CUDA graph), and the replay predicts a saving of at least 3 % when the CPU time between launches
falls by 75 % (about what CUDA-graph replay or compilation removes from a launch-bound loop; an
assumption, stated in the finding). The estimate is a share of today's step: when a DataLoader stall
hides the launch overhead, the finding gives what the launch fix adds to the loader fix (as
dataloader-stall replays it: its waits down to what workers leave), and says what it becomes once the
loader is fixed (the 3 % floor applies to that figure).
"""

from __future__ import annotations

from dataclasses import replace

from gpuadvise.analyzer.measure.compiled import launchcost
from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.calls import GRAPH_LAUNCHES
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import switches_on

from .base import Rule
from .dataloader_stall import RULE as LOADER


class LaunchBound(Rule):
    code = "GA105"
    name = "launch-bound"
    title = "Many tiny kernels: the GPU waits for launches"
    costly = True  # (rulequeue.py: taken first)
    thresholds = {"short_kernel_us": 10.0, "min_short_share_pct": 50.0, "max_busy_pct": 60.0,
                  "min_host_wait_pct": 50.0, "min_direct_launch_pct": 50.0, "cpu_overhead_cut": 0.75,
                  "min_saving_pct": 3.0}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        k = a.model.kernels
        if m.compile_work:  # the autotuner's benchmark kernels are compiling, not the loop's launches
            k = k[~m.compile_work.made(k["correlation"])]
        if m.steps:
            lo, hi = m.window
            k = k[(k["ts"] >= lo) & (k["ts"] < hi)]
        if len(k) < 20:
            return []
        short = float((k["dur"] < t["short_kernel_us"]).mean() * 100)
        busy = m.busy_in_steps_pct if m.steps else m.gpu_busy_pct
        ib = m.idle_breakdown
        idle = float(ib["idle_us"].sum()) if len(ib) else 0.0
        host = 100 * float(ib["host_wait_us"].sum()) / idle if idle else 0.0
        la = m.launches
        direct = 100 * float((~la["call"].isin(GRAPH_LAUNCHES)).sum()) / max(len(a.model.kernels), 1) if len(la) else 0.0
        if (short < t["min_short_share_pct"] or busy is None or busy >= t["max_busy_pct"]
                or host < t["min_host_wait_pct"] or direct < t["min_direct_launch_pct"]):
            return []
        dl = m.dataloader
        # the loader's fix as dataloader-stall replays it (its waits down to what workers leave), one figure for both
        loader_fix = LOADER.fix_scenario(a) if len(dl) else None
        base, _ = (a.predicted_saving(replace(loader_fix, name="input pipeline fixed")) if loader_fix is not None
                   else a.predicted_saving(Scenario("input pipeline fixed")))
        cut = f"CPU time between launches cut by {t['cpu_overhead_cut']:.0%} (CUDA graphs / torch.compile)"
        both, basis = a.predicted_saving(
            replace(loader_fix, name=cut, cpu_scale=loader_fix.cpu_scale * (1 - t["cpu_overhead_cut"]))
            if loader_fix is not None else Scenario(cut, cpu_scale=1 - t["cpu_overhead_cut"]))
        if base is None or both is None:
            return []
        saving = max(0.0, both - base)  # what it adds to the loader fix, as a share of today's step
        after_fix = saving / max(1 - base / 100, 1e-9)  # the same time as a share of the step once the loader is fixed
        if after_fix < t["min_saving_pct"]:
            return []
        la_win = la[la["gpu_ts"].between(*m.window)] if m.steps else la
        # kernels per step: the median over the steps of the kernels each one launched, the report's statistic
        if m.steps:
            la_k = la_win[la_win["correlation"].isin(set(k["correlation"]))]
            per_step = perstep.median(perstep.issued(m, la_k["launch_ts"]))
            per_txt = (f"{perstep.count_of(per_step, 'kernel')} in the step" if len(m.steps) == 1 else
                       f"A median {perstep.count_of(per_step, 'kernel')} per step")
        else:
            per_step, per_txt = float(len(k)), f"{len(k)} kernels in the trace"
        top = (k.groupby("name", observed=True)["dur"].agg(["count", "mean"]).reset_index()
               .sort_values("count", ascending=False).head(8))
        # the CPU time per kernel by where it goes: compilation and CUDA graphs remove the Python and the
        # dispatch as well as the launch call, so the call's own cost alone would understate the problem
        cost = launchcost.cpu_per_kernel(a.model, m, len(k))
        per_kernel = (launchcost.describe(cost) if cost is not None else
                      f"each launch call costs the CPU a median {la_win['cpu_us'].median():.1f} µs")
        message = (f"{per_txt}, {short:.0f}% of them shorter than {t['short_kernel_us']:.0f} µs "
                   f"(median {k['dur'].median():.1f} µs), while {per_kernel}. The GPU is busy {busy:.1f}% of the step "
                   f"and {host:.0f}% of its idle time is spent waiting for the next launch.")
        evidence = Evidence(
            steps=[int(s.number) for s in m.steps],
            items=[{"name": str(r.name), "count": int(r.count), "mean_us": round(float(r.mean), 2)} for r in top.itertuples()],
            numbers={"kernels_per_step": round(per_step, 1), "statistic": "median step" if m.steps else "traced window", "short_kernel_pct": round(short, 1),
                     "median_kernel_us": round(float(k["dur"].median()), 2),
                     "median_launch_cpu_us": round(float(la_win["cpu_us"].median()), 2) if len(la_win) else None,
                     "gpu_busy_pct": round(busy, 1), "host_wait_pct_of_idle": round(host, 1)},
        )
        if cost is not None:
            evidence.numbers["cpu_per_kernel_us"] = {k2: round(v, 1) for k2, v in cost.items() if k2 != "other_is_python"}
        fw = runfacts.framework(a.facts)
        on = switches_on(a)  # advice asks only for what is off (run.json or the trace)
        advice = switches.fewer_launches(fw, on)
        if "compile" in on and "cuda_graphs" in on:
            advice = (f"torch.compile and CUDA graphs are on already ({on['compile'].what}; {on['cuda_graphs'].what}): "
                      "the kernels launched one by one run outside the graphs. " + advice)
        elif "compile" in on:
            advice = f"torch.compile is on already ({on['compile'].what}). " + advice
        after = None
        if base >= t["min_saving_pct"]:
            # the loader hides the launch overhead today: the gain shows only once it is fixed
            after = "dataloader-stall"
            message += (f" Today the DataLoader wait hides most of this: it adds {saving:.1f}% of today's step to the "
                        f"DataLoader fix ({base:.1f}%), and becomes {after_fix:.1f}% of the step once the loader is fixed.")
            basis += f"; {saving:.1f}% of today's step on top of fixing the input pipeline ({after_fix:.1f}% of the step after that fix)"
        elif len(dl):
            basis += ", beyond fixing the input pipeline"
        if len(dl):  # without a DataLoader in the trace there is no loader fix to come first
            evidence.numbers["saving_after_loader_fix_pct"] = round(after_fix, 1)
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice, after=after,
                             fix=_fix(on, a.trains))]

    def positive(self) -> TraceBuilder:
        return tiny_kernels()

    def negative(self) -> TraceBuilder:
        b = TraceBuilder(launch_us=12.0)
        for _ in range(4):
            with b.step():
                for _ in range(200):
                    b.kernel("ampere_bf16_s16816gemm_bf16_128x128_nn", 120)
                b.sync()
        b.finish()
        return b


RULE = LaunchBound()


def tiny_kernels(steps: int = 4, optimizer: bool = False, compiled: bool = False) -> TraceBuilder:
    """Each step launches 200 kernels of 3 µs, 8 µs of Python apart (the positive fixture); with `optimizer`
    each step ends in an optimizer step, as a training loop's does; `compiled`: they are Inductor's kernels,
    launched inside a compiled region (a compiled model that is still launch-bound)."""
    from contextlib import ExitStack

    b = TraceBuilder(launch_us=12.0)
    for _ in range(steps):
        with b.step(), ExitStack() as region:
            if compiled:
                region.enter_context(b.op("Torch-Compiled Region: 0/0"))
                region.enter_context(b.op("CompiledFunction"))
            for i in range(200):
                b.kernel(f"triton_poi_fused_add_{i % 7}" if compiled else "void at::native::vectorized_elementwise_kernel<4, add>", 3)
                b.idle(8)
            if optimizer:
                with b.op("Optimizer.step#AdamW.step", cat="user_annotation"):
                    b.kernel("void at::native::vectorized_elementwise_kernel<4, add>", 3)
            b.sync()
    b.finish()
    return b


def _fix(on, trains: bool) -> str:
    """The Fix block with only the switches that are off (and no optimizer where the trace trains nothing)."""
    lines = switches.launch_fix_lines(on)
    if "fused_optimizer" not in on and trains:
        lines.append("opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)  # one kernel for the whole update")
    text = ("```python\n" + "\n".join(lines) + "\n```\n") if lines else ""
    text += "Larger batches (or fewer, larger layers) give each launch more work."
    if "cuda_graphs" not in on:
        text += (" For fixed shapes, capture the\nstep once with `torch.cuda.graphs.make_graphed_callables` or "
                 "`torch.cuda.CUDAGraph`.")
    return text

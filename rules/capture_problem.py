"""capture-problem: the trace cannot support a verdict about the GPU.

## What it detects
Traces that recorded no GPU timeline, or only part of one:
- runtime launches but no kernels (CUPTI failed to start, or lacked permission);
- no GPU activity and no CUDA/HIP calls at all although the machine had a GPU (profiler run without
  `ProfilerActivity.CUDA`);
- CUPTI range-profiler mode, which records counters per kernel instead of a timeline;
- a CPU-only run (no GPU on the machine or none used);
- a trace cut off mid-write.

## Why it matters
Every other verdict (utilization, stalls, launch overhead) reads the GPU timeline. Without it a tool
would report 0 % GPU utilization for a job that may be perfectly healthy. gpuadvise says what is missing
instead, and how to capture it.

## Fix
Record CUDA activity, and step the profiler so the window completes:
```python
from torch.profiler import profile, schedule, ProfilerActivity, tensorboard_trace_handler
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
             schedule=schedule(wait=1, warmup=2, active=3),
             on_trace_ready=tensorboard_trace_handler("./traces")) as prof:
    for batch in loader:
        train_step(batch)
        prof.step()
```
or let `gpuadvise profile train.py` do it. If kernels are still missing, CUPTI could not start: check
that `libcupti` is on `LD_LIBRARY_PATH`, and in containers that profiling is allowed
(`--cap-add SYS_ADMIN`, or the driver option `NVreg_RestrictProfilingToAdminUsers=0`).

## Thresholds
None: each condition is checked exactly (no kernel events, launches without kernels, range-profiler
events, a file that ends mid-event).
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.calls import LAUNCH_CALLS
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class CaptureProblem(Rule):
    code = "GA100"
    name = "capture-problem"
    title = "The trace cannot support a GPU verdict"
    thresholds = {}

    def check(self, a: Analysis):
        m, meta = a.model, a.model.meta
        out = []
        rt_names = {str(n) for n in m.runtime["name"].unique()} if len(m.runtime) else set()
        launches = len(rt_names & LAUNCH_CALLS) > 0
        has_gpu = a.metrics.has_gpu
        numbers = {"kernels": int(len(m.kernels)), "runtime_calls": int(len(m.runtime)), "cpu_ops": int(len(m.cpu))}
        problem = None
        if not has_gpu and meta.profiler_ranges:
            problem = ("The trace was recorded in CUPTI range-profiler mode: "
                       f"{meta.profiler_ranges} per-kernel counter ranges, but no kernel timeline.",
                       "Record a timeline instead (no `experimental_config` profiler metrics).", "high")
        elif not has_gpu and launches:
            problem = (f"The CPU launched GPU work ({len(m.runtime)} CUDA/HIP runtime calls) but no kernel, copy or "
                       "memset was recorded: the GPU tracer (CUPTI/roctracer) did not run.",
                       "CUPTI failed to start or lacked permission; see the fix below.", "high")
        elif not has_gpu and meta.devices:
            problem = (f"The trace lists a GPU ({meta.devices[0].name or 'unnamed'}) but recorded no GPU activity and no "
                       "CUDA calls: it was captured without `ProfilerActivity.CUDA`.",
                       "Add `ProfilerActivity.CUDA` to the profiler's activities.", "high")
        elif not has_gpu:
            problem = self._no_gpu_work(a, numbers)
        if problem:
            message, advice, severity, *fix = problem
            out.append(self.finding(message=message, evidence=Evidence(numbers=numbers), saving=0.0,
                                    basis="not a time saving: the capture must be fixed first" if not fix else
                                    "not a time saving: nothing was wrong with the capture", advice=advice,
                                    severity=severity, fix=fix[0] if fix else None))
        if meta.truncated:
            out.append(self.finding(
                message=f"The trace file ends mid-event (the job stopped while writing it); {meta.events_total} complete "
                        "events before the cut were analysed.",
                evidence=Evidence(numbers={"events_read": meta.events_total, "bytes": meta.bytes_total}),
                saving=0.0, basis="not a time saving: findings may be incomplete", severity="medium",
                advice="Let the profiler finish writing (`gpuadvise profile` writes the trace when the window completes)."))
        return out

    def _no_gpu_work(self, a: Analysis, numbers: dict) -> tuple:
        """No GPU work and no CUDA/HIP call in the trace. run.json says whether the process had a GPU: without
        one this is a CPU run, which needs no capture fix (its findings are the CPU's); with one, the script
        put no work on it. Without run.json the trace cannot tell a CPU run from a lost GPU timeline."""
        m = a.model
        steps = perstep.count_of(len(a.metrics.steps), "step")
        gpu = runfacts.cuda_available(a.facts)
        torch = runfacts.machine(a.facts).get("torch")
        torch = torch if isinstance(torch, dict) else {}
        if gpu is False:
            build = torch.get("build")
            version = torch.get("version")
            why = (f"torch {version} is a CPU-only build" if build == "cpu" and isinstance(version, str) else
                   "torch found no GPU in the profiled process")
            numbers.update(run_had_gpu=False, **({"torch_build": build} if isinstance(build, str) else {}))
            return (f"This run had no GPU (run.json: {why}), so no GPU activity was recorded ({len(m.cpu)} CPU ops, "
                    f"{steps}) and no GPU finding applies: the findings here are about the CPU's time.",
                    "Nothing to fix in the capture. To profile GPU work, run on a machine with a GPU"
                    + (" and a CUDA or ROCm build of torch." if build == "cpu" else "."),
                    "info", "")
        if gpu is True:
            name = runfacts.device_name(a.facts)
            numbers.update(run_had_gpu=True)
            return (f"The process had a GPU{f' ({name})' if name else ''} (run.json), but the recorded steps put no "
                    f"work on it: {len(m.cpu)} CPU ops, {steps}, no CUDA/HIP calls.",
                    "Move the model and the batches to the GPU (`model.to('cuda')`, "
                    "`x.to('cuda', non_blocking=True)`) if the job should use it.", "info", "")
        return (f"No GPU activity was recorded ({len(m.cpu)} CPU ops, {steps}, no CUDA/HIP "
                "calls): this looks like a CPU-only run, so GPU findings do not apply.",
                "If the job should use a GPU, check that the model and batches are moved to it (`.to('cuda')`).",
                "info")

    def positive(self) -> TraceBuilder:
        # CUPTI failure: runtime launches but no GPU events
        b = TraceBuilder()
        for _ in range(3):
            with b.step():
                for _ in range(10):
                    b.kernel("ampere_sgemm_64x64_nn", 100)
        b.events = [e for e in b.events if e["cat"] not in ("kernel", "gpu_memcpy")]
        return b

    def negative(self) -> TraceBuilder:
        b = TraceBuilder()
        for _ in range(3):
            with b.step():
                for _ in range(10):
                    b.kernel("ampere_sgemm_64x64_nn", 100)
        b.finish()
        return b


RULE = CaptureProblem()

"""memory-growth: memory rises step after step through the run: something keeps tensors alive (a leak).

## What it detects
The memory samples of the whole run's step record (`gpuadvise profile` takes one every few steps): on a
GPU the caching allocator's allocated bytes (memory held by live tensors), else the process's resident
memory. From the end of window 1 on (the first steps fill caches and buffers), their slope (the median of
the pairwise slopes: a few jumps do not move it) and how often they rose from one sample to the next. A
steady rise is memory that is never given back: a list that keeps every step's loss or outputs with
their autograd graph, a cache keyed by something that never repeats, tensors stored on a module.

## Why it matters
It ends in an out-of-memory error hours into the run, and before that in an allocator that searches and
splits blocks, frees its cache and retries (`memory-pressure`, `allocator-churn`): the step slows down as
memory fills up.

## Fix
```python
losses.append(loss.item())          # a number, not the tensor with its graph
outputs.append(out.detach().cpu())  # or keep none: accumulate a metric instead
# and find what holds them:
#   torch.cuda.memory._record_memory_history(); ...; torch.cuda.memory._dump_snapshot("leak.pickle")
```

## Thresholds
Fires when the memory grew by at least 32 MiB and 5 % of its starting level over the samples, rising in at
least 60 % of the intervals between them, with at least 5 samples after window 1. No step time is
predicted to be saved (the cost is the run's end, not its speed); severity high when the device (from
run.json) would be full within ten times the steps recorded so far, else medium. Where the run recorded
CUDA memory history, the allocation sites live at its peak are listed.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.longrun import RunFolder, Window, trace_for

from .base import RunRule

MB = 2**20


class MemoryGrowth(RunRule):
    code = "GA162"
    name = "memory-growth"
    title = "Memory grows step after step (a leak)"
    thresholds = {"min_growth_mb": 32.0, "min_growth_pct": 5.0, "min_rising_share": 0.6, "full_within_x": 10.0}

    def check(self, a: RunAnalysis):
        t = self.thresholds
        first = a.window(1)
        m = a.memory_trend(from_step=first.steps[1] + 1 if first is not None and first.steps else 0)
        if m is None or m.per_step_bytes <= 0:
            return []
        growth = m.growth_bytes
        if growth < t["min_growth_mb"] * MB or growth < t["min_growth_pct"] / 100 * m.start_bytes \
                or m.rising_share < t["min_rising_share"]:
            return []
        what = "allocated GPU memory (live tensors)" if m.kind == "allocated" else "the process's resident memory"
        message = (f"{what[0].upper()}{what[1:]} grew by {growth / MB:.0f} MiB over steps {m.steps[0]}–{m.steps[1]} "
                   f"({m.per_step_bytes / 1024:.0f} KiB per step, rising in {m.rising_share * 100:.0f} % of "
                   f"{m.samples - 1} intervals between samples), from {m.start_bytes / MB:.0f} to {m.end_bytes / MB:.0f} MiB.")
        severity = "medium"
        numbers = {"growth_mb": round(growth / MB, 1), "per_step_kb": round(m.per_step_bytes / 1024, 1),
                   "start_mb": round(m.start_bytes / MB, 1), "end_mb": round(m.end_bytes / MB, 1),
                   "rising_share_pct": round(m.rising_share * 100, 1), "samples": m.samples, "memory": m.kind}
        capacity = runfacts.device_memory(a.facts) if m.kind == "allocated" else None
        if capacity:
            left = max(0.0, capacity - m.end_bytes) / m.per_step_bytes
            numbers["steps_until_full"] = int(left)
            message += f" At this rate the device's {capacity / 2**30:.0f} GiB are full in about {int(left):,} more steps."
            if left <= t["full_within_x"] * (m.steps[1] or 1):
                severity = "high"
        sites = _sites(first)
        if sites:
            message += " Allocation sites live at the memory history's peak: " + ", ".join(
                f"{s['name']} ({s['mb']:.0f} MiB)" for s in sites[:3]) + "."
        evidence = Evidence(steps=[m.steps[0], m.steps[1]], items=sites, numbers=numbers)
        basis = "no step time: memory that is never freed ends the run (out of memory), it does not slow each step"
        advice = ("Find what keeps tensors from one step to the next: lists or dicts that collect losses, outputs or "
                  "gradients (store `.item()` or `.detach().cpu()`), caches that grow, tensors kept on modules.")
        return [self.finding(message=message, evidence=evidence, saving=0.0, basis=basis, advice=advice,
                             severity=severity)]

    # -- fixtures ---------------------------------------------------------------------------------------
    def positive(self) -> RunFolder:
        return _run(leak_mb_per_step=1.0)

    def negative(self) -> RunFolder:
        return _run(leak_mb_per_step=0.0)


def _sites(window) -> list[dict]:
    """The top allocation sites of window 1's CUDA memory history, when the run recorded one."""
    mem = getattr(window.report, "memory", None) if window is not None and window.report is not None else None
    history = getattr(mem, "history", None)
    out = []
    for s in (history.top_sites if history is not None else [])[:5]:  # measure/memory.py: name, live_at_peak_mib
        out.append({"name": str(s.get("name") or "?"), "mb": float(s.get("live_at_peak_mib") or 0.0)})
    return out


def _run(leak_mb_per_step: float) -> RunFolder:
    """100 steps of 2 ms; resident memory sampled every 5 steps, from 600 MiB (jitter of ±2 MiB)."""
    ms = {n: 2.0 + 0.01 * (n % 3) for n in range(1, 101)}
    w1 = Window(1, "schedule", start=3)
    b = trace_for(w1)
    for _ in range(3):
        with b.step():
            b.cpu("aten::addmm", 1_500.0)
    w1.trace = b
    memory = [(n, int((600 + leak_mb_per_step * n + (2 if n % 10 else -2)) * MB), None, None) for n in range(5, 101, 5)]
    return RunFolder(ms, [w1], memory=memory)


RULE = MemoryGrowth()

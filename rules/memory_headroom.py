"""memory-headroom: most of the GPU's memory is unused while the GPU itself waits.

## What it detects
A trace whose memory peak (reserved, the larger of the two, from the `[memory]` events, a snapshot or
`memory_stats()`) stays far below the device's capacity, while the GPU is busy for less than half of
each step. Capacity comes from the trace's deviceProperties or run.json; without it the rule is silent.

## Why it matters
A GPU that idles between small kernels is paying a fixed cost per step (Python, launches, the
optimizer step, syncs) that a larger batch spreads over more samples. Unused memory is the room to do
it: the per-sample throughput rises even though each step gets longer.

## Fix
Raise the batch size step by step while memory stays below about 80 % of the device:
```python
loader = DataLoader(dataset, batch_size=2 * batch_size, num_workers=8, pin_memory=True)
# keep the optimisation comparable: scale the learning rate with the batch (and warm it up)
optimizer = torch.optim.AdamW(model.parameters(), lr=2 * base_lr)
```
If the batch size is fixed by the recipe, use the room differently: a larger model or sequence length,
or fewer, larger kernels (`torch.compile`, when the model is not compiled yet). The finding's fix leaves
out what the input shows on already (the loader's workers and pinning, torch.compile).

The batch multiple is offered for training steps only (a forward pass alone does not show how memory
grows with the batch), and at most 8× (three doublings) however empty the device is.

## Thresholds
Fires when the peak is below 40 % of device memory and the GPU is busy less than 50 % of the step
time (the threshold of low-gpu-utilization, from the PyTorch TensorBoard plugin). 40 %: doubling the
batch at most doubles the footprint (weights, gradients and optimizer state do not grow with it), so
a doubled batch stays under 80 %. Silent when the DataLoader takes 5 % of the step or more (a larger
batch makes each load longer too: fix the loader first, see dataloader-stall) and after any
out-of-memory or cudaMalloc retry. The predicted step-time saving is 0: a larger batch buys
throughput, not a shorter step.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import switches_on

from .base import Rule


def _fix(a: Analysis) -> str:
    """The Fix with the loader's switches and torch.compile only where they are off."""
    on = switches_on(a)
    args = [a2 for k, a2 in (("workers", "num_workers=8"), ("pin_memory", "pin_memory=True")) if k not in on]
    loader = "loader = DataLoader(dataset, batch_size=2 * batch_size" + "".join(f", {x}" for x in args) + ")"
    room = ("a larger model or sequence length" if "compile" in on else
            "fewer, larger kernels (`torch.compile`), or a larger model or sequence length")
    return ("Raise the batch size step by step while memory stays below about 80 % of the device:\n```python\n"
            f"{loader}\n# keep the optimisation comparable: scale the learning rate with the batch (and warm it up)\n"
            "optimizer = torch.optim.AdamW(model.parameters(), lr=2 * base_lr)\n```\n"
            f"If the batch size is fixed by the recipe, use the room differently: {room}.")

GiB = 2**30
GEMM = "ampere_tf32_s1688gemm_64x64_nn"


class MemoryHeadroom(Rule):
    code = "GA123"
    name = "memory-headroom"
    title = "Most of the GPU's memory is unused while the GPU waits"
    requires = ("trace", "memory")
    thresholds = {"max_peak_pct_of_capacity": 40.0, "max_busy_pct": 50.0, "max_dataloader_pct": 5.0}

    def check(self, a: Analysis):
        mem, m, t = a.memory, a.metrics, self.thresholds
        peak = max(v or 0 for v in mem.high_water) or None
        pct = mem.pct_of_capacity(peak)
        if pct is None or pct >= t["max_peak_pct_of_capacity"]:
            return []
        if mem.ooms or (mem.counters and mem.counters.num_alloc_retries):
            return []
        busy = m.busy_in_steps_pct if m.steps else m.gpu_busy_pct
        if busy is None or busy >= t["max_busy_pct"]:
            return []
        ps = m.per_step
        loader_pct = 100.0 * ps["dataloader_us"].sum() / max(ps["dur_us"].sum(), 1e-9) if len(ps) else 0.0
        if loader_pct >= t["max_dataloader_pct"]:
            return []  # the loader is the bottleneck: a bigger batch only makes each wait longer
        message = (f"GPU memory peaked at {peak / GiB:.2f} GiB, {pct:.1f} % of the {mem.capacity / GiB:.2f} GiB "
                   f"on the device, while the GPU was busy only {busy:.1f} % of the step time: a larger batch "
                   "would spread each step's fixed cost over more samples.")
        if a.trains:
            advice = (f"Even if the whole footprint grew with the batch, {min(int(80 // max(pct, 1.0)), 8)}× the batch would "
                      "stay under 80 % of the device's memory (weights and optimizer state do not grow with it); go there "
                      "in doublings, measuring each.")
        else:
            # a forward pass alone says nothing about how memory grows with the batch: no multiple is claimed
            advice = ("This trace holds no training step (no backward, no optimizer step): batch more requests or "
                      "samples per forward pass, doubling and measuring, rather than by a multiple read off this trace.")
        return [self.finding(
            message=message, severity="low",
            evidence=Evidence(numbers={"peak_gib": round(peak / GiB, 2), "peak_pct_of_capacity": round(pct, 1),
                                       "capacity_gib": round(mem.capacity / GiB, 2), "gpu_busy_pct": round(busy, 1),
                                       "dataloader_pct": round(loader_pct, 1)}),
            saving=0.0, basis="throughput, not step time: a larger batch makes each step longer and each sample "
                              "cheaper; no step-time saving is predicted",
            advice=advice, fix=_fix(a))]

    def positive(self) -> TraceBuilder:
        return _trace(allocated_gib=6, reserved_gib=8)  # 10 % of an 80 GiB A100

    def negative(self) -> TraceBuilder:
        return _trace(allocated_gib=30, reserved_gib=34)  # 42 %: a doubled batch would not fit comfortably


def _trace(allocated_gib: float, reserved_gib: float) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.memory(GiB, int(allocated_gib * GiB), int(reserved_gib * GiB))
            b.idle(3_000)  # Python and optimizer work with nothing queued on the GPU
            for _ in range(10):
                b.kernel(GEMM, 100)
            b.sync()
            b.memory(-GiB, int((allocated_gib - 1) * GiB), int(reserved_gib * GiB))
    b.finish()
    return b


RULE = MemoryHeadroom()

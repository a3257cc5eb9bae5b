"""memory-pressure: the run is at the edge of GPU memory (peak near capacity, out-of-memory, retries).

## What it detects
- out-of-memory events in the allocator history (`oom` entries, with the request that failed and
  what was free on the device) or in `memory_stats()["num_ooms"]`;
- cudaMalloc retries (`memory_stats()["num_alloc_retries"]`): a cudaMalloc failed, the allocator
  freed its whole cache and tried again;
- allocation peaking near the device's capacity (from the trace's `[memory]` events, the snapshot
  history or `memory_stats()`; capacity from the trace's deviceProperties or run.json).

## Why it matters
An out-of-memory kills the run. A retry is a stall: every cached block goes back to CUDA (each
cudaFree synchronizes the device) and the next steps cudaMalloc them again. A peak near capacity
means the next longer sequence or bigger batch is one of those.

## Fix
Make the peak smaller; each of these keeps the model and the effective batch:
```python
# bf16 autocast: activations in half the bytes (Ampere or newer; fp16 with GradScaler before that)
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(inputs).loss

# activation checkpointing: recompute a block's activations in backward instead of keeping them
from torch.utils.checkpoint import checkpoint
hidden = checkpoint(block, hidden, use_reentrant=False)

# gradient accumulation: the same effective batch in 4 smaller micro-batches
for micro in batch.chunk(4):
    (model(micro).loss / 4).backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
```
If the failed request was smaller than the memory stranded in fragmented segments, fix the
fragmentation first (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, see memory-fragmentation).

## Thresholds
Fires on any out-of-memory event, on any cudaMalloc retry (the allocator only retries after a failed
cudaMalloc, so one is already a near miss), or when allocation peaks at 90 % of device memory or more
(the PyTorch TensorBoard plugin's threshold for its memory recommendation). Severity: high for an
out-of-memory, medium otherwise. It saves memory, not step time: the predicted step-time saving is 0.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.memory import NO_SITE
from gpuadvise.fixtures.snapshot import GiB, MiB, SnapshotBuilder, free, live

from .base import Rule


class MemoryPressure(Rule):
    code = "GA122"
    name = "memory-pressure"
    topic = "memory-pressure"
    title = "GPU memory is at its limit"
    requires = ("memory",)
    thresholds = {"peak_pct_of_capacity": 90.0}

    def check(self, a: Analysis):
        mem = a.memory
        h, c, s = mem.history, mem.counters, mem.snapshot
        retries = (c.num_alloc_retries or 0) if c else 0
        peak = mem.high_water[0]
        peak_pct = mem.pct_of_capacity(peak)
        near = peak_pct is not None and peak_pct >= self.thresholds["peak_pct_of_capacity"]
        if not (mem.ooms or retries or near):
            return []
        parts, advice = [], []
        if peak_pct is not None:
            parts.append(f"Allocation peaked at {_gib(peak)}, {peak_pct:.1f} % of the GPU's {_gib(mem.capacity)}"
                         + (f" (reserved: {_gib(mem.high_water[1])})." if mem.high_water[1] else "."))
        first = h.ooms[0] if h is not None and h.ooms else None
        if first is not None:
            free_txt = f" with {_gib(first['device_free_bytes'])} free on the device" if first["device_free_bytes"] else ""
            parts.append(f"The run hit out-of-memory {mem.ooms}×: a request for {_gib(first['requested_bytes'])} failed{free_txt}.")
            if s is not None and s.stranded >= first["requested_bytes"]:
                advice.append(f"{_gib(s.stranded)} was stranded in fragmented segments, more than the failed request: "
                              "fix the fragmentation first (`expandable_segments:True`).")
        elif mem.ooms:
            parts.append(f"memory_stats() counts {mem.ooms} out-of-memory errors.")
        if retries:
            parts.append(f"memory_stats() counts {retries} cudaMalloc retries: each freed the allocator's whole cache "
                         "and called cudaMalloc again.")
        advice.insert(0, "Lower the peak: bf16 autocast, activation checkpointing, or gradient accumulation over "
                         "smaller micro-batches.")
        sites = (h.top_sites if h is not None else []) or (s.top_sites if s is not None else [])
        numbers = {"ooms": mem.ooms, "alloc_retries": retries, "peak_allocated_gib": _g(peak),
                   "peak_reserved_gib": _g(mem.high_water[1]), "capacity_gib": _g(mem.capacity),
                   "peak_pct_of_capacity": round(peak_pct, 1) if peak_pct is not None else None}
        if first is not None:
            numbers.update(failed_request_gib=_g(first["requested_bytes"]), device_free_gib=_g(first["device_free_bytes"]))
        return [self.finding(
            message=" ".join(parts), evidence=Evidence(items=sites, numbers=numbers, sources=_sources(sites)),
            saving=0.0, severity="high" if mem.ooms else "medium", advice=" ".join(advice),
            basis="memory, not step time: this is about what fits (and out-of-memory retries); no step-time "
                  "saving is predicted")]

    def positive(self) -> SnapshotBuilder:
        # a 6 GiB request fails with 2 GiB free on the device
        b = SnapshotBuilder()
        b.segment(live(20 * GiB, site=("train.py", 57, "forward")))
        a = b.alloc(512 * MiB, site=("train.py", 57, "forward"))
        b.free(a)
        b.oom(6 * GiB, device_free=2 * GiB)
        return b

    def negative(self) -> SnapshotBuilder:
        # the same run without the failed request
        b = SnapshotBuilder()
        b.segment(live(20 * GiB, site=("train.py", 57, "forward")), free(256 * MiB))
        a = b.alloc(512 * MiB, site=("train.py", 57, "forward"))
        b.free(a)
        return b


def _sources(sites: list[dict]) -> list[str]:
    return [x["name"] for x in sites if x["name"] != NO_SITE][:3]


def _g(n) -> float | None:
    return round(n / GiB, 2) if n is not None else None


def _gib(n) -> str:
    return f"{n / GiB:.2f} GiB"


RULE = MemoryPressure()

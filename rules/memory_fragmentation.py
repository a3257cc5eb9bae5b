"""memory-fragmentation: the allocator holds far more GPU memory than the tensors use, in holes.

## What it detects
In a CUDA caching-allocator snapshot: memory reserved from the GPU (the sum of segment sizes) well
above the memory allocated to tensors, with a large part of the difference *stranded*: free blocks
inside segments that still hold a live tensor. A stranded hole can serve only a request that fits in
it, and `torch.cuda.empty_cache()` cannot give it back, because its segment is in use. The report
also gives the largest free block against the largest live request, and the segments with the most
stranded memory.

A snapshot is a picture of one moment. When it carries the allocator's history, gpuadvise replays it:
if at the highest allocation the history recorded the reserved memory was almost fully used, the
holes at dump time are memory freed after that peak, and the next step will fill them again, so
nothing is reported.

A trace's `[memory]` events alone never trigger this rule: their reserved − allocated gap cannot
tell holes from cache kept for other streams or for a later, larger step.

## Why it matters
Fragmented memory is paid for but unusable: a batch, sequence length or model that would fit in the
allocated bytes does not fit in the reserved ones, and when a request finds no hole big enough the
allocator asks CUDA for a new segment, and on failure frees its whole cache and retries (slow) or
raises out-of-memory although the total free memory would have sufficed.

## Fix
Let the allocator grow segments in place instead of carving fixed-size ones (PyTorch ≥ 2.1):
```python
# first thing in the script, before any CUDA allocation (or `export` it in the launching shell)
import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import torch
```
Keep shapes steady so blocks are reused instead of split anew: pad variable-length batches to a few
fixed lengths, and drop the ragged last batch (`DataLoader(..., drop_last=True)`). Allocate
long-lived tensors (model, optimizer state, caches) before the first step, not between temporaries.
Only as the last resort the PyTorch documentation calls it (for a workload that aborts with
out-of-memory while showing many inactive split blocks), stop the allocator from splitting large
blocks: `PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512`. It trades fragmentation for more cudaMalloc
calls.

## Thresholds
No published tool sets a fragmentation threshold; gpuadvise uses these, checked on real snapshots.
Fires when all of these hold:
- at least 20 % of the reserved memory is unallocated ("reserved ≫ allocated"). A healthy footprint
  runs a few percent above allocation (block rounding, 2 MiB and 20 MiB segment granularity): the
  corpus's fragmentation-free control snapshot has 0.7 %, its fragmented ones 28 % and 65 %;
- the stranded memory is at least 1 GiB, or at least 5 % of the reserved memory and 256 MiB: enough to
  hold a large activation or a bigger batch. Below that, holes are the allocator's normal working
  margin (0.3 % of reserved in the control);
- when the snapshot has a history: at the highest allocation it recorded, at least 5 % of the reserved
  memory was unused (the control: 0.3 %; the fragmented snapshot with a history: 7.2 %). Below that,
  the holes are memory freed after the peak and fragmentation cost nothing.
Severity says how much the stranded memory matters, which depends on how short memory is: high after
an out-of-memory or a cudaMalloc retry, or when the peak (reserved) reaches 90 % of the device; medium
from 75 %; low from 25 % (or when the device's capacity is unknown); below a quarter of the device it
is informational (3 GiB of holes in a run that uses 3 GiB of an 80 GiB GPU cost nothing). It saves
memory, not step time: the predicted step-time saving is 0.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.memory import devices_sentence, user_sites
from gpuadvise.fixtures.snapshot import GiB, MiB, SnapshotBuilder, free, live

from .base import Rule


class MemoryFragmentation(Rule):
    code = "GA120"
    name = "memory-fragmentation"
    title = "GPU memory is fragmented: reserved far above allocated"
    requires = ("memory",)
    thresholds = {"min_unallocated_pct": 20.0, "min_stranded_gib": 1.0, "min_stranded_pct": 5.0,
                  "min_stranded_mib": 256, "min_unused_at_peak_pct": 5.0,
                  "high_peak_pct": 90.0, "medium_peak_pct": 75.0, "low_peak_pct": 25.0}

    def check(self, a: Analysis):
        mem = a.memory
        s = mem.snapshot
        if s is None or not s.reserved:
            return []
        t = self.thresholds
        if s.slack_pct < t["min_unallocated_pct"]:
            return []
        big = s.stranded >= t["min_stranded_gib"] * GiB
        share = s.stranded_pct >= t["min_stranded_pct"] and s.stranded >= t["min_stranded_mib"] * MiB
        if not (big or share):
            return []
        h = mem.history
        if h is not None and h.reserved_at_peak and h.unused_at_peak_pct < t["min_unused_at_peak_pct"]:
            return []  # the footprint was fully used at the peak: these holes are refilled every step
        message = (f"{_gib(s.reserved)} reserved but only {_gib(s.allocated)} allocated to tensors "
                   f"({s.slack_pct:.1f} % unallocated). {_gib(s.stranded)} of it ({s.stranded_pct:.1f} % of reserved) "
                   f"is stranded in {s.stranded_blocks} free blocks inside {s.partly_used_segments} partly used segments, "
                   f"where empty_cache() cannot release it; the largest free block is {_mib(s.largest_free_block)} "
                   f"against a largest live request of {_mib(s.largest_request)}.")
        if s.empty_segment_bytes:
            message += f" Another {_gib(s.empty_segment_bytes)} is cached in segments with nothing allocated."
        if h is not None and h.reserved_at_peak:
            message += (f" At the highest allocation in the history ({_gib(h.peak_allocated)}), "
                        f"{h.unused_at_peak_pct:.1f} % of the {_gib(h.reserved_at_peak)} reserved was unused.")
        expandable = bool(mem.allocator_settings.get("expandable_segments"))
        fix = None
        if expandable:  # the general fix opens with the setting the run already has: keep the rest
            fix = self.fix[self.fix.index("Keep shapes steady"):]
            advice = ("`expandable_segments` is already on: keep shapes steady, and allocate long-lived tensors "
                      "before the step's temporaries.")
        else:
            advice = "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` and keep shapes steady."
        at = h.at_oom if h is not None else None
        if at is not None:
            # the segments above are the state after the failure unwound; the cause is judged at the failure
            cached = at["reserved"] - at["allocated"]
            verdict = ("more than the failed request: fragmentation is the first suspect" if cached >= at["requested"]
                       else "less than the failed request: the device was full, fragmentation did not cause it "
                            "(see memory-pressure)")
            message += (f" These segments were dumped after an out-of-memory unwound; at the failure (replayed from the "
                        f"history) {_gib(cached)} was reserved but unallocated, {verdict}.")
        elif mem.ooms:
            advice += (f" The run hit out-of-memory {mem.ooms}×; these holes were measured when the snapshot was "
                       "dumped, which may be after the failure.")
        others = devices_sentence(mem)
        if others:
            message += " " + others
        unused_peak = h.unused_at_peak_pct if h is not None and h.reserved_at_peak else 0.0
        severity, pressure = self._severity(mem)
        message += " " + pressure
        numbers = {"reserved_gib": _g(s.reserved), "allocated_gib": _g(s.allocated), "unallocated_pct": round(s.slack_pct, 1),
                   "stranded_gib": _g(s.stranded), "stranded_pct_of_reserved": round(s.stranded_pct, 1),
                   "stranded_blocks": s.stranded_blocks, "partly_used_segments": s.partly_used_segments,
                   "segments": s.segments, "empty_segments_gib": _g(s.empty_segment_bytes),
                   "internal_free_gib": _g(s.internal_free), "largest_free_block_mib": round(s.largest_free_block / MiB, 1),
                   "largest_request_mib": round(s.largest_request / MiB, 1), "expandable_segments": expandable}
        if h is not None and h.reserved_at_peak:
            numbers.update(peak_allocated_gib=_g(h.peak_allocated), reserved_at_peak_gib=_g(h.reserved_at_peak),
                           unused_at_peak_pct=round(unused_peak, 1))
        evidence = Evidence(items=s.largest_segments, numbers=numbers,
                            sources=user_sites(h.top_sites if h else s.top_sites))
        numbers["peak_pct_of_capacity"] = _pct(mem)
        return [self.finding(
            message=message, evidence=evidence, saving=0.0, severity=severity,
            basis="memory, not step time: fragmentation costs capacity (a larger batch or model that would fit) "
                  "and slow cudaMalloc retries when memory runs out; no step-time saving is predicted",
            advice=advice, fix=fix)]

    def _severity(self, mem) -> tuple[str, str]:
        """(severity, a sentence on how short memory is): holes matter when memory runs out."""
        t = self.thresholds
        retries = (mem.counters.num_alloc_retries or 0) if mem.counters is not None else 0
        if mem.ooms or retries:
            what = f"{mem.ooms} out-of-memory errors" if mem.ooms else f"{retries} cudaMalloc retries"
            return "high", f"Memory is short: the run had {what}."
        pct = _pct(mem)
        if pct is None:
            return "low", "The device's capacity is unknown, so how much these holes matter cannot be told."
        peak = f"The peak ({_gib(max(v or 0 for v in mem.high_water))}) is {pct:.0f} % of the device's {_gib(mem.capacity)}"
        if pct >= t["high_peak_pct"]:
            return "high", peak + ": the holes are memory the run is about to need."
        if pct >= t["medium_peak_pct"]:
            return "medium", peak + "."
        if pct >= t["low_peak_pct"]:
            return "low", peak + "."
        return "info", peak + ": with that much free, the holes cost nothing today."

    def positive(self) -> SnapshotBuilder:
        # 3.75 GiB reserved, 1.75 GiB allocated: eight 256 MiB segments each pinned by one live tensor
        # with a 128 MiB hole (1 GiB stranded), plus a cached, empty 1 GiB segment
        b = SnapshotBuilder()
        for _ in range(8):
            b.segment(live(128 * MiB, site=("train.py", 41, "forward")), free(128 * MiB))
        b.segment(live(768 * MiB, site=("train.py", 12, "<module>")))
        b.segment(free(1 * GiB))
        return b

    def negative(self) -> SnapshotBuilder:
        # the same 1 GiB of holes, but in a footprint the tensors nearly fill (7 % unallocated)
        b = SnapshotBuilder()
        for _ in range(8):
            b.segment(live(128 * MiB), free(128 * MiB))
        for _ in range(13):
            b.segment(live(1 * GiB))
        return b


def _pct(mem) -> float | None:
    """The peak footprint (reserved, else allocated) as a share of the device's memory."""
    peak = max((v or 0) for v in mem.high_water) or None
    pct = mem.pct_of_capacity(peak)
    return round(pct, 1) if pct is not None else None


def _g(n: int) -> float:
    return round(n / GiB, 2)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"


RULE = MemoryFragmentation()

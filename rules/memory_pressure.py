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
Make the peak smaller; each of these keeps the model and the effective batch. The finding ranks them for
the run, from the memory figures: the part of the peak that outlives a step (weights, gradients,
optimizer state: the lowest allocation after the peak) and the part that comes and goes within it
(activations: peak − that floor), against what was missing (the failed request minus what was free, or
what lies above 90 % of the device):
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
If, at the failure, more memory was reserved but unallocated than the failed request asked for, fix the
fragmentation first (see memory-fragmentation: expandable segments, unless the recorded allocator
settings show them on already).

The state at an out-of-memory is replayed from the allocator history (a snapshot is dumped after the
failure unwound, so its segments show the aftermath); a snapshot of several devices leads with the one
that failed and lists the others with their figures.

## Thresholds
Fires on any out-of-memory event, on any cudaMalloc retry (the allocator only retries after a failed
cudaMalloc, so one is already a near miss), or when allocation peaks at 90 % of device memory or more
(the PyTorch TensorBoard plugin's threshold for its memory recommendation). Severity: high for an
out-of-memory, medium otherwise. It saves memory, not step time: the predicted step-time saving is 0.
Ranking: each remedy's estimate comes from the activation memory A = peak − floor: bf16 autocast stores
activations in half the bytes (≈ A/2 freed; skipped when run.json or the kernel names show fp16/bf16
already), half the micro-batch with twice the accumulation steps holds half the activations (≈ A/2),
activation checkpointing keeps only each checkpointed block's input (up to ≈ A, for about a third more
compute). Remedies that cover what was missing come first, cheaper before dearer (bf16, which also
speeds matmuls up; then accumulation; then checkpointing). When less than a quarter of the peak comes and
goes within a step, the finding says so: the activation remedies cannot free enough, the floor (parameters,
gradients, optimizer state) has to shrink. Without an allocation history or `[memory]` events the floor is
unknown and the remedies keep that order without figures.
"""

from __future__ import annotations

import re

from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.memory import devices_sentence, user_sites
from gpuadvise.fixtures.snapshot import GiB, MiB, SnapshotBuilder, free, live

from .base import Rule


class MemoryPressure(Rule):
    code = "GA122"
    name = "memory-pressure"
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
        expandable = bool(mem.allocator_settings.get("expandable_segments"))
        if first is not None:
            free_txt = f" with {_gib(first['device_free_bytes'])} free on the device" if first["device_free_bytes"] else ""
            parts.append(f"The run hit out-of-memory {mem.ooms}×: a request for {_gib(first['requested_bytes'])} failed{free_txt}.")
            at = h.at_oom
            if at is not None:
                # judge the failure by the allocator's state then, not by the snapshot dumped after it unwound
                filled = "; ".join(f"{x['name']} {x['live_at_peak_mib'] / 1024:.2f} GiB"
                                   for x in at["top_sites"] if x["live_at_peak_mib"] > 0)
                parts.append(f"At the failure (replayed from the allocator history) {_gib(at['allocated'])} was allocated "
                             f"and {_gib(at['reserved'])} reserved" + (f"; what filled it: {filled}" if filled else "")
                             + ". The snapshot was dumped after the failure unwound: its segments show the aftermath.")
                cached = at["reserved"] - at["allocated"]
                if cached >= first["requested_bytes"]:
                    advice.append(_fragmentation_advice(cached, "reserved but unallocated at the failure", expandable))
            elif s is not None and s.stranded >= first["requested_bytes"]:
                advice.append(_fragmentation_advice(s.stranded, "stranded in fragmented segments when the snapshot was "
                                                    "dumped (after the failure)", expandable))
        elif mem.ooms:
            parts.append(f"memory_stats() counts {mem.ooms} out-of-memory errors.")
        if retries:
            parts.append(f"memory_stats() counts {retries} cudaMalloc retries: each freed the allocator's whole cache "
                         "and called cudaMalloc again.")
        ranked, ranking, rnumbers = _ranked_remedies(a, mem, first, peak_pct, self.thresholds["peak_pct_of_capacity"])
        advice.insert(0, ranking)
        sites = (h.top_sites if h is not None else []) or (s.top_sites if s is not None else [])
        numbers = {"ooms": mem.ooms, "alloc_retries": retries, "peak_allocated_gib": _g(peak),
                   "peak_reserved_gib": _g(mem.high_water[1]), "capacity_gib": _g(mem.capacity),
                   "peak_pct_of_capacity": round(peak_pct, 1) if peak_pct is not None else None}
        if first is not None:
            numbers.update(failed_request_gib=_g(first["requested_bytes"]), device_free_gib=_g(first["device_free_bytes"]))
            if h.at_oom is not None:
                numbers.update(allocated_at_oom_gib=_g(h.at_oom["allocated"]), reserved_at_oom_gib=_g(h.at_oom["reserved"]))
        numbers["expandable_segments"] = expandable
        others = devices_sentence(mem)
        if others:
            parts.append(others)
            numbers["other_devices"] = [{"device": d["device"], "reserved_gib": _g(d["reserved"]),
                                         "allocated_gib": _g(d["allocated"]), "ooms": d["ooms"]} for d in mem.other_devices]
        numbers.update(rnumbers, remedies=ranked)
        return [self.finding(
            message=" ".join(parts), evidence=Evidence(items=sites, numbers=numbers, sources=user_sites(sites)),
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


HALF_PRECISION = re.compile(r"bf16|bfloat16|fp16|f16|half|h884|h1688|hmma|_HHS_|_BBS_", re.I)


def _ranked_remedies(a: Analysis, mem, first_oom, peak_pct, threshold_pct) -> tuple[list[dict], str, dict]:
    """The standard remedies, ranked for this run from its memory figures: (remedies, advice text, numbers)."""
    part = mem.history if mem.history is not None else mem.trace
    peak = getattr(part, "peak_allocated", None)
    floor = getattr(part, "floor_allocated", None)
    act = peak - floor if peak is not None and floor is not None and 0 <= floor <= peak else None
    need = None
    if first_oom is not None and first_oom["device_free_bytes"]:
        need = max(first_oom["requested_bytes"] - first_oom["device_free_bytes"], 0)
    elif peak_pct is not None and peak_pct >= threshold_pct and mem.capacity:
        need = int(mem.high_water[0] - threshold_pct / 100 * mem.capacity)
    half = _half_precision(a)
    options = []
    if not half:
        options.append(("bf16 autocast", act / 2 if act is not None else None, 0,
                        "activations in half the bytes; also faster matmuls on Tensor Cores (Ampere or newer; fp16 "
                        "with a GradScaler before)"))
    options.append(("half the micro-batch, twice the gradient-accumulation steps", act / 2 if act is not None else None, 1,
                    "the same effective batch; smaller kernels, so somewhat lower GPU efficiency"))
    options.append(("activation checkpointing", act, 2,
                    "keeps only each checkpointed block's input, recomputed in backward: about a third more compute"))
    covers = [need is not None and freed is not None and freed >= need for _, freed, _, _ in options]
    order = sorted(range(len(options)), key=lambda i: (not covers[i], options[i][2]))
    ranked = [{"remedy": options[i][0], "frees_gib": _g(int(options[i][1])) if options[i][1] is not None else None,
               "upper_bound": options[i][0] == "activation checkpointing", "covers_need": covers[i] if need is not None else None,
               "cost": options[i][3]} for i in order]
    numbers = {"floor_gib": _g(floor), "activations_gib": _g(act), "missing_gib": _g(need),
               "half_precision_already": half}
    if act is None:
        text = ("Lower the peak. This run's figures do not show how much of it comes and goes within a step (no "
                "allocation history or [memory] events), so in the usual order: "
                + "; ".join(f"{n}. {r['remedy']} ({r['cost']})" for n, r in enumerate(ranked, 1)) + ".")
    else:
        lines = []
        for n, r in enumerate(ranked, 1):
            amount = f"{'up to ' if r['upper_bound'] else 'about '}{r['frees_gib']:.2f} GiB"
            verdict = "" if need is None else (" (enough)" if r["covers_need"] else " (not enough alone)")
            if r["remedy"] == "bf16 autocast" and half is None:
                # a snapshot records sizes, not dtypes: the halving holds only for fp32 activations
                amount += " if the activations are fp32 today (the input does not record their dtype)"
            lines.append(f"{n}. {r['remedy']}: frees {amount}{verdict}; {r['cost']}")
        text = (f"Lower the peak, ranked for this run: {_gib(peak)} at the peak, {_gib(floor)} of it outlives the step "
                f"(weights, gradients, optimizer state), {_gib(act)} comes and goes within it"
                + (f"; {_gib(need)} was missing" if need is not None else "") + ". " + "; ".join(lines) + "."
                + (" Already in half precision (run.json's autocast or the kernel names), so bf16 is not listed." if half else ""))
        if act < 0.25 * peak:
            text += (f" Only {100 * act / max(peak, 1):.0f} % of the peak comes and goes within a step: these remedies "
                     "cannot free much; shrink what outlives it (shard parameters, gradients and optimizer state with "
                     "FSDP/ZeRO, or use an optimizer with less state).")
    return ranked, text, numbers


def _fragmentation_advice(nbytes: int, where: str, expandable: bool) -> str:
    """Fragmentation as the first suspect, prescribing only what the recorded settings do not already have."""
    text = f"{_gib(nbytes)} was {where}, more than the failed request: "
    if expandable:
        return text + ("fragmentation is the first suspect, and `expandable_segments` is already on (the snapshot's "
                       "allocator settings): keep shapes steady and allocate long-lived tensors before the step's "
                       "temporaries.")
    return text + "fix the fragmentation first (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`)."


def _half_precision(a: Analysis) -> bool | None:
    """bf16/fp16 already in use: an autocast context in run.json, or most matmul kernel time in half-precision
    kernels. None when neither source exists (a snapshot alone records no dtypes)."""
    if any(("bfloat16" in d or "float16" in d) for d in runfacts.autocast_dtypes(a.facts)):
        return True
    if a.metrics is None or a.metrics.kernels.empty:
        return None
    k = a.metrics.kernels
    mm = k[k["matmul"].astype(bool)]
    if mm.empty:
        return None
    half = mm["name"].map(lambda n: bool(HALF_PRECISION.search(n)))
    return float(mm.loc[half, "total_us"].sum()) >= 0.5 * float(mm["total_us"].sum())




def _g(n) -> float | None:
    return round(n / GiB, 2) if n is not None else None


def _gib(n) -> str:
    return f"{n / GiB:.2f} GiB"


RULE = MemoryPressure()

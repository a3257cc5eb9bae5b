"""unneeded-recompute: activation checkpointing runs the forward again while the GPU has memory to spare.

## What it detects
Forward ops run again inside the backward (analyzer/measure/efficiency/recompute.py): `torch.utils.checkpoint`
re-entrant or not, selective checkpointing, Hugging Face's `gradient_checkpointing_enable()`, or a
framework's own recompute. The trace shows them as ops recorded with grad mode on inside the autograd
engine's backward nodes. Against them: the memory the run left on the device (its peak from the
`[memory]` events, the allocator history or `memory_stats()`, against the device's capacity) and the
memory keeping the recomputed activations would take (the `[memory]` events inside the recompute, or,
without them, the inputs the recomputed matmuls, convolutions and attention ops save, from their
recorded shapes, scaled by 34/22 to a whole transformer layer's activations: Korthikanti et al. 2022
count 34·s·b·h bytes per layer, 22·s·b·h of them those inputs).

## Why it matters
Checkpointing trades compute for memory: every checkpointed segment's forward runs twice, about a third
more compute for a model checkpointed throughout. That trade is worth it only when the activations would
not fit. When the peak leaves room for them, the recompute is step time spent for nothing.

## Fix
```python
# room for every layer's activations: stop checkpointing
h = block(h)                                   # instead of checkpoint(block, h, use_reentrant=False)
model.gradient_checkpointing_disable()         # a Hugging Face model
# room for some: checkpoint only every k-th layer
h = checkpoint(block, h, use_reentrant=False) if i % k == 0 else block(h)
# or keep the matmul outputs and recompute only the cheap elementwise ops (selective checkpointing)
from functools import partial
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
policy = lambda ctx, op, *a, **k: (CheckpointPolicy.MUST_SAVE if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
                                   else CheckpointPolicy.PREFER_RECOMPUTE)
h = checkpoint(block, h, use_reentrant=False, context_fn=partial(create_selective_checkpoint_contexts, policy))
```

## Thresholds
Fires when the recompute takes at least 3 % of the median step (its GPU kernel time, or its CPU time
on a trace without a GPU) and keeping at least one checkpointed segment's activations per step stays
under 90 % of the device's memory (memory-pressure's threshold, so the two never disagree): peak + the
activations kept ≤ 90 % of capacity. The fix is as many segments as fit (all of them: no checkpointing),
and the predicted saving is the replay of the steps without those segments' recomputed forward (its ops'
CPU time, launches and kernels). Quiet where even one segment would not fit. Where the trace does not
say how much memory is left (no `[memory]` events, allocator history or `memory_stats()`, or no device
capacity), or how much the activations take, the finding is informational, says which is missing and
how to record it, and quotes the recompute's share as what it costs.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.efficiency import recompute
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.memory import GPU_DEVICE_TYPES
from gpuadvise.analyzer.measure.basics.spans import gpu_ops_launched_in
from gpuadvise.analyzer.measure.basics.steps import launch_steps
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.transformer import training_loop

from .base import Rule

GiB = 2**30
# A transformer layer keeps 34·s·b·h bytes of activations in 16-bit training (Korthikanti et al., "Reducing
# Activation Recomputation in Large Transformer Models", 2022, without its attention scores, which a fused
# kernel does not keep), 22·s·b·h of them the inputs of its four linears and of attention (q, k, v, output):
# what the recorded shapes give. Their ratio scales a shapes count up to the whole layer's.
LAYER_OVER_MATMUL_INPUTS = 34 / 22


class UnneededRecompute(Rule):
    code = "GA124"
    name = "unneeded-recompute"
    title = "Activation checkpointing recomputes what memory could hold"
    thresholds = {"min_share_pct": 3.0, "max_peak_pct_of_capacity": 90.0}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        rc = recompute.find(a.model, m.launches)
        if rc is None or m.median_step_us <= 0:
            return []
        per = recompute.per_step(rc, m)
        on_gpu = m.has_gpu and rc.kernels is not None and len(rc.kernels) > 0
        cost_us = perstep.median(per["gpu_us"] if on_gpu else per["cpu_us"])
        share = 100.0 * cost_us / m.median_step_us
        if share < t["min_share_pct"]:
            return []
        groups = np.unique(rc.groups)
        steps_of = _group_steps(m, rc, groups)
        segments = perstep.median(np.bincount(steps_of[steps_of >= 0], minlength=max(len(m.steps), 1))) or len(groups)
        device_types = GPU_DEVICE_TYPES if m.has_gpu else (0,)
        saved, how = recompute.saved_bytes(a.model, rc, device_types)
        acts_step = _per_step(m, steps_of, saved) if saved is not None else None
        if acts_step and how == "shapes":  # the matmuls' and attention's inputs: scaled to a whole layer's
            acts_step *= LAYER_OVER_MATMUL_INPUTS
        peak, capacity = _peak(a)
        n_seg = max(int(round(segments)), 1)
        per_segment = acts_step / n_seg if acts_step else None
        fit = None  # segments per step whose activations fit
        if peak is not None and capacity and per_segment:
            room = t["max_peak_pct_of_capacity"] / 100.0 * capacity - peak
            fit = int(min(n_seg, max(room, 0.0) // per_segment))
            if fit == 0:
                return []  # memory is tight: the recompute buys the room it needs
        kept = _choose(rc, groups, steps_of, fit if fit is not None else n_seg)
        saving, basis = self._replay(a, rc, kept)
        if saving is None:  # a CPU-only trace: the steps are CPU time, the recompute part of it
            g = rc.group_spans
            share_kept = perstep.median(perstep.issued(m, g["ts"], (g["end"] - g["ts"]) * g.index.isin(kept)))
            saving = 100.0 * share_kept / m.median_step_us
            basis = "CPU-only trace: the removed segments' recompute (CPU time) over the median step"
        what = _form(rc, a)
        where = "GPU" if on_gpu else "CPU"
        message = (f"{what} runs the forward of {perstep.count_of(n_seg, 'checkpointed segment')} again inside the "
                   "backward: "
                   f"{perstep.a_median(m)}{cost_us / 1e3:.2f} ms of {where} time per step, {share:.1f} % of "
                   f"{perstep.the_median_step(m)}.")
        numbers = {"recompute_ms_per_step": round(cost_us / 1e3, 3), "recompute_share_pct_of_step": round(share, 1),
                   "recomputed_ops_per_step": perstep.median(per["ops"]), "segments_per_step": n_seg,
                   "statistic": "median step",
                   "peak_gib": round(peak / GiB, 2) if peak is not None else None,
                   "capacity_gib": round(capacity / GiB, 2) if capacity else None,
                   "saved_activations_mib_per_step": round(acts_step / 2**20, 3) if acts_step else None,
                   "activations_measured_by": how or None}
        severity, advice = None, ""
        if fit is None:
            severity = "info"
            missing = _missing(peak, capacity, acts_step, how, m.has_gpu)
            message += f" Whether the activations would fit is not known: {missing}."
            advice = (f"If memory allows, checkpointing fewer layers saves up to {saving:.1f} % of the step "
                      f"(none checkpointed). {_record_hint(m.has_gpu)}")
            if acts_step:
                advice += (f" The recomputed segments keep {'' if how == 'memory events' else 'about '}"
                           f"{_gib(acts_step)} of activations per step ({_how(how)}).")
        else:
            after = peak + fit * per_segment
            pct_after = 100.0 * after / capacity
            if fit >= n_seg:
                advice = (f"Memory peaked at {_gib(peak)} of {_gib(capacity)} ({100 * peak / capacity:.0f} %); keeping "
                          f"every segment's activations ({_gib(acts_step)} per step, {_how(how)}) takes it to about "
                          f"{pct_after:.0f} %. Stop checkpointing: {_off(rc, a)}; predicted to save {saving:.1f} % of the step.")
            else:
                advice = (f"Memory peaked at {_gib(peak)} of {_gib(capacity)}; there is room for the activations of "
                          f"{fit} of the {n_seg} checkpointed segments per step ({_gib(per_segment)} each, {_how(how)}), "
                          f"to about {pct_after:.0f} % of the device. Checkpoint {n_seg - fit} of them (predicted to save "
                          f"{saving:.1f} % of the step), or checkpoint selectively (keep the matmul outputs, recompute "
                          "the elementwise ops).")
            message += f" The device has room to keep {'them' if fit >= n_seg else f'{fit} of them'} instead."
        if on_gpu and saving < share / 2:  # the recompute's kernels overlap other work
            message += f" Removing it would save less ({saving:.1f} %): {a.bound_by()}."
        numbers["segments_kept"] = fit
        items = [{"name": name, "count": int(count)} for name, count in
                 rc.ops["name"].value_counts().head(6).items()]
        spans = rc.group_spans.head(5)
        evidence = Evidence(steps=[s.number for s in m.steps], items=items, numbers=numbers,
                            time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in zip(spans["ts"], spans["end"])])
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             severity=severity)]

    def _replay(self, a: Analysis, rc, kept: np.ndarray) -> tuple[float | None, str]:
        spans = rc.group_spans.loc[kept]
        kernels = rc.kernels
        corr = set(gpu_ops_launched_in(a.model, kernels, spans)["correlation"]) if kernels is not None and len(kernels) else set()
        return a.predicted_saving(Scenario(
            f"{len(kept)} recompute segment{'s' if len(kept) != 1 else ''} of the window not run: their CPU "
            "time, launches and kernels removed",
            cpu_removed=iv.union(spans["ts"].to_numpy(dtype=float), spans["end"].to_numpy(dtype=float)),
            remove=lambda calls: calls["correlation"].isin(corr).to_numpy(),
            gpu_time=lambda o: np.where(o["correlation"].isin(corr).to_numpy(), 0.0, np.nan)))

    # -- fixtures ----------------------------------------------------------------------------------------
    def positive(self):
        # every layer checkpointed, memory at 30 of 80 GiB: room for the activations
        return training_loop(checkpoint=True, memory_gib=30)

    def negative(self):
        # the same loop at 75 of 80 GiB: the checkpointing buys the room it needs
        return training_loop(checkpoint=True, memory_gib=75)


RULE = UnneededRecompute()


def _group_steps(m, rc, groups: np.ndarray) -> np.ndarray:
    """Per group: the index (into m.steps) of the iteration that issued it (-1: none)."""
    first = rc.ops.groupby(rc.groups)["ts"].min().reindex(groups).to_numpy(dtype=float)
    if not m.steps:
        return np.zeros(len(groups), dtype=np.int64)
    return launch_steps(m.steps, first)


def _per_step(m, steps_of: np.ndarray, values: np.ndarray) -> float:
    if not m.steps:
        return float(values.sum())
    ok = steps_of >= 0
    return perstep.median(np.bincount(steps_of[ok], weights=values[ok], minlength=len(m.steps)))


def _choose(rc, groups: np.ndarray, steps_of: np.ndarray, per_step: int) -> np.ndarray:
    """The groups to stop recomputing: per step, the `per_step` whose recompute took longest (GPU time
    where known, else CPU time)."""
    g = rc.group_spans
    cost = (g["end"] - g["ts"]).reindex(groups).to_numpy(dtype=float)
    k = rc.kernels
    if k is not None and len(k):
        held = _launched_group(k, rc)
        gpu = np.bincount(np.searchsorted(groups, held[held >= 0]),
                          weights=k["gpu_us"].to_numpy(dtype=float)[held >= 0], minlength=len(groups))
        if gpu.any():
            cost = gpu
    out = []
    for s in np.unique(steps_of):
        mine = np.flatnonzero(steps_of == s)
        out += list(groups[mine[np.argsort(-cost[mine], kind="stable")][:per_step]])
    return np.asarray(out)


def _launched_group(kernels, rc) -> np.ndarray:
    """Per kernel: the group of the recomputed op whose span holds its launch (-1: none). The recomputed
    ops are outermost: they do not overlap on a thread."""
    out = np.full(len(kernels), -1, dtype=np.int64)
    k_ts, k_tid = kernels["launch_ts"].to_numpy(dtype=float), kernels["tid"].to_numpy()
    o_ts, o_end, o_tid = (rc.ops[c].to_numpy() for c in ("ts", "end", "tid"))
    for t in np.unique(o_tid):
        mine = np.flatnonzero(o_tid == t)  # in time order (rc.ops is)
        on = np.flatnonzero(k_tid == t)
        j = np.searchsorted(o_ts[mine], k_ts[on], side="right") - 1
        ok = (j >= 0) & (k_ts[on] <= o_end[mine][np.clip(j, 0, None)])
        out[on[ok]] = rc.groups[mine[j[ok]]]
    return out


def _peak(a: Analysis) -> tuple[float | None, float | None]:
    """The memory peak (the larger of allocated and reserved at their highest) and the device's capacity."""
    mem = a.memory
    capacity = (mem.capacity if mem is not None and mem.capacity else None) or (
        a.device.total_memory if a.device is not None and a.metrics.has_gpu else None)
    if mem is None:
        return None, capacity
    values = [v for v in mem.high_water if v]
    return (float(max(values)) if values else None), capacity


def _form(rc, a: Analysis) -> str:
    fw = runfacts.framework(a.facts)
    if rc.hugging_face or (fw is not None and fw.setting("gradient_checkpointing")):
        return "Gradient checkpointing (Hugging Face)"
    if rc.forms:
        return f"Activation checkpointing ({rc.forms[0]})"
    return "Activation checkpointing"


def _off(rc, a: Analysis) -> str:
    fw = runfacts.framework(a.facts)
    if rc.hugging_face or (fw is not None and fw.setting("gradient_checkpointing")):
        return ("`model.gradient_checkpointing_disable()` (or `TrainingArguments(gradient_checkpointing=False)`)")
    return "call the blocks directly instead of through `torch.utils.checkpoint.checkpoint`"


def _missing(peak, capacity, acts, how: str, gpu: bool) -> str:
    if not gpu:
        return "on the CPU the memory left to the run is not recorded"
    parts = []
    if peak is None:
        parts.append("the trace holds no memory peak (no `[memory]` events, allocator history or `memory_stats()`)")
    if not capacity:
        parts.append("the device's memory is not recorded")
    if not acts:
        parts.append("nor how much the recomputed activations take (no `[memory]` events inside them, no shapes)")
    return "; ".join(parts) or "unknown"


def _record_hint(gpu: bool) -> str:
    if gpu:
        return ("`gpuadvise profile` records the peak (`memory_stats()`); in your own profiler, "
                "`profile_memory=True` records it with the activations' size.")
    return "On the GPU, `gpuadvise profile` records the memory peak it needs."


def _how(how: str) -> str:
    return {"memory events": "measured from the [memory] events inside the recompute",
            "shapes": "estimated: the inputs its matmuls and attention save, from the recorded shapes, × 34/22 for "
                      "the rest of a layer's activations"}.get(how, how)


def _gib(nbytes: float) -> str:
    if nbytes >= 0.1 * GiB:
        return f"{nbytes / GiB:.2f} GiB"
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"

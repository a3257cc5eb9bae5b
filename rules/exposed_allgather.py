"""exposed-allgather: sharded parameters (FSDP, ZeRO-3) are gathered when a layer needs them, and the step waits for each all-gather.

## What it detects
All-gathers (NCCL kernels or a CPU backend's collectives) during which the rank does nothing else: no
compute kernel on its GPU, no op on its training thread. FSDP and ZeRO-3 keep each rank's shard of the
parameters and gather a layer's full parameters right before it runs; prefetching starts the next
layer's all-gather while the current layer computes. The rule measures, per step, the all-gathers'
exposed time and how much of it prefetching could hide: for each all-gather, the rank's own work since
the previous all-gather ended (the compute the gather could have run beside). run.json's FSDP settings
(`distributed.fsdp`: forward/backward prefetch, `limit_all_gathers`, FSDP2 prefetch calls) and ZeRO
stage say which switch to turn.

## Why it matters
An exposed all-gather idles the GPU for the whole transfer, once per layer in forward and again in
backward (FSDP reshards after forward by default). With prefetch the transfer of layer i+1 runs under
the compute of layer i, and only the part longer than that compute stays exposed.

## Fix
```python
# FSDP2 (fully_shard): prefetch further ahead, and keep the last blocks unsharded between forward and backward
for i, block in enumerate(model.blocks):
    fully_shard(block, reshard_after_forward=i < len(model.blocks) - 1)
    block.set_modules_to_forward_prefetch(list(model.blocks[i + 1:i + 3]))
# FSDP1
model = FSDP(model, forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True)
# DeepSpeed ZeRO-3: "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e8, "overlap_comm": true}
```
If the all-gathers stay exposed with prefetch on, each layer computes too briefly to hide its transfer:
give each rank more work per layer (larger per-GPU batch), shard over fewer ranks (HSDP:
`HYBRID_SHARD`, a 2-D mesh), or ZeRO-2 / DDP when the model fits.

## Thresholds
Fires when the all-gathers' exposed time is at least 5 % of the median step and at least 0.1 ms per
step. When prefetch could hide under a tenth of it (the rank does almost nothing before the gathers),
the finding says so and advises cheaper transfers (fewer ranks per shard group, no reshard after
forward, ZeRO-2 or DDP) instead of prefetch. The predicted saving is the part prefetch can hide (at most the compute before each all-gather):
by the critical-path replay with those kernels shortened on a GPU, else as a share of the median step.
An upper bound: the compute a prefetched gather runs beside may slow down a little.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class ExposedAllGather(Rule):
    code = "GA134"
    name = "exposed-allgather"
    title = "The step waits for sharded parameters to be all-gathered"
    thresholds = {"min_share_pct": 5.0, "min_ms": 0.1, "min_hideable_share": 0.1}

    def check(self, a: Analysis):
        c = a.collectives
        if c is None:
            return []
        rows = np.flatnonzero(np.array([k == "all_gather" for k in c.kind], dtype=bool) & (c.step >= 0))
        if not len(rows):
            return []
        m = a.metrics
        exposed = c.exposed_us()[rows]
        hideable = _hideable(c, rows, exposed, a.own_work)
        issued = c.issued_us[rows]
        exposed_us = perstep.median(perstep.issued(m, issued, exposed))
        hide_us = perstep.median(perstep.issued(m, issued, hideable))
        count = perstep.median(perstep.issued(m, issued))
        step = m.median_step_us
        share = 100.0 * exposed_us / step if step > 0 else 0.0
        if share < self.thresholds["min_share_pct"] or exposed_us < 1e3 * self.thresholds["min_ms"]:
            return []
        saving, basis = self._saving(a, c, rows, hideable, hide_us)
        setting, advice = _settings(a.facts)
        message = (f"{perstep.count_of(count, 'all-gather')} of sharded parameters per step "
                   f"leave{'s' if count == 1 else ''} this rank with nothing to do for {exposed_us / 1e3:.2f} ms per step "
                   f"({share:.1f} % of the median step): each layer waits for its parameters. ")
        if hide_us < self.thresholds["min_hideable_share"] * exposed_us:
            # nothing runs before the gathers to hide them under: prefetch cannot help, the transfer must shrink
            message += (f"Prefetching would hide only {hide_us / 1e3:.2f} ms per step: the rank does almost no work "
                        "before these all-gathers that they could run beside.")
            advice = NO_WORK_TO_HIDE_UNDER
        else:
            message += (f"Prefetching each all-gather under the compute before it would hide up to "
                        f"{hide_us / 1e3:.2f} ms per step.{setting}")
        order = np.argsort(-exposed, kind="stable")[:8]  # the earliest of equal ones, on any CPU
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            time_ranges_ms=[(a.rel_ms(float(c.start_us[rows[i]] - c.base_us)), a.rel_ms(float(c.end_us[rows[i]] - c.base_us)))
                            for i in order],
            items=[{"name": "all_gather", "exposed_ms": a.ms(float(exposed[i])), "hideable_ms": a.ms(float(hideable[i]))}
                   for i in order],
            numbers={"allgathers_per_step": float(count), "exposed_ms_per_step": a.ms(exposed_us),
                     "exposed_share_pct": round(share, 1), "hideable_ms_per_step": a.ms(hide_us),
                     "statistic": "median step"},
        )
        f = self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)
        f.impact.upper_bound = True
        return [f]

    @staticmethod
    def _saving(a: Analysis, c, rows: np.ndarray, hideable: np.ndarray, hide_us: float) -> tuple[float, str]:
        corr = c.correlation[rows]
        kernels = corr >= 0
        if kernels.any() and a.replay is not None:
            cut = dict(zip(corr[kernels].tolist(), hideable[kernels].tolist()))

            def shorter(ops):
                less = ops["correlation"].map(cut).to_numpy(dtype=float)
                return np.where(np.isnan(less), np.nan, np.maximum(ops["dur"].to_numpy(dtype=float) - less, 0.0))

            saving, basis = a.predicted_saving(Scenario("all-gathers prefetched under the compute before them",
                                                        gpu_time=shorter))
            if saving is not None:
                return saving, f"upper bound: {basis}"
        step = a.metrics.median_step_us
        return (100.0 * hide_us / step if step > 0 else 0.0,
                "upper bound: the exposed all-gather time the compute before each all-gather could hide (median per "
                "step), over the median step")

    def positive(self) -> TraceBuilder:
        return _sharded(prefetch=False)

    def negative(self) -> TraceBuilder:
        return _sharded(prefetch=True)


def _hideable(c, rows: np.ndarray, exposed: np.ndarray, work) -> np.ndarray:
    """Per all-gather, the exposed time the rank's work since the previous all-gather of its step ended
    could cover (a step's first all-gather follows the optimizer step, which changes the parameters)."""
    out = np.zeros(len(rows))
    prev_end, prev_step = None, None
    for j, i in enumerate(rows.tolist()):
        start = float(c.start_us[i])
        same = prev_step == int(c.step[i])
        lo = prev_end if same and prev_end is not None and prev_end < start else start
        prev_step = int(c.step[i])
        done = float(iv.covered(*work, lo, start)[0]) if lo < start else 0.0
        out[j] = min(float(exposed[j]), done)
        prev_end = float(c.end_us[i])
    return out


NO_WORK_TO_HIDE_UNDER = ("Make the transfers cheaper instead: shard over fewer ranks (HYBRID_SHARD, a 2-D mesh), keep the "
                         "parameters unsharded between forward and backward (reshard_after_forward=False), or use "
                         "ZeRO-2 / DDP if the model fits.")


def _settings(facts: dict) -> tuple[str, str]:
    """What run.json says about prefetch, and the switch to turn."""
    f = runfacts.fsdp(facts)
    stage = runfacts.zero_stage(facts)
    for w in f.get("wrappers", []):
        off = [name for name, on in (("forward_prefetch", w.get("forward_prefetch")),
                                     ("backward_prefetch", w.get("backward_prefetch") not in (None, "None"))) if not on]
        if off:
            return (f" FSDP ({w.get('created_at')}) runs with {' and '.join(off)} off.",
                    "Turn on forward_prefetch=True and backward_prefetch=BackwardPrefetch.BACKWARD_PRE.")
        return (" FSDP already prefetches (forward_prefetch, backward_prefetch): each layer computes too briefly "
                "to hide its all-gather.",
                "Give each layer more work to hide the transfer behind (larger per-GPU batch), or shard over fewer "
                "ranks (HYBRID_SHARD).")
    if f.get("fully_shard"):
        if not f.get("prefetch"):
            return (" FSDP2 (fully_shard) prefetches one module ahead by default and no explicit prefetch is set.",
                    "Prefetch two modules ahead (`set_modules_to_forward_prefetch`, `set_modules_to_backward_prefetch`) "
                    "and keep the last blocks unsharded after forward (reshard_after_forward=False).")
        return (" FSDP2 prefetch is already set: each module computes too briefly to hide its all-gather.",
                "Give each module more work (larger per-GPU batch) or shard over fewer ranks (a 2-D mesh: HSDP).")
    if stage == 3:
        return (" DeepSpeed runs ZeRO stage 3.",
                "Raise stage3_prefetch_bucket_size and turn on overlap_comm, or use ZeRO-2 if the model fits.")
    return "", "Prefetch the next layer's parameters while the current layer computes (FSDP forward/backward prefetch)."


def _sharded(prefetch: bool) -> TraceBuilder:
    """Four FSDP layers on gloo: without prefetch each layer's all-gather runs with the thread idle; with
    prefetch the next layer's gather runs while the current layer computes."""
    b = TraceBuilder(device=None, rank=0, world_size=2, backend="gloo")
    for _ in range(3):
        with b.step():
            for layer in range(4):
                if prefetch and layer < 3:
                    b.host_collective(1_500, name="gloo:all_gather", call="c10d::_allgather_base_", wait=False)
                    b.cpu("aten::linear", 2_000)
                elif prefetch:
                    b.cpu("aten::linear", 2_000)
                else:
                    b.host_collective(1_500, name="gloo:all_gather", call="c10d::_allgather_base_")
                    b.cpu("aten::linear", 2_000)
            with b.op("Optimizer.step#SGD.step", cat="user_annotation"):
                b.cpu("aten::add_", 300)
    return b


RULE = ExposedAllGather()

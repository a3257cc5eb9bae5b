"""host-sync: the CPU blocks on the GPU inside the training steps.

## What it detects
Calls that make the training thread wait for the GPU: `cudaStreamSynchronize`,
`cudaDeviceSynchronize`, `cudaEventSynchronize` (and their `hip*` twins), blocking copies
(`cudaMemcpy`, `hipMemcpyWithStream`), implicit syncs (`cudaMemcpyAsync` into pageable host memory:
`.cpu()`, `.tolist()`, printing a tensor; a pageable host→device copy whose call waited for earlier GPU
work rather than for its own data) and `.item()` (`aten::_local_scalar_dense`). Each is listed with its
kind. The one device sync torch.profiler itself issues when it stops is not
counted. Each call is traced to the op and, where the trace has Python stacks, the source line that
issued it.

## Why it matters
A sync drains the GPU's queue: while the CPU waits it launches nothing, and once it resumes the GPU
waits for the new launches. In a loop that is a bubble every step. Calls such as `loss.item()`,
`print(tensor)`, `tensor.cpu()`, `if tensor.any():` or `torch.cuda.synchronize()` for timing hide in
ordinary-looking code.

## Fix
```python
# before: a sync every step
running_loss += loss.item()
# after: accumulate on the GPU, read once per log interval
running_loss += loss.detach()
if step % log_every == 0:
    print(running_loss.item() / log_every)
```
Copy results to the host with `non_blocking=True` into pinned buffers, replace data-dependent Python
control flow with tensor ops (`torch.where`), and find hidden syncs with
`torch.cuda.set_sync_debug_mode("warn")`.

## Thresholds
Fires when blocking calls inside the steps are predicted (by the critical-path replay) to cost at
least 1 % of step time, or, with no GPU timeline to replay, when they take at least 1 % of it.
Syncs while the GPU is saturated cost little and are not reported.
Figures per step are the median over the steps (the header's statistic): calls, blocked time, and the
share (the median step's blocked time over the median step). A step whose blocked time exceeds 3× the
median step's plus 1 ms is named as an outlier (a one-off evaluation or checkpoint sync): the per-step
figures and the replayed saving leave its syncs out, so one such step never carries the finding.
Removing a scalar read in a loop also removes the ops that only compute its value (the norm behind
`p.grad.norm().item()`), their launches, the copy and the Python around them (analyzer/measure/replay/feeding.py
finds them by repetition): the finding gives both predictions, the syncs alone and the syncs with that
work, and its headline (and check against the 1 % threshold) is the larger one, named in the message. cudaFree synchronises the device
as well: when removing the syncs alone saves under 1 % because cudaFree calls in the loop would
serialise it again, the finding gives the saving with both gone and says so.
In a job of several ranks (distributedInfo's world size), when the syncs hold the training thread at
least 50 % of the step while the GPU is busy under 50 % of it and waits mostly on something other than
this thread (its next work queued with nothing running on this GPU, or a collective running alone:
analyzer/measure/basics/gpuwaits.py), ending the syncs on this rank alone frees the thread but not the GPU. The
finding names what the GPU waits for and predicts ending the syncs on every rank (SPMD: each rank runs
them, and the signal a rank's GPU waits for is held by another rank's syncs): the replay also drops the
GPU's waits for work held elsewhere, at most the blocked time per step, and keeps the collectives'
kernels as they ran. The headline is that prediction; the range runs down to this rank's alone.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.replay.feeding import Feeding, feeding_work
from gpuadvise.analyzer.measure.basics.gpuwaits import gpu_waits
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics.steps import launch_steps
from gpuadvise.analyzer.model.calls import FREE_CALLS, SCALAR_OPS
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class HostSync(Rule):
    code = "GA104"
    name = "host-sync"
    title = "The CPU waits for the GPU inside the steps"
    thresholds = {"min_saving_pct": 1.0, "min_share_pct": 1.0, "outlier_x": 3.0, "spmd_min_held_pct": 50.0,
                  "spmd_max_busy_pct": 50.0}

    def check(self, a: Analysis):
        m = a.metrics
        s = m.syncs
        if s.empty:
            return []
        s = s[~s["profiler_sync"]]
        if m.steps:
            s = s[s["step"] >= 0]
        if s.empty:
            return []
        # per step: the median over the steps, the report's statistic (perstep); the share is the median
        # step's blocked time over the header's median step
        step_us = max(float(m.median_step_us), 1e-9)
        blocked_ps = perstep.issued(m, s["ts"], s["dur"])
        blocked_us = perstep.median(blocked_ps)
        calls_per_step = perstep.median(perstep.issued(m, s["ts"]))
        share = 100 * blocked_us / step_us
        # a step that blocks far longer than the median one is an outlier: named, and its syncs left out of
        # the saving, so the saving stands on the same steps as the figures beside it
        outlier = (blocked_ps > self.thresholds["outlier_x"] * blocked_us + 1_000.0) if m.steps else blocked_ps[:0] > 0
        outlier_steps = [int(st.number) for st, out in zip(m.steps, outlier) if out]
        counted = s
        if outlier_steps:
            k = launch_steps(m.steps, s["ts"].to_numpy(dtype=float))
            counted = s[~((k >= 0) & outlier[np.maximum(k, 0)])]
        left_out = (f" (outlier step{'s' if len(outlier_steps) > 1 else ''} {', '.join(map(str, outlier_steps))} left as "
                    "they are)" if outlier_steps else "")
        keys = set(zip(counted["ts"], counted["tid"]))

        def these(c):
            return np.array([(t, tid) in keys for t, tid in zip(c["ts"], c["tid"])], dtype=bool)

        saving, basis = a.predicted_saving(Scenario("these syncs removed" + left_out, unblock=these))
        alone = saving
        feeding = feeding_work(a.model, counted, len(m.steps))
        with_work = None
        if feeding.reads and saving is not None:
            with_work, work_basis = a.predicted_saving(_without_feeding(these, feeding, a.replay))
            if with_work is not None and with_work > saving:
                saving, basis = with_work, work_basis
        with_frees = None
        if saving is not None and saving < self.thresholds["min_saving_pct"]:
            # cudaFree syncs the device too: with only these syncs gone, frees in the loop serialise it again
            both, both_basis = a.predicted_saving(Scenario(
                "these syncs and the loop's cudaFree calls removed",
                unblock=lambda c: these(c) | c["name"].isin(FREE_CALLS).to_numpy()))
            if both is not None and both >= self.thresholds["min_saving_pct"]:
                with_frees, saving, basis = saving, both, both_basis
        spmd = self._every_rank(a, these, share, blocked_us, saving) if saving is not None else None
        alone_rank = saving
        if spmd is not None and spmd[0] > (saving or 0.0):
            saving, basis = spmd[0], spmd[1]
        if saving is None:
            if share < self.thresholds["min_share_pct"]:
                return []
            saving, basis = share, "share of step time (no GPU timeline to replay)"
        elif saving < self.thresholds["min_saving_pct"]:
            return []
        scalar_rows = s[s["op"].isin(SCALAR_OPS)]
        scalar = int(scalar_rows["external_id"].nunique()) if len(scalar_rows) else 0  # one .item() = a copy + a sync
        groups = (s.groupby(["name", "kind", "op", "source"]).agg(count=("dur", "size"), total_us=("dur", "sum"))
                  .reset_index().sort_values("total_us", ascending=False))
        items = [{"name": r.name, "kind": r.kind, "op": r.op, "source": r.source, "count": int(r.count), "total_ms": round(r.total_us / 1e3, 2)}
                 for r in groups.head(8).itertuples()]
        worst = s.nlargest(5, "dur")
        top = groups.iloc[0]
        scalar_txt = f", {scalar} of them `.item()`-style scalar reads" if scalar else ""
        inside = f" inside `{top['op']}`" if top["op"] else ""
        where = f" at {top['source']}" if top["source"] else ""
        if m.steps:
            per = f" ({perstep.a_median(m)}{perstep.count_text(calls_per_step)} per step{scalar_txt})"
            held = (f", {perstep.a_median(m)}{blocked_us / 1e3:.2f} ms of {perstep.each_step(m)} {step_us / 1e3:.1f} ms "
                    f"step ({share:.1f}%)")
        else:
            per = f" ({scalar_txt[2:]})" if scalar_txt else ""
            held = f" ({share:.1f}% of the traced window)"
        message = (f"{perstep.count_of(len(s), 'blocking call')}{per} hold{'s' if len(s) == 1 else ''} the CPU for "
                   f"{s['dur'].sum() / 1e3:.2f} ms in total{held}. The largest share is "
                   f"{int(top['count'])}× `{top['name']}` ({top['kind']}){inside}{where}: {top['total_us'] / 1e3:.2f} ms.")
        if outlier_steps:
            many = len(outlier_steps) > 1
            message += (f" Step{'s' if many else ''} {', '.join(map(str, outlier_steps))} blocked far longer (up to "
                        f"{float(blocked_ps[outlier].max()) / 1e3:.2f} ms): {'outliers' if many else 'an outlier'}, left "
                        "out of the per-step figures and of the predicted saving.")
        advice = "Remove the syncs from the loop, or move them to where the value is really needed."
        if with_work is not None:
            headline = "the larger, headline" if with_work >= alone else "the headline is the syncs alone"
            chain = " ← ".join(f"`{n}`" for n in dict.fromkeys(feeding.chain))
            message += (f" The syncs alone: {alone:.1f}%; with the work that computes the synced values "
                        f"({perstep.count_of(feeding.reads, 'read')} fed by {chain}): {with_work:.1f}% ({headline}).")
        if with_frees is not None:
            message += (f" cudaFree calls in the same window synchronise the device as well: without them gone too, "
                        f"removing these syncs saves only {with_frees:.1f}%; with them gone: {saving:.1f}% (the headline).")
            advice += (" Take the cudaFree calls out of the loop too (`torch.cuda.empty_cache()`, or "
                       "`PYTORCH_NO_CUDA_MEMORY_CACHING`): each one waits for the whole GPU.")
        range_pct = None
        if spmd is not None and saving == spmd[0]:
            waits = spmd[2]
            message += (f" The GPU does not wait for this thread alone: of each step it spends {waits.describe()}. "
                        f"Ending the syncs on this rank alone saves {alone_rank:.1f}%: its GPU would still wait. "
                        f"On every rank of the {waits.world_size}-rank job (SPMD: each rank runs these syncs, and the "
                        f"work a rank's GPU waits for is held by another rank's): {saving:.1f}% (the headline).")
            advice += (" Do it on every rank (the same code runs on all of them): one rank without the syncs still "
                       "waits for the others.")
            range_pct = (alone_rank, saving)
        evidence = Evidence(
            steps=sorted({int(st.number) for st in m.steps}),
            time_ranges_ms=[(a.rel_ms(t), a.rel_ms(e)) for t, e in zip(worst["ts"], worst["end"])],
            items=items,
            sources=[x for x in groups["source"].unique().tolist() if x][:5],
            numbers={"blocking_calls": int(len(s)), "saving_syncs_alone_pct": None if alone is None else round(alone, 1),
                     "saving_with_feeding_work_pct": None if with_work is None else round(with_work, 1), "per_step": round(calls_per_step, 1), "scalar_reads": scalar,
                     "blocked_ms": a.ms(s["dur"].sum()), "blocked_ms_per_step": a.ms(blocked_us),
                     "blocked_share_pct": round(share, 1), "outlier_steps": outlier_steps, "statistic": "median step" if m.steps else "traced window"},
        )
        if spmd is not None:
            w = spmd[2]
            evidence.numbers["gpu_time_per_step_ms"] = {
                "computing": a.ms(w.computing_us), "in_collective_alone": a.ms(w.collective_alone_us),
                "idle_waiting_for_launch": a.ms(w.launch_wait_us), "idle_with_work_queued": a.ms(w.queued_wait_us)}
            evidence.numbers["saving_this_rank_alone_pct"] = None if alone_rank is None else round(alone_rank, 1)
            evidence.numbers["saving_every_rank_pct"] = round(spmd[0], 1)
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             range_pct=range_pct)]

    def _every_rank(self, a: Analysis, these, share: float, blocked_us: float, alone: float):
        """In a job of several ranks whose syncs hold the training thread most of the step while the GPU
        sits idle most of it, waiting with its work queued or inside a collective (measure/basics/gpuwaits.py):
        (% saved, basis, GpuWaits) by ending the syncs on every rank. SPMD: every rank runs the same syncs,
        so the work a rank's GPU waits for (another rank's signal) is held by them too; the replay drops the
        GPU's waits for what the trace does not show, up to the blocked time per step (a rank is late by at
        most its own blocked time), and keeps the collectives' kernels as they ran. None where that
        evidence does not hold."""
        t, m = self.thresholds, a.metrics
        world = a.model.meta.world_size or 1
        busy = m.busy_in_steps_pct if m.steps else m.gpu_busy_pct
        if world < 2 or share < t["spmd_min_held_pct"] or busy is None or busy >= t["spmd_max_busy_pct"]:
            return None
        waits = gpu_waits(a.model, m)
        if waits is None or not waits.waits_on_others or waits.queued_wait_us <= 0:
            return None
        removable = min(1.0, blocked_us / waits.queued_wait_us)
        pct, basis = a.predicted_saving(Scenario(
            f"these syncs removed on every rank of the {world}-rank job (SPMD), with the GPU's waits for work "
            f"held elsewhere ({waits.queued_wait_us / 1e3:.1f} ms a step, {100 * removable:.0f}% of it: at most the "
            f"{blocked_us / 1e3:.1f} ms a rank is blocked) gone; collectives as they ran",
            unblock=these, unseen_scale=1.0 - removable))
        if pct is None:
            return None
        if pct <= (alone or 0.0):
            return None
        return pct, basis, waits

    def positive(self) -> TraceBuilder:
        b = TraceBuilder()
        for _ in range(4):
            with b.step():
                for _ in range(5):
                    for _ in range(10):
                        b.kernel("ampere_tf32_s1688gemm_64x64_nn", 200)
                    b.item()
                    b.idle(1_500)  # Python work the GPU now waits for
        b.finish()
        return b

    def negative(self) -> TraceBuilder:
        b = TraceBuilder()
        for _ in range(4):
            with b.step():
                for _ in range(50):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 200)
                b.idle(1_000)
        b.finish()
        return b


def _without_feeding(these, feeding: Feeding, replay) -> Scenario:
    """The syncs gone together with the work that only computes their values: its CPU time, its calls
    (launches, the copy) and the GPU ops those calls launched."""
    lo, hi = feeding.lo, feeding.hi  # CPU gaps are merged across threads in the replay: removed by time
    def gone(c):
        return feeding.covers(c["ts"].to_numpy(), c["tid"].to_numpy())

    gone_corr = set(replay.calls.loc[gone(replay.calls), "correlation"].tolist())

    def gpu_time(ops):
        return np.where(ops["correlation"].isin(gone_corr).to_numpy(), 0.0, np.nan)

    return Scenario("these syncs removed with the work that computes the synced values", cpu_removed=(lo, hi),
                    unblock=these, remove=gone, gpu_time=gpu_time)


RULE = HostSync()

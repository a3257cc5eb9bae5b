"""ddp-sync-per-microbatch: gradient accumulation under DDP all-reduces the gradients after every micro-batch, not once per step.

## What it detects
Steps (optimizer steps) that run several forward/backward passes under DistributedDataParallel
(gradient accumulation) and all-reduce the gradients in more than one of them. In the trace, each
`DistributedDataParallel.forward` starts a micro-batch and the all-reduces its backward issues (NCCL
kernels or a CPU backend's collectives) follow it; a micro-batch whose backward all-reduced was not
inside `model.no_sync()`. `gpuadvise profile` also counts, per optimizer step, the backward passes and
how many of them all-reduced (run.json `distributed.accumulation`); either source is enough.

## Why it matters
With accumulation only the sum over the micro-batches is needed, once, before the optimizer step.
Without `no_sync()`, DDP all-reduces the whole model's gradients after every micro-batch: with 4
micro-batches, 4× the communication, and each all-reduce holds up the next micro-batch (on a CPU
backend the training thread waits for it; on GPUs the reduction competes with the next forward).

## Fix
```python
import contextlib

for i, batch in enumerate(micro_batches):
    last = i == len(micro_batches) - 1
    with contextlib.nullcontext() if last else model.no_sync():  # accumulate locally, sync once
        loss = model(batch).sum() / len(micro_batches)
        loss.backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
```
With Hugging Face Accelerate, `with accelerator.accumulate(model):` does this.

Under Lightning, `accumulate_grad_batches=N` does.

## Thresholds
Fires when the median step holds at least 2 DDP forward passes and at least 2 of them all-reduced (or
run.json records at least 2 all-reducing backward passes per optimizer step). The predicted saving
removes the all-reduces of every micro-batch but the last: on a GPU by the critical-path replay of the
steps without those collective kernels; on a CPU backend, the time the rank did nothing but wait for
them (their exposed time), over the median step. Collectives end only when every rank has arrived,
and every rank runs the same loop: the fix applies on every rank.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.job.microbatches import step_rounds
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class DDPSyncPerMicrobatch(Rule):
    code = "GA132"
    name = "ddp-sync-per-microbatch"
    title = "Gradient accumulation all-reduces every micro-batch (no `no_sync()`)"
    thresholds = {"min_micro_batches": 2, "min_synced": 2}

    def check(self, a: Analysis):
        acc = runfacts.accumulation(a.facts)
        rounds = step_rounds(a)
        m = a.metrics
        per_step_fwd = np.zeros(len(m.steps))
        per_step_synced = np.zeros(len(m.steps))
        extra_rows: list[int] = []
        for r in rounds:
            per_step_fwd[r.index] = len(r.forwards)
            per_step_synced[r.index] = r.synced
            synced = [rows for rows in r.rounds if len(rows)]
            for rows in synced[:-1]:  # every all-reducing micro-batch but the last
                extra_rows.extend(rows.tolist())
        t = self.thresholds
        micro = float(np.median(per_step_fwd)) if rounds else 0.0
        synced = float(np.median(per_step_synced)) if rounds else 0.0
        from_trace = micro >= t["min_micro_batches"] and synced >= t["min_synced"]
        from_facts = acc is not None and acc.backward_per_step >= t["min_micro_batches"] and acc.synced_backward_per_step >= t["min_synced"]
        if not (from_trace or from_facts) or (acc is not None and acc.synced_backward_per_step < t["min_synced"]):
            return []
        if not from_trace:  # the trace shows no micro-batches (no DDP annotations): say what run.json counted
            micro, synced = acc.backward_per_step, acc.synced_backward_per_step
        c = a.collectives
        rows = np.array(sorted(extra_rows), dtype=np.int64)
        exposed = c.exposed_us()[rows] if c is not None and len(rows) else np.zeros(0)
        issued = c.issued_us[rows] if len(rows) else np.zeros(0)
        extra_n = perstep.median(perstep.issued(m, issued))
        extra_us = perstep.median(perstep.issued(m, issued, exposed))
        saving, basis = self._saving(a, c, rows, extra_us)
        ddps = runfacts.ddp(a.facts)
        n_micro = perstep.count_text(micro)
        message = (f"Each optimizer step runs {n_micro} forward/backward passes (gradient accumulation) and "
                   f"all-reduces the gradients after {perstep.count_text(synced)} of them: DDP synchronises every "
                   f"micro-batch instead of once per step.")
        if len(rows):
            message += (f" The all-reduces of the micro-batches before the last ({perstep.count_text(extra_n)} per "
                        f"step) hold this rank up {extra_us / 1e3:.2f} ms per step (median step).")
        evidence = Evidence(
            steps=[m.steps[r.index].number for r in rounds if r.synced >= t["min_synced"]][:8],
            items=[{"name": c.kind[i], "issued_ms": a.rel_ms(float(c.issued_us[i])),
                    "exposed_ms": a.ms(float(c.exposed_us()[i]))} for i in rows[:8].tolist()] if len(rows) else [],
            sources=[d.created_at for d in ddps],
            numbers={"micro_batches_per_step": micro, "synced_micro_batches_per_step": synced,
                     "extra_allreduces_per_step": float(extra_n), "extra_allreduce_ms_per_step": a.ms(extra_us),
                     "statistic": "median step"},
        )
        first = max(1, int(round(micro)) - 1)
        advice = (f"Run the first {first} backward pass{'es' if first != 1 else ''} of each step inside "
                  "`model.no_sync()`: the gradients accumulate locally and are all-reduced once, with the last "
                  "micro-batch.")
        keys = c.keys() if c is not None and len(rows) else []
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             removes=[keys[i] for i in rows.tolist()])]

    @staticmethod
    def _saving(a: Analysis, c, rows: np.ndarray, extra_us: float) -> tuple[float, str]:
        if not len(rows):
            return 0.0, "not predicted: the trace does not show the micro-batches' all-reduces"
        kernels = [int(x) for x in c.correlation[rows] if x >= 0]
        if kernels and a.replay is not None:
            corr = np.array(kernels)
            saving, basis = a.predicted_saving(Scenario(
                "the all-reduces of every micro-batch but the last removed (no_sync())",
                gpu_time=lambda ops: np.where(ops["correlation"].isin(corr).to_numpy(), 0.0, np.nan),
                remove=lambda calls: calls["correlation"].isin(corr).to_numpy()))
            if saving is not None:
                return saving, basis
        step = a.metrics.median_step_us
        return (100.0 * extra_us / step if step > 0 else 0.0,
                "the time this rank did nothing but wait for the all-reduces of every micro-batch but the last "
                "(median per step), over the median step; every rank runs the same loop and drops them alike")

    def positive(self) -> TraceBuilder:
        return _accumulation(no_sync=False)

    def negative(self) -> TraceBuilder:
        return _accumulation(no_sync=True)


def _accumulation(no_sync: bool, micro: int = 4) -> TraceBuilder:
    """DDP on gloo with 4 micro-batches per optimizer step; the training thread waits for each all-reduce."""
    b = TraceBuilder(device=None, rank=0, world_size=2, backend="gloo")
    for _ in range(3):
        with b.step():
            for i in range(micro):
                with b.op("DistributedDataParallel.forward", cat="user_annotation"):
                    b.cpu("aten::linear", 1_500)
                b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 3_000)
                if not no_sync or i == micro - 1:
                    b.host_collective(2_500)
            with b.op("Optimizer.step#SGD.step", cat="user_annotation"):
                b.cpu("aten::add_", 300)
    return b


RULE = DDPSyncPerMicrobatch()

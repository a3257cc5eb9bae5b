"""comm-overlap: communication is exposed: the GPUs stop computing while gradients are exchanged.

## What it detects
Ranks whose collective kernels (NCCL/RCCL all-reduce, all-gather, reduce-scatter …) mostly run while
no compute kernel does. Overlap is Holistic Trace Analysis' comm/compute overlap: the time
communication kernels run alongside compute kernels, divided by the communication kernels' time
(HTA `get_comm_comp_overlap`), per rank over its whole trace. It only matters when the exposed part is
a real share of the step, so the time is measured per step, and time a rank spends inside a collective
waiting for a slower rank (see `straggler`) is not counted: per step, only the exposed communication
every rank has (the least over ranks) is the transfer that better overlap could hide.

## Why it matters
Data-parallel training is meant to reduce the gradients of one layer while the backward pass of the
next is still computing. When the all-reduce starts only after backward is done, or in one huge
bucket, or FSDP gathers each layer's parameters only when it is needed, the GPU sits idle for the
whole transfer on every step, on every rank.

## Fix
```python
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(
    model, device_ids=[local_rank],
    bucket_cap_mb=25,              # smaller buckets start all-reducing earlier in backward
    gradient_as_bucket_view=True,  # no extra gradient copies into the buckets
    static_graph=True,             # lets DDP schedule the reduction of a fixed graph ahead
)
# FSDP: fetch the next layer's parameters while this one computes
# model = FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True)
```
Keep anything that synchronises with the GPU (`.item()`, `torch.cuda.synchronize()`, a CPU copy of a
gradient) out of the backward pass: it serialises the reduction behind it. With gradient
accumulation, skip the reduction of all but the last micro-batch (`with model.no_sync():`). If the
transfer itself is long, communicate less: bf16 gradients (DDP comm hook `bf16_compress_hook`), larger
per-GPU batches, or ZeRO/FSDP sharding strategies that fit the interconnect.

## Thresholds
Fires for the ranks whose comm/compute overlap is below 50 % (TraceLens flags below 70 %) when the
exposed transfer (the exposed communication every rank has in a step) is at least 5 % of the job's
step time (TraceLens' exposed-communication threshold) and at least 0.1 ms per step. The saving is an
upper bound: the step time if the exposed transfer were hidden completely.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import RankFolder, job_folder

from .base import JobRule


class CommOverlap(JobRule):
    code = "GA131"
    name = "comm-overlap"
    title = "Communication is not overlapped with compute"
    thresholds = {"max_overlap_pct": 50.0, "min_exposed_share_pct": 5.0, "min_exposed_ms": 0.1}

    def check(self, a):
        job = a.job
        if not job.steps:
            return []
        g = job.grid
        job_step = g["dur_us"].max(axis=0)
        transfer = g["transfer_us"]
        share = 100.0 * float(transfer.sum()) / max(float(job_step.sum()), 1e-9)
        per_step = float(np.median(transfer))
        if share < self.thresholds["min_exposed_share_pct"] or per_step < 1e3 * self.thresholds["min_exposed_ms"]:
            return []
        flagged = [(j, r) for j, r in enumerate(job.ranks)
                   if r.overlap_pct is not None and r.overlap_pct < self.thresholds["max_overlap_pct"]]
        if not flagged:
            return []
        overlaps = [r.overlap_pct for _, r in flagged]
        comm = float(np.median(g["comm_us"][[j for j, _ in flagged]]))
        n, total = len(flagged), len(job.ranks)
        which = "all" if n == total else "ranks " + ", ".join(str(r.rank) for _, r in flagged[:12]) + (" …" if n > 12 else "")
        message = (f"Communication is mostly exposed on {n} of {total} ranks ({which}): only "
                   f"{np.median(overlaps):.1f} % of their collective-kernel time overlaps compute (median; HTA's "
                   f"comm/compute overlap). Of a median {comm / 1e3:.2f} ms of communication per step, "
                   f"{per_step / 1e3:.2f} ms runs with no compute beside it on every rank, "
                   f"{share:.1f} % of the job's step time.")
        evidence = Evidence(
            steps=list(job.steps),
            items=[{"rank": r.rank, "comm_ms": a.ms(np.median(g["comm_us"][j])),
                    "exposed_ms": a.ms(np.median(g["exposed_comm_us"][j])), "wait_ms": a.ms(np.median(g["wait_us"][j])),
                    "overlap_pct": round(r.overlap_pct, 1)} for j, r in flagged[:16]],
            numbers={"ranks_flagged": n, "ranks": total, "median_overlap_pct": round(float(np.median(overlaps)), 1),
                     "comm_ms_per_step": a.ms(comm), "exposed_transfer_ms_per_step": a.ms(per_step),
                     "exposed_share_pct": round(share, 1)},
        )
        advice = ("Start the gradient reduction during the backward pass and keep it going while compute runs: "
                  "DDP buckets, FSDP prefetch, no syncs inside backward.")
        basis = "upper bound: the job's step time with the exposed transfer hidden behind compute on every rank"
        f = self.finding(message=message, evidence=evidence, saving=share, basis=basis, advice=advice)
        f.impact.upper_bound = True
        if n == 1:
            f.rank, f.trace = flagged[0][1].rank, flagged[0][1].source
        return [f]

    def positive(self) -> RankFolder:
        # all-reduce after all of backward, in one bucket: 3 ms exposed in a ~13 ms step
        return job_folder(ranks=4, compute_us=10_000, transfer_us=3_000, buckets=1)

    def negative(self) -> RankFolder:
        # the same 3 ms of all-reduce in 4 buckets, each reduced while the next bucket computes
        return job_folder(ranks=4, compute_us=10_000, transfer_us=750, buckets=4)


RULE = CommOverlap()

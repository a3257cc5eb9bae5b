"""comm-overlap: communication is exposed: the GPUs stop computing while gradients are exchanged.

## What it detects
Ranks whose collectives (all-reduce, all-gather, reduce-scatter …, on NCCL/RCCL kernels or a CPU backend
such as gloo) mostly transfer while the rank does nothing else. Each collective is lined up across the
ranks (see `straggler`), and the time a rank spends in it is split into its wait for the last rank and
the transfer itself; only the transfer is what better overlap could hide (the wait is the straggler's).
Overlap is the share of the transfer time during which the rank did other work (a compute kernel on its
GPU, or an op on its training threads for a CPU backend); where the collectives cannot be lined up it is
Holistic Trace Analysis' comm/compute overlap (communication-kernel time alongside compute kernels over
their time, HTA `get_comm_comp_overlap`) and the transfer is the least exposed communication of the
ranks in each step. It only matters when the exposed transfer every rank has is a real share of the step.

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
    bucket_cap_mb=10,              # smaller buckets than the default 25 start all-reducing earlier
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
upper bound: the step time if the exposed transfer were hidden completely, but never behind more than
the compute a rank still does once its first gradient of the step's last backward pass is ready
(autograd's `AccumulateGrad`; measure/job/gradients.py): a model whose gradients are all ready at once (one
layer, one bucket) has nothing to hide the reduction behind, and its saving and severity say so (the
advice is then to communicate less or less often, with `no_sync()` only where run.json does not show
a step of one backward pass or micro-batches already skipping their reduction); so has a DDP whose
gradients run.json shows in one bucket that fits DDP's first one (1 MiB, which no `bucket_cap_mb`
splits). Severity follows that saving. The fix's DDP call passes `device_ids` only for collectives on a
GPU, and leaves out the settings run.json shows set. A job whose collectives run on several kinds of
process group (a device mesh), or on one whose most exposed collectives are FSDP's, tensor or pipeline
parallelism's or an all-to-all, is left to `group-comm`, which tells it by group and phase.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.model import collectives as coll, runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import RankFolder, job_folder

from .base import JobRule
from .exposed_comm import ddp_fix
from .group_comm import told_by_group


FIRST_BUCKET_BYTES = 2**20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES: DDP's first bucket fills to 1 MiB


class CommOverlap(JobRule):
    code = "GA131"
    name = "comm-overlap"
    title = "Communication is not overlapped with compute"
    thresholds = {"max_overlap_pct": 50.0, "min_exposed_share_pct": 5.0, "min_exposed_ms": 0.1}

    def check(self, a):
        job = a.job
        if not job.steps or told_by_group(job):  # a mesh's groups, or FSDP's/TP's one: group-comm says it in their terms
            return []
        g = job.grid
        job_step = g["dur_us"].max(axis=0)
        every = g["exposed_transfer_us"].min(axis=0)  # the exposed transfer every rank pays, per step
        share = 100.0 * float(every.sum()) / max(float(job_step.sum()), 1e-9)
        per_step = float(np.median(every))
        if share < self.thresholds["min_exposed_share_pct"] or per_step < 1e3 * self.thresholds["min_exposed_ms"]:
            return []
        overlaps = _overlaps(job)
        flagged = [(j, r) for j, r in enumerate(job.ranks)
                   if overlaps[j] is not None and overlaps[j] < self.thresholds["max_overlap_pct"]]
        if not flagged:
            return []
        # what better overlap can hide: the exposed transfer, at most the compute a rank still does once its
        # first gradient is ready (measure/job/gradients.py), on every rank
        room = g["reduction_room_us"]
        unsplit = one_bucket(a.facts)
        if unsplit is not None:  # DDP reduces all the gradients at once, and no bucket setting splits them
            room = np.zeros_like(room)
        hideable = np.minimum(g["exposed_transfer_us"], room).min(axis=0)
        known = bool(np.isfinite(room).all())
        saving = 100.0 * float(hideable.sum()) / max(float(job_step.sum()), 1e-9)
        pcts = [overlaps[j] for j, _ in flagged]
        rows = [j for j, _ in flagged]
        comm = float(np.median(g["wait_us"][rows] + g["transfer_us"][rows]))
        wait = float(np.median(g["wait_us"][rows]))
        n, total = len(flagged), len(job.ranks)
        which = "all" if n == total else "ranks " + ", ".join(str(r.rank) for _, r in flagged[:12]) + (" …" if n > 12 else "")
        how = ("of their collectives' transfer time overlaps other work" if job.matched is not None else
               "of their collective-kernel time overlaps compute (HTA's comm/compute overlap)")
        message = (f"Communication is mostly exposed on {n} of {total} ranks ({which}): only "
                   f"{np.median(pcts):.1f} % {how} (median). Of a median {comm / 1e3:.2f} ms per step inside "
                   f"collectives ({wait / 1e3:.2f} ms of it waiting for other ranks), {per_step / 1e3:.2f} ms of "
                   f"transfer runs with nothing else beside it on every rank, {share:.1f} % of the job's step time.")
        room_ms = float(np.median(room.min(axis=0))) / 1e3 if known else None
        if unsplit is not None:
            size = f"{unsplit / 1024:.0f} KiB" if unsplit >= 1024 else f"{unsplit} bytes"
            message += (f" DDP reduces its {size} of gradients in one bucket, which starts only once "
                        f"every gradient is ready, and no `bucket_cap_mb` splits gradients that fit its first bucket "
                        f"({FIRST_BUCKET_BYTES // 2**20} MiB): there is nothing to hide the reduction behind.")
        elif known:
            message += (f" Once a rank's first gradient is ready it computes for a median {room_ms:.2f} ms more in the "
                        f"step, all a reduction can hide behind: at most {saving:.1f} % of the step.")
        evidence = Evidence(
            steps=[] if job.whole_trace else list(job.steps),
            items=[{"rank": r.rank, "comm_ms": a.ms(np.median(g["wait_us"][j] + g["transfer_us"][j])),
                    "transfer_ms": a.ms(np.median(g["transfer_us"][j])),
                    "exposed_transfer_ms": a.ms(np.median(g["exposed_transfer_us"][j])),
                    "wait_ms": a.ms(np.median(g["wait_us"][j])), "overlap_pct": round(overlaps[j], 1)}
                   for j, r in flagged[:16]],
            numbers={"ranks_flagged": n, "ranks": total, "median_overlap_pct": round(float(np.median(pcts)), 1),
                     "comm_ms_per_step": a.ms(comm), "exposed_transfer_ms_per_step": a.ms(per_step),
                     "exposed_share_pct": round(share, 1), "statistic": "median step",
                     **({"compute_after_first_gradient_ms": round(room_ms, 3)} if known else {})},
        )
        if known and saving < self.thresholds["min_exposed_share_pct"]:
            why = ("DDP reduces every gradient at once (one bucket)" if unsplit is not None else
                   "Little compute is left once the first gradient is ready")
            acc = runfacts.accumulation(a.facts)  # no_sync() asked for only where micro-batches all reduce
            ask = acc is None or (acc.backward_per_step > 1 and acc.synced_backward_per_step >= acc.backward_per_step)
            less = ["larger batches per step"] + ([
                "with gradient accumulation, `no_sync()` on all but the last micro-batch"] if ask else []) + [
                "bf16 gradients through a DDP comm hook"]
            advice = f"{why}, so overlap cannot hide this transfer: communicate less or less often ({'; '.join(less)})."
        else:
            advice = ("Start the gradient reduction during the backward pass and keep it going while compute runs: "
                      "DDP buckets, FSDP prefetch, no syncs inside backward.")
        basis = ("upper bound: the job's step time with the exposed transfer hidden behind compute on every rank"
                 + (", at most the compute each rank does once its first gradient is ready" if known else ""))
        gpu = any(r.has_gpu for r in job.ranks) and any(
            w == coll.KERNEL for r in job.ranks if r.collectives is not None for w in r.collectives.where)
        f = self.finding(message=message, evidence=evidence, saving=saving if known else share, basis=basis,
                         advice=advice, fix=ddp_fix(self.fix, a.facts, gpu, buckets_split=unsplit is None))
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


def one_bucket(facts: dict) -> int | None:
    """The gradients' bytes when every DDP the script built reduced them in one bucket that no setting splits
    (they fit DDP's first bucket, FIRST_BUCKET_BYTES, whatever `bucket_cap_mb` says); None otherwise or
    where run.json does not say."""
    built = runfacts.ddp(facts)
    if not built or any(d.buckets != 1 or d.parameter_bytes is None or d.parameter_bytes > FIRST_BUCKET_BYTES
                        for d in built):
        return None
    return max(d.parameter_bytes for d in built)


def _overlaps(job) -> list:
    """Per rank, % of its collectives' time that overlaps its other work: of the transfer, where the
    collectives were lined up across ranks; else HTA's comm/compute overlap of its kernels (None: no
    communication)."""
    g = job.grid
    if job.matched is None:
        return [r.overlap_pct for r in job.ranks]
    transfer, exposed = g["transfer_us"].sum(axis=1), g["exposed_transfer_us"].sum(axis=1)
    return [100.0 * (1.0 - e / t) if t > 0 else None for t, e in zip(transfer.tolist(), exposed.tolist())]


RULE = CommOverlap()

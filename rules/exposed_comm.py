"""exposed-comm: one rank's trace shows its collectives running with no compute beside them.

## What it detects
A trace of one rank of a distributed job (read alone, without the other ranks' traces) whose
collectives (all-reduce, reduce-scatter, all-to-all, broadcast …, on NCCL/RCCL kernels or a CPU backend
such as gloo) mostly run while the rank does nothing else: no compute kernel on its GPU, no op on its
training thread for a CPU backend. Per step it measures the time inside collectives and the part of it
with no work beside it (the exposed time), by the median step. All-gathers are left to
`exposed-allgather`, which measures what prefetch would hide of them, and a GPU job's collectives on a
CPU backend to `cpu-backend-on-gpu`, whose fix (NCCL) changes the transfer itself. From one trace the time a
collective spends waiting for slower ranks cannot be told from its transfer: both are in the exposed
time. Given every rank's trace, gpuadvise lines the collectives up across the ranks and `comm-overlap`
(with `straggler` for the waits) replaces this rule.

## Why it matters
Data-parallel and sharded training are meant to exchange one layer's gradients while the next layer
still computes. When the exchange starts only after the backward pass, runs in one huge bucket, or
waits behind a sync, the GPU sits idle for the whole collective on every step. When the exposed time
is a wait for another rank, that rank is the one to fix, and only the traces of all ranks say which.

## Fix
Analyse every rank's trace together (`gpuadvise analyze RUN_DIR`, or `torchrun … -m gpuadvise profile`)
to split each collective's time into its wait for the slowest rank and its transfer. To hide the transfer:
```python
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(
    model, device_ids=[local_rank],
    bucket_cap_mb=10,              # smaller buckets than the default 25 start all-reducing earlier
    gradient_as_bucket_view=True,  # no extra gradient copies into the buckets
    static_graph=True,             # lets DDP schedule the reduction of a fixed graph ahead
)
```
Keep anything that synchronises with the GPU (`.item()`, `torch.cuda.synchronize()`, a CPU copy of a
gradient) out of the backward pass: it serialises the reduction behind it. With gradient
accumulation, skip the reduction of all but the last micro-batch (`with model.no_sync():`). If the
transfer itself is long, communicate less: bf16 gradients (DDP comm hook `bf16_compress_hook`), larger
per-GPU batches, or sharding strategies that fit the interconnect.

## Thresholds
Fires when the collectives' exposed time (all-gathers left out) is at least 5 % of the median step and
at least 0.1 ms per step, and less than half of their time overlaps the rank's own work (the thresholds
of `comm-overlap`). The saving is an upper bound: the median step with the exposed time hidden
completely, waits for other ranks included.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import collectives as coll, runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder, job_folder

from .base import Rule

KIND_WORDS = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter", "all_to_all": "all-to-all",
              "send_recv": "send/receive", "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
              "gather": "gather", "scatter": "scatter", "other": "unnamed collective kernels"}


# by the collective that holds the rank longest
ADVICE = {
    "all_reduce": ("Reduce the gradients during the backward pass (DDP buckets, no syncs inside backward), and find "
                   "out how much of this time is a wait for another rank."),
    "all_to_all": ("Overlap the all-to-all exchanges with compute (TorchRec's TrainPipelineSparseDist pipelines the "
                   "embedding all-to-all of the next batch beside this one; MoE layers can split their dispatch "
                   "into chunks that overlap the experts' compute), and find out how much of this time is a wait "
                   "for another rank."),
    "send_recv": ("Sends and receives with nothing beside them are a pipeline's bubble: more micro-batches per step, "
                  "or an interleaved schedule (virtual pipeline stages), shrink it; find out how much of this time "
                  "is a wait for another stage."),
    "barrier": ("A barrier in the loop (`dist.barrier()`) holds every rank until the slowest arrives, every step: "
                "take it out of the step, or run it only where ranks must agree (checkpoints, evaluation)."),
    "reduce_scatter": ("Reduce-scatter each layer's gradients while the previous layer's backward computes (FSDP's "
                       "backward prefetch, ZeRO's overlap_comm), and find out how much of this time is a wait for "
                       "another rank."),
}


class ExposedComm(Rule):
    code = "GA136"
    name = "exposed-comm"
    topic = "comm-overlap"
    title = "Collectives leave the rank with nothing to do (one rank's trace)"
    thresholds = {"max_overlap_pct": 50.0, "min_exposed_share_pct": 5.0, "min_exposed_ms": 0.1}
    job_replaces = True  # with every rank's trace, comm-overlap and straggler tell the wait from the transfer

    def check(self, a: Analysis):
        c = a.collectives
        if c is None or not len(c):
            return []
        m = a.metrics
        # a GPU job's collectives on a CPU backend are cpu-backend-on-gpu's (its fix changes the transfer itself)
        on_gpu = m.has_gpu
        rows = np.flatnonzero(np.array([k != "all_gather" and (w == coll.KERNEL or not on_gpu)
                                        for k, w in zip(c.kind, c.where)], dtype=bool))
        if not len(rows):
            return []
        comm = iv.union(c.start_us[rows] - c.base_us, c.end_us[rows] - c.base_us)
        busy = (c.busy[0] - c.base_us, c.busy[1] - c.base_us)
        exposed = iv.subtract(comm, busy)
        lo, hi = perstep.windows(m)
        comm_us = perstep.median(iv.covered(*comm, lo, hi))
        exposed_us = perstep.median(iv.covered(*exposed, lo, hi))
        step = m.median_step_us
        if comm_us <= 0 or step <= 0:
            return []
        share = 100.0 * exposed_us / step
        overlap = 100.0 * max(0.0, 1.0 - exposed_us / comm_us)
        t = self.thresholds
        if (share < t["min_exposed_share_pct"] or exposed_us < 1e3 * t["min_exposed_ms"]
                or overlap >= t["max_overlap_pct"]):
            return []
        statistic = "median step" if m.steps else "traced window"
        each = "per step" if m.steps else "in the traced window"
        of_step = f"of {perstep.the_median_step(m)}" if m.steps else "of the traced window"
        kinds = _by_kind(c, rows, m)
        named = ", ".join(KIND_WORDS.get(k, k.replace("_", " ")) for k in kinds)
        world = a.model.meta.world_size
        job = f" (one of {world} in the job)" if world and world > 1 else ""
        message = (f"This rank{job} spends {comm_us / 1e3:.2f} ms {each} inside collectives ({named}), and for "
                   f"{exposed_us / 1e3:.2f} ms of it ({share:.1f} % {of_step}) it does nothing else: only "
                   f"{overlap:.1f} % of that time overlaps its own compute. From this trace alone the wait for "
                   "slower ranks cannot be told from the transfer: both are in that time.")
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            items=[{"collective": KIND_WORDS.get(k, k.replace("_", " ")), "per_step": v["count"], "ms_inside": v["ms"]}
                   for k, v in kinds.items()],
            numbers={"comm_ms_per_step": a.ms(comm_us), "exposed_ms_per_step": a.ms(exposed_us),
                     "exposed_share_pct": round(share, 1), "comm_overlap_pct": round(overlap, 1),
                     "world_size": world, "statistic": statistic},
        )
        basis = (f"upper bound: the exposed time inside collectives hidden completely ({statistic}), waits for "
                 "other ranks included; every rank's trace tells the two apart")
        advice = ADVICE.get(next(iter(kinds)), ADVICE["all_reduce"])
        f = self.finding(message=message, evidence=evidence, saving=share, basis=basis, advice=advice,
                         fix=self._fix(a.facts, gpu=any(w == coll.KERNEL for w in c.where)))
        f.impact.upper_bound = True
        return [f]

    def _fix(self, facts: dict, gpu: bool = True) -> str:
        return ddp_fix(self.fix, facts, gpu)

    def positive(self) -> TraceBuilder:
        # rank 0 of a job that all-reduces after all of backward, in one bucket: 3 ms exposed in a ~13 ms step
        return job_folder(ranks=4, compute_us=10_000, transfer_us=3_000, buckets=1).ranks[0]

    def negative(self) -> TraceBuilder:
        # the same 3 ms of all-reduce in 4 buckets, each reduced while the next bucket computes
        return job_folder(ranks=4, compute_us=10_000, transfer_us=750, buckets=4).ranks[0]


def ddp_fix(fix: str, facts: dict, gpu: bool, buckets_split: bool = True) -> str:
    """A Fix block's DDP(...) call as it applies to this job: `device_ids` only where the collectives run on
    a GPU (a gloo job on the CPU takes none), and none of the settings run.json records as set already on
    every DDP the script built (`bucket_cap_mb` at the 10 asked for or below), nor `bucket_cap_mb` where no
    bucket size splits the gradients (`buckets_split` False)."""
    built = runfacts.ddp(facts)
    already = {
        "bucket_cap_mb=": not buckets_split or (
            bool(built) and all(d.bucket_cap_mb is not None and d.bucket_cap_mb <= 10 for d in built)),
        "gradient_as_bucket_view=": bool(built) and all(d.gradient_as_bucket_view for d in built),
        "static_graph=": bool(built) and all(d.static_graph for d in built),
    }
    lines = []
    for line in fix.splitlines():
        if any(key in line and done for key, done in already.items()):
            continue
        if not gpu and "device_ids=[local_rank]" in line:
            line = line.replace(" device_ids=[local_rank],", "").replace("device_ids=[local_rank], ", "")
        lines.append(line)
    return "\n".join(lines)


def _by_kind(c, rows: np.ndarray, m) -> dict:
    """Per kind of collective, the median step's count and time inside them (the longest first)."""
    out = {}
    kinds = np.array([c.kind[i] for i in rows.tolist()], dtype=object)
    issued = c.issued_us[rows]
    dur = (c.end_us - c.start_us)[rows]
    for k in dict.fromkeys(kinds.tolist()):
        mine = kinds == k
        out[k] = {"count": perstep.median(perstep.issued(m, issued[mine])),
                  "ms": round(perstep.median(perstep.issued(m, issued[mine], dur[mine])) / 1e3, 3)}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))


RULE = ExposedComm()

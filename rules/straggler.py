"""straggler: one rank is slower than the others, and the whole job waits for it every step.

## What it detects
A rank that needs more time per step than the other ranks, step after step. Steps are matched across
ranks by their ProfilerStep number. In a synchronous job (DDP, FSDP, tensor parallel) a collective
ends only when the last rank joins it, so the faster ranks spend the difference waiting inside their
NCCL kernels and every rank's step ends up as long as the slowest one's. A rank's *work* in a step is
therefore its step time minus that wait (its exposed communication beyond the least any rank had in
that step, the TensorBoard plugin's "synchronizing time"); the straggler is the rank with the most
work. The finding says whether its extra time is GPU compute, DataLoader waits or other host time.

## Why it matters
The job runs at the speed of its slowest rank: every other GPU idles (inside its all-reduce) for as
long as the straggler is behind. One slow rank in 8 costs 7 GPUs that time.

## Fix
```python
# Give every rank the same amount of work: the same number of samples (and, for variable-length
# data, about the same number of tokens) per step.
sampler = torch.utils.data.distributed.DistributedSampler(dataset, drop_last=True)
# Keep per-rank extras (logging, metrics, checkpoints, evaluation on rank 0) off the step, or make
# them asynchronous; read values once per log interval, not with .item() every step.
if dist.get_rank() == 0 and step % log_every == 0:
    log_metrics(loss.detach())
```
If the straggler's extra time is GPU compute and its inputs are the same size as everyone else's, the
GPU itself is slower: check clocks, temperature and throttling (`nvidia-smi -q -d PERFORMANCE,CLOCK`),
ECC errors, and its PCIe/NVLink placement. If it waits for data, its input pipeline or storage is
slower (more `num_workers`, local copies of the data). If it is host time, look for CPU contention on
that node (other processes, too few cores per rank, NUMA binding).

## Thresholds
Fires when one rank is the slowest in at least half of the matched steps (and at least one), with a
median of at least 10 % more work than the median of the other ranks in those steps. The predicted
saving is the job's step time if that rank ran at the speed of the others (the next slowest rank
then sets the pace), summed over the matched steps. Needs at least two ranks with a known rank
(distributedInfo or a rank in the file name) and a common ProfilerStep.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import RankFolder, job_folder

from .base import JobRule


class Straggler(JobRule):
    code = "GA130"
    name = "straggler"
    title = "One rank is slower than the others and the job waits for it"
    thresholds = {"min_slowest_share": 0.5, "min_slower_pct": 10.0}

    def check(self, a):
        job = a.job
        if not job.stragglers:
            return []
        rank, count = Counter(s.rank for s in job.stragglers).most_common(1)[0]
        mine = [s for s in job.stragglers if s.rank == rank]
        slower = float(np.median([s.slower_pct for s in mine]))
        if count / len(job.stragglers) < self.thresholds["min_slowest_share"] or slower < self.thresholds["min_slower_pct"]:
            return []
        ids = job.rank_ids
        i = ids.index(rank)
        others = [j for j in range(len(ids)) if j != i]
        g = job.grid
        cols = [job.steps.index(s.step) for s in mine]
        job_step = g["dur_us"].max(axis=0)
        paced = g["work_us"][others].max(axis=0)  # the next slowest rank sets the pace
        saving = 100.0 * float(np.clip(job_step - paced, 0, None).sum()) / max(float(job_step.sum()), 1e-9)

        work = float(np.median(g["work_us"][i, cols]))
        ref = float(np.median([s.others_median_us for s in mine]))
        wait_others = float(np.median(g["wait_us"][others][:, cols]))
        why, advice = _diagnose(g, i, others, cols, rank, a.rank_findings.get(rank, []))
        n_steps = len(job.stragglers)
        versus = (f"{ref / 1e3:.2f} ms for rank {ids[others[0]]}" if len(others) == 1 else
                  f"{ref / 1e3:.2f} ms for the median of the other {len(others)} ranks")
        waiting = (f", which wait a median {wait_others / 1e3:.2f} ms per step for it inside their collectives"
                   if wait_others >= 10 else "")
        message = (f"Rank {rank} is the slowest in {count} of {n_steps} step{'s' if n_steps != 1 else ''}, "
                   f"{slower:.0f} % slower than the median rank: it needs a median {work / 1e3:.2f} ms of work per "
                   f"step against {versus}{waiting}. {why}")
        items = [{"rank": ids[j], "work_ms": a.ms(np.median(g["work_us"][j, cols])),
                  "step_ms": a.ms(np.median(g["dur_us"][j, cols])), "wait_ms": a.ms(np.median(g["wait_us"][j, cols])),
                  "compute_ms": a.ms(np.median(g["compute_us"][j, cols]))}
                 for j in sorted(range(len(ids)), key=lambda j: -float(np.median(g["work_us"][j, cols])))][:8]
        own = job.ranks[i]
        starts = dict(zip(own.steps, zip(own.start_us, own.dur_us)))
        evidence = Evidence(
            steps=[s.step for s in mine],
            time_ranges_ms=[(a.ms(starts[s.step][0]), a.ms(starts[s.step][0] + starts[s.step][1])) for s in mine][:8],
            items=items,
            numbers={"straggler_rank": rank, "slowest_in_steps": count, "steps_compared": n_steps,
                     "slower_than_median_pct": round(slower, 1), "straggler_work_ms": a.ms(work),
                     "median_rank_work_ms": a.ms(ref), "others_wait_ms": a.ms(wait_others),
                     "ranks": len(ids)},
        )
        basis = (f"job step time over {n_steps} matched step{'s' if n_steps != 1 else ''} if rank {rank} ran at the "
                 f"speed of the other ranks (the next slowest rank then sets the pace)")
        f = self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)
        f.rank = rank
        f.trace = job.ranks[i].source
        return [f]

    def positive(self) -> RankFolder:
        return job_folder(ranks=8, straggler=5, slowdown=1.4)

    def negative(self) -> RankFolder:
        return job_folder(ranks=8, straggler=5, slowdown=1.05)  # 5 % slower: within normal jitter


def _diagnose(g, i, others, cols, rank, own_findings) -> tuple[str, str]:
    """Where the straggler's extra time goes: GPU compute, DataLoader, or other host time."""
    def extra(col):
        return float(np.median(g[col][i, cols]) - np.median(np.median(g[col][others][:, cols], axis=0)))

    total = max(extra("work_us"), 1e-9)
    compute, loader = extra("compute_us"), extra("dataloader_us")
    topics = sorted({f.topic for f in own_findings})
    theirs = f" Rank {rank}'s own findings ({', '.join(topics)}) show where its time goes." if topics else ""
    if loader >= 0.5 * total:
        return (f"Most of the extra time ({loader / 1e3:.2f} ms per step) is rank {rank} waiting for its DataLoader.",
                f"Speed up rank {rank}'s input pipeline (workers, local data, pre-processed samples).{theirs}")
    if compute >= 0.5 * total:
        return (f"Most of the extra time ({compute / 1e3:.2f} ms per step) is GPU compute: rank {rank}'s kernels run "
                f"longer.",
                f"Either rank {rank} gets more work (uneven batches or sequence lengths, unbalanced model shards, "
                f"MoE routing) or its GPU is slower (clocks, temperature, throttling).{theirs}")
    return (f"The extra time is on the host side of rank {rank} (its GPU computes no longer than the others').",
            f"Look for work only rank {rank} does (logging, checkpointing, evaluation) or for CPU contention on its "
            f"node.{theirs}")


RULE = Straggler()

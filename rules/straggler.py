"""straggler: one rank is slower than the others, and the whole job waits for it every step.

## What it detects
The rank the other ranks wait for. In a synchronous job (DDP, FSDP, tensor parallel) a collective ends
only when the last rank joins it. Every collective is lined up across the ranks (by process group and
sequence number, else by its place in the step; the ranks' clocks aligned by the collectives' ends), on
every backend: NCCL/RCCL kernels and CPU backends such as gloo alike. A rank's *wait* in a collective is
the last rank's arrival minus its own, the part of it it did nothing else is time its step lost, and the
rank that arrived last *caused* the others' wait. Per step, the straggler is the rank that caused the
most wait (without collectives: the one with the most *work*, its step time minus its wait). The finding
says why that rank is late: its DataLoader, syncs with its GPU, GPU compute, CPU ops, Python between ops
(with the op that follows it), or a step that began late, and lists the rank's own findings. Where the
run sampled the GPUs' telemetry (NVML, the `nvml` extra: `telemetry.rankN.jsonl`), a straggler whose SM
clock ran lower than the other ranks' beyond chance (one-sided Mann-Whitney on the samples, p < 0.01, at
least 5 % lower) is named as a slower GPU, with the throttle reasons NVML reported, and the machine's fix.

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
slower (more `num_workers`, local copies of the data). If it is host time, look for work only that rank
does, or for CPU contention on that node (other processes, too few cores per rank, NUMA binding).

## Thresholds
Fires when one rank is the straggler in at least half of the matched steps (and at least one), and
either the other ranks wait for it a median of at least 10 % of the job's step or it does at least 10 %
more work than the median of the other ranks, and the lead is no accident: it is the last rank in more
steps than chance would give with that many ranks (at most a 5 % chance for any rank), or its lead (the
wait it causes; in a job without collectives, its extra work) is at least 3 times the step-to-step
jitter of the other ranks' work (the standard deviation of each rank's work over the steps, pooled; with
one step only the thresholds above decide). Two ranks over three steps cannot show the first, so there
the lead must stand out. The predicted saving is the job's step time if that rank ran at the speed of
the others (the next slowest rank then sets the pace), over the matched steps. Needs at least two ranks
with a known rank (distributedInfo or a rank in the file name) and a common ProfilerStep. With only some
of the job's ranks traced, the waits are for the last traced rank.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from gpuadvise.analyzer.measure.longrun.throttling import clock_gap
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import RankFolder, job_folder

from .base import JobRule


class Straggler(JobRule):
    code = "GA130"
    name = "straggler"
    title = "One rank is slower than the others and the job waits for it"
    thresholds = {"min_slowest_share": 0.5, "min_slower_pct": 10.0, "min_waited_share_pct": 10.0,
                  "max_chance": 0.05, "min_jitters": 3.0}

    def check(self, a):
        job = a.job
        if not job.stragglers:
            return []
        rank, count = Counter(s.rank for s in job.stragglers).most_common(1)[0]
        mine = [s for s in job.stragglers if s.rank == rank]
        g = job.grid
        cols = [job.steps.index(s.step) for s in mine]
        work = float(np.median(g["work_us"][job.rank_ids.index(rank), cols]))
        ref = float(np.median([s.others_median_us for s in mine]))
        slower = 100.0 * (work / ref - 1.0) if ref > 0 else 0.0  # the medians the message quotes
        job_step = g["dur_us"].max(axis=0)
        waited_share = 100.0 * float(np.median([s.caused_us for s in mine])) / max(float(np.median(job_step[cols])), 1e-9)
        t = self.thresholds
        if count / len(job.stragglers) < t["min_slowest_share"] or (
                slower < t["min_slower_pct"] and waited_share < t["min_waited_share_pct"]):
            return []
        if not _beyond_jitter(job, rank, count, max(work - ref, 0.0), mine, t):
            return []
        ids = job.rank_ids
        i = ids.index(rank)
        others = [j for j in range(len(ids)) if j != i]
        paced = g["work_us"][others].max(axis=0)  # the next slowest rank sets the pace
        saving = 100.0 * float(np.clip(job_step - paced, 0, None).sum()) / max(float(job_step.sum()), 1e-9)

        wait_others = float(np.median(g["wait_us"][others][:, cols]))
        why, advice = _diagnose(job, i, others, cols, rank, a.rank_findings.get(rank, []))
        n_steps = len(job.stragglers)
        versus = (f"{ref / 1e3:.2f} ms for rank {ids[others[0]]}" if len(others) == 1 else
                  f"{ref / 1e3:.2f} ms for the median of the other {len(others)} ranks")
        whom = f"rank {ids[others[0]]} waits" if len(others) == 1 else "the other ranks wait"
        waiting = (f"{whom} a median {wait_others / 1e3:.2f} ms per step for it inside their collectives "
                   f"({waited_share:.0f} % of the job's step)" if wait_others >= 10 else "")
        if slower >= t["min_slower_pct"]:
            lead = (f"It is {slower:.0f} % slower than the median rank: it needs a median {work / 1e3:.2f} ms of work "
                    f"per step against {versus}" + (f", and {waiting}" if waiting else ""))
        else:
            lead = (f"{waiting[0].upper()}{waiting[1:]}, although its own work per step ({work / 1e3:.2f} ms) is no "
                    f"more than theirs")
        when = (" (no ProfilerStep: each rank's trace compared as one step)" if job.whole_trace else
                f" in {count} of {n_steps} step{'s' if n_steps != 1 else ''}")
        message = f"Rank {rank} is the rank the job waits for{when}. {lead}. {why}"
        items = [{"rank": ids[j], "work_ms": a.ms(np.median(g["work_us"][j, cols])),
                  "step_ms": a.ms(np.median(g["dur_us"][j, cols])), "wait_ms": a.ms(np.median(g["wait_us"][j, cols])),
                  "others_waited_ms": a.ms(np.median(g["caused_us"][j, cols])),
                  "compute_ms": a.ms(np.median(g["compute_us"][j, cols]))}
                 for j in sorted(range(len(ids)), key=lambda j: -float(np.median(g["work_us"][j, cols])))][:8]
        own = job.ranks[i]
        starts = dict(zip(own.steps, zip(own.start_us, own.dur_us)))
        evidence = Evidence(
            steps=[] if job.whole_trace else [s.step for s in mine],
            time_ranges_ms=[(a.ms(starts[s.step][0]), a.ms(starts[s.step][0] + starts[s.step][1])) for s in mine][:8],
            items=items,
            numbers={"straggler_rank": rank, "slowest_in_steps": count, "steps_compared": n_steps,
                     "slower_than_median_pct": round(slower, 1), "straggler_work_ms": a.ms(work),
                     "median_rank_work_ms": a.ms(ref), "others_wait_ms": a.ms(wait_others),
                     "others_wait_share_pct": round(waited_share, 1), "ranks": len(ids), "statistic": "median step"},
        )
        basis = (f"job step time over {n_steps} matched step{'s' if n_steps != 1 else ''} if rank {rank} ran at the "
                 f"speed of the other ranks (the next slowest rank then sets the pace)")
        clocks = _clock_gap(a, rank)
        if clocks is not None:  # its GPU itself runs slower: the machine's fix comes first
            message += " " + clocks.rank_sentence(rank)
            advice = f"Rank {rank}'s GPU: " + clocks.advice() + " " + advice
            evidence.numbers.update(clocks.numbers())
        f = self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)
        f.rank = rank
        f.trace = job.ranks[i].source
        return [f]

    def positive(self) -> RankFolder:
        return job_folder(ranks=8, straggler=5, slowdown=1.4)

    def negative(self) -> RankFolder:
        return job_folder(ranks=8, straggler=5, slowdown=1.05)  # 5 % slower: within normal jitter


def _clock_gap(a, rank):
    """The straggler's GPU clock against the other ranks' over the run (measure/longrun/throttling.py), where the
    run sampled the GPUs' telemetry (`a.telemetry`: rank → Telemetry); None without it or without a gap."""
    telemetry = getattr(a, "telemetry", None) or {}
    if rank not in telemetry:
        return None
    return clock_gap(telemetry[rank], [t for r, t in telemetry.items() if r != rank])


def _beyond_jitter(job, rank: int, count: int, extra_work_us: float, mine: list, t: dict) -> bool:
    """A rank that is last by chance is no straggler. Either it is last in more steps than chance gives
    (with R ranks each is last in 1/R of the steps when they only jitter: 2 ranks over 3 steps always give
    one of them 2), or its lead (the wait it causes; without collectives, its extra work) stands out of the
    step-to-step jitter of the other ranks' work."""
    n, ranks = len(job.stragglers), len(job.rank_ids)
    p = 1.0 / max(ranks, 1)
    chance = sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(count, n + 1))
    if ranks * chance <= t["max_chance"]:  # any of the ranks could have been the one
        return True
    work = job.grid["work_us"][[j for j, r in enumerate(job.rank_ids) if r != rank]]
    free = work.size - work.shape[0]  # each rank's own mean taken out
    if free < 1:
        return True  # one step: no jitter to measure, the thresholds alone decide
    # the standard deviation, pooled over the other ranks: with three steps a median of deviations is
    # one of two numbers and misses the step that jittered
    jitter = math.sqrt(float(np.square(work - work.mean(axis=1, keepdims=True)).sum()) / free)
    lead = max(float(np.median([s.caused_us for s in mine])), extra_work_us)
    return lead >= t["min_jitters"] * max(jitter, 1.0)


# Where a rank's step time goes (per-step grid columns of the job view), and how each part reads
_PARTS = (
    ("dataloader_us", "rank {r} waiting for its DataLoader",
     "Speed up rank {r}'s input pipeline (workers, local data, pre-processed samples)."),
    ("sync_us", "rank {r}'s training thread blocked in syncs with its GPU (`.item()`, `.cpu()`, synchronize)",
     "Take the syncs out of rank {r}'s steps (or out of the code only rank {r} runs, such as logging)."),
    ("compute_us", "GPU compute: rank {r}'s kernels run longer",
     "Either rank {r} gets more work (uneven batches or sequence lengths, unbalanced model shards, MoE routing) "
     "or its GPU is slower (clocks, temperature, throttling)."),
    ("op_us", "CPU time inside rank {r}'s recorded ops",
     "Rank {r}'s CPU does more, or is slower: look for work only it does, or for CPU contention on its node."),
    ("untraced_us", "Python on rank {r}'s training thread outside every recorded op",
     "Look for work only rank {r} does between ops (input preparation, logging, checkpointing, a sleep); "
     "`gpuadvise profile --with-stack` shows the lines."),
    ("late_us", "the step beginning late: rank {r} starts its steps after the others",
     "The time is lost before rank {r}'s step begins (the step before, or work between steps such as "
     "checkpointing or evaluation only it does)."),
)


def _diagnose(job, i, others, cols, rank, own_findings) -> tuple[str, str]:
    """Where the straggler's extra time goes: the part of its step that exceeds the other ranks' most."""
    g = job.grid

    def extra(col):
        return float(np.median(g[col][i, cols]) - np.median(np.median(g[col][others][:, cols], axis=0)))

    topics = sorted({f.topic for f in own_findings if f.topic != "capture-problem"})
    theirs = f" Rank {rank}'s own findings ({', '.join(topics)}) show where its time goes." if topics else ""
    col, what, advice = max(_PARTS, key=lambda p: extra(p[0]))
    amount = extra(col)
    if amount <= 0:
        return ("Its extra time is not in one part of its step the trace records.",
                f"Compare rank {rank}'s steps with the others' in the timeline (`gpuadvise view`).{theirs}")
    where = ""
    if col == "untraced_us":
        before = Counter(job.ranks[i].gap_before[job.ranks[i].steps.index(job.steps[c])] for c in cols)
        name, _ = before.most_common(1)[0]
        where = f", mostly before `{name}`" if name else ""
    return (f"Most of the extra time ({amount / 1e3:.2f} ms per step) is {what.format(r=rank)}{where}.",
            advice.format(r=rank) + theirs)


RULE = Straggler()

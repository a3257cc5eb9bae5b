"""group-comm: one process group's collectives hold the step (a device mesh: FSDP × tensor parallel, pipeline, experts).

## What it detects
A job whose collectives run on several kinds of process group (a device mesh: FSDP over one dimension,
tensor parallelism over another, pipeline stages, expert parallelism), or on one whose most exposed
collectives the trace shows come from FSDP, tensor or pipeline parallelism or an all-to-all (an expert
layer's dispatch, sharded embeddings' lookups). Each collective is lined up across its own group's ranks and placed in the phase that issued it ("FSDP all-gather in forward", "tensor parallel
all-reduce in backward"), and each kind of group gets the time its ranks spend inside its collectives
with nothing else to do, split into the wait for the group's last rank and the transfer (see the job
section of the report). The group whose exposed transfer, hidden behind compute on every rank, would
shorten the job's step most is the one that holds it: the job's ranks are replayed side by side with
that group's exposed transfer taken out, each collective ending when its group's last rank arrives.

## Why it matters
On a mesh the communication is several problems, one per group, each with its own fix: a
tensor-parallel all-reduce sits on the critical path of every layer in forward and backward, an FSDP
all-gather before each layer and a reduce-scatter after it, a pipeline's sends and receives between
stages. Adding them into one "communication" figure, or answering with data-parallel advice (buckets,
prefetch), misses which one the step waits for.

## Fix
By the group that holds the step:
```python
# FSDP (fully_shard): prefetch the next all-gathers, keep the last blocks unsharded for backward, and
# shard over fewer ranks (HSDP: replicate across nodes, shard within one)
for i, block in enumerate(blocks):
    fully_shard(block, mesh=mesh["dp"], reshard_after_forward=i < len(blocks) - 1)
    block.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
# mesh = init_device_mesh("cuda", (nodes, gpus_per_node), mesh_dim_names=("replicate", "shard"))

# Tensor parallel: sequence parallelism turns each all-reduce into a reduce-scatter and an all-gather
# that overlap the norms' compute; async TP (torch.compile) overlaps them with the matmuls; keep the TP
# dimension inside a node (the mesh's last dimension)
torch._inductor.config._micro_pipeline_tp = True
```
Pipeline: more micro-batches per step, or an interleaved schedule (`ScheduleInterleaved1F1B`).
All-to-all (expert parallel, sharded embeddings): the dispatch split into chunks that overlap the experts'
compute, or the next batch's embedding exchange pipelined beside this one; a lower capacity factor.
On a job that run.json shows on one node, the advice leaves out what concerns nodes (HSDP across them, a
group kept inside one). An FSDP reduce-scatter is asked to reduce the gradients in bf16
(`MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)`) unless run.json shows every `fully_shard` call
reducing in bf16 or fp16 already: its `reduce_dtype`, or its `param_dtype` where that is unset.

## Thresholds
Fires when the job's collectives run on two or more kinds of process group, or on one whose most exposed
collectives are FSDP's, tensor or pipeline parallelism's or an all-to-all, and a kind of group leaves
every one of its ranks an exposed transfer of at least 5 % of the job's step time and 0.1 ms per step
(comm-overlap's thresholds; comm-overlap leaves such jobs to this rule); of the groups that do, the one
whose hidden transfer saves most holds the step. The saving is an upper bound: the job's step with that
group's exposed transfer hidden on every rank, by the job replay.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.job.commphases import SCHEMES
from gpuadvise.analyzer.measure.job.jobmodel import job_saving_pct
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import RankFolder
from gpuadvise.fixtures.meshjob import mesh_job

from .base import JobRule

PARALLEL = ("fsdp", "tp", "pp", "a2a")  # the schemes this rule advises on where a job has one kind of group


def told_by_group(job) -> bool:
    """Whether the job's communication is this rule's to tell: two or more kinds of process group, or one
    whose most exposed collectives come from FSDP, tensor or pipeline parallelism, or an all-to-all."""
    groups = job.groups
    return len(groups) >= 2 or (len(groups) == 1 and bool(groups[0]["phases"])
                                and groups[0]["phases"][0]["scheme"] in PARALLEL)


class GroupComm(JobRule):
    code = "GA137"
    name = "group-comm"
    topic = "comm-overlap"
    title = "One process group's communication holds the step"
    thresholds = {"min_exposed_share_pct": 5.0, "min_exposed_ms": 0.1}

    def check(self, a):
        job = a.job
        if not job.steps or job.matched is None or not told_by_group(job):
            return []
        m = job.matched
        job_step = float(np.median(job.grid["dur_us"].max(axis=0)))
        if job_step <= 0:
            return []
        scored = []
        for g in job.groups:
            gids = {x["group"] for x in g["groups"]}
            cols = np.flatnonzero([gid in gids for gid in m.group])
            saving = job_saving_pct(job, {}, hidden=cols) or 0.0
            every = min((r["transfer_ms"] for r in g["per_rank"]), default=0.0)  # the exposed transfer every rank has
            scored.append((saving, every, g))
        t = self.thresholds
        big = [s for s in scored if 100.0 * s[1] * 1e3 / job_step >= t["min_exposed_share_pct"]
               and s[1] >= t["min_exposed_ms"]]
        if not big:
            return []
        saving, every, top = max(big, key=lambda s: (s[0], s[1]))
        share = 100.0 * every * 1e3 / job_step
        phase = top["phases"][0]
        ranks = " ".join(str(x["ranks"]) for x in top["groups"][:6]) + (" …" if len(top["groups"]) > 6 else "")
        others = [(s, g) for s, _, g in scored if g is not top]
        rest = "; ".join(f"{g['shown']} {g['exposed_ms']:.2f} ms exposed, ~{s:.1f} % from hiding its transfer"
                         for s, g in others[:3])
        several = len(top["groups"]) > 1
        if top["desc"]:
            name = f"{top['family']} group{'s' if several else ''}" + (f" ({top['role']})" if top["role"] else "")
        elif top["role"]:
            name = top["family"] if several else top["family"].replace("groups", "group", 1)
        else:
            name = "process groups" if several else "process group"
        message = (f"The {name}, ranks {ranks}, hold{'' if several else 's'} the job's step: "
                   f"{'their' if several else 'its'} collectives leave a rank with nothing "
                   f"else to do for {top['exposed_ms']:.2f} ms per step; the transfer alone, {top['transfer_ms']:.2f} ms, "
                   f"and the wait for the group's other ranks alone, {top['wait_ms']:.2f} ms (each a median over the "
                   f"group's ranks and steps of its own, so the two need not add up to the whole); most of it in {phase['label']} ({phase['exposed_ms']:.2f} ms, {phase['per_step']:g} per "
                   f"step). Hiding that transfer behind compute on every rank would shorten the job's step by "
                   f"~{saving:.1f} %." + (f" The other groups: {rest}." if rest else ""))
        evidence = Evidence(
            steps=[] if job.whole_trace else list(job.steps),
            items=[{"group": g["family"], "role": g["role"] or "–", "phase": p["label"], "per_step": p["per_step"],
                    "exposed_ms": p["exposed_ms"], "wait_ms": p["wait_ms"], "transfer_ms": p["transfer_ms"]}
                   for _, _, g in sorted(scored, key=lambda s: -s[0]) for p in g["phases"][:6]][:16],
            numbers={"group": top["family"], "groups": len(top["groups"]), "exposed_ms_per_step": top["exposed_ms"],
                     "transfer_ms_per_step": top["transfer_ms"], "wait_ms_per_step": top["wait_ms"],
                     "exposed_transfer_every_rank_ms": round(every, 3), "exposed_transfer_share_pct": round(share, 1),
                     "job_step_ms": round(job_step / 1e3, 3), "statistic": "median step"},
        )
        advice = _advice(top, phase, a.facts, job.mesh)
        basis = (f"upper bound: the {len(job.ranks)} traced ranks replayed side by side with the exposed transfer of "
                 f"{top['shown']} hidden behind compute on every rank, each collective ending when its group's last "
                 "rank arrives")
        f = self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)
        f.impact.upper_bound = True
        return [f]

    def positive(self) -> RankFolder:
        # a 2 × 2 mesh whose tensor-parallel all-reduces (2 ms each) hold every layer in forward and backward
        return mesh_job(dp=2, tp=2, steps=3, compute_us=2_000, allreduce_us=2_000)

    def negative(self) -> RankFolder:
        # the same mesh with short collectives: nothing holds the step long
        return mesh_job(dp=2, tp=2, steps=3, compute_us=20_000, allgather_us=100, reduce_scatter_us=100, allreduce_us=100)


def _advice(group: dict, phase: dict, facts: dict, mesh: dict | None) -> str:
    """What to change, in the terms of the parallelism behind the group's most exposed collectives, leaving
    out what run.json shows set."""
    scheme, kind = phase["scheme"] or group["scheme"], phase["collective"]
    if scheme == "fsdp":
        shards = runfacts.fsdp(facts).get("fully_shard", [])
        prefetch = runfacts.fsdp(facts).get("prefetch", {})
        tips = []
        if kind == "all_gather":
            if not prefetch:
                tips.append("prefetch the next blocks' all-gathers (`set_modules_to_forward_prefetch`, "
                            "`set_modules_to_backward_prefetch`)")
            if phase["phase"] == "backward" and not any(s.get("reshard_after_forward") is False for s in shards):
                tips.append("keep the last blocks unsharded after forward (`reshard_after_forward=False`) so "
                            "backward does not gather them again")
        elif kind == "reduce_scatter" and not (shards and all(_reduces_in_16_bit(s) for s in shards)):
            tips.append("reduce the gradients in bf16 (`MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)`)")
        if _nodes(facts) != 1:  # one node has no nodes to replicate across
            tips.append("shard over fewer ranks: HSDP (a 2-D mesh that replicates across nodes and shards within one)")
        if not tips:
            tips.append("its transfers are as few and as small as its settings make them: check how much of its time is "
                        "a wait for the group's slowest rank (the job table), and overlap what is left with compute")
        return "FSDP: " + "; ".join(tips) + "."
    if scheme == "tp":
        dims = (mesh or {}).get("dims") or []
        inner = " (it is the mesh's last dimension already)" if dims and group.get("dim") == dims[-1] else \
            " (make it the mesh's last dimension)" if dims else ""
        node = "" if _nodes(facts) == 1 else f"; keep the tensor-parallel group inside a node{inner}"
        return ("Tensor parallel: use sequence parallelism (`SequenceParallel` for the norms, `PrepareModuleInput`) so each "
                "all-reduce becomes a reduce-scatter and an all-gather that overlap compute, or async TP "
                "(`torch._inductor.config._micro_pipeline_tp = True` under torch.compile) to overlap them with the "
                f"matmuls{node}.")
    if scheme == "pp":
        return ("Pipeline: the sends and receives with nothing beside them are the pipeline's bubble: more micro-batches "
                "per step, or an interleaved schedule (`ScheduleInterleaved1F1B`, virtual stages).")
    if scheme == "a2a":
        return ("All-to-all (an expert layer's token dispatch and combine, or sharded embeddings' lookups): overlap it "
                "with compute (split an MoE layer's dispatch into chunks that overlap the experts, or pipeline the next "
                "batch's embedding exchange beside this one, as TorchRec's TrainPipelineSparseDist does), lower an MoE "
                "layer's capacity factor" + ("." if _nodes(facts) == 1 else ", and keep the group inside a node."))
    who = SCHEMES.get(scheme, scheme) or "this group"
    return (f"{who[0].upper() + who[1:]}: start its collectives while compute still runs (DDP buckets, no syncs inside "
            "backward) and check how much of its time is a wait for the group's slowest rank.")


def _reduces_in_16_bit(shard: dict) -> bool:
    """Whether a `fully_shard` call (run.json) reduces its gradients in bf16 or fp16: in its policy's
    `reduce_dtype`, or in its `param_dtype` where that is unset (null; "None" in run.json files of before)."""
    reduce = shard.get("reduce_dtype")
    if reduce in (None, "None"):
        reduce = shard.get("param_dtype")
    return reduce in ("torch.bfloat16", "torch.float16")


def _nodes(facts: dict) -> int | None:
    """How many nodes the job ran on (run.json: world size over the ranks per node); None when not recorded."""
    j = runfacts.job(facts)
    if not j.world_size or not j.local_world_size or j.local_world_size <= 0:
        return None
    return max(1, -(-j.world_size // j.local_world_size))


RULE = GroupComm()

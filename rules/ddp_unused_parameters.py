"""ddp-unused-parameters: DDP searches for unused parameters every iteration (`find_unused_parameters=True`) although every parameter gets a gradient.

## What it detects
A DistributedDataParallel built with `find_unused_parameters=True` (run.json `distributed.ddp`, recorded
by `gpuadvise profile`) whose parameters all had a gradient after every optimizer step the run made, and
for which DDP's own search found no unused parameter (its logging data: 0 bytes unused). The flag's
cost is measured in the trace: each forward ends with DDP walking the autograd graph from the outputs
(the time `DistributedDataParallel.forward` spends after the model's own ops, where that walk runs),
and each backward all-reduces one more tensor, the map of the parameters it used (the smallest
all-reduce of each micro-batch on a backend that does not record sizes; the one whose element count
is the number of parameters where the trace records it), at the cost of the quickest of them in the
window (the rest of a slower one is waiting for another rank, which the flag does not cause).

## Why it matters
The search is for models with branches that skip parameters; without them it is pure overhead on every
iteration: a traversal of the whole autograd graph on the CPU, on the critical path before backward can
start, and an extra collective in every backward that every rank waits for. PyTorch warns about it once
("find_unused_parameters=True was specified … but did not find any unused parameters").

## Fix
```python
model = DDP(model, device_ids=[local_rank])  # find_unused_parameters defaults to False
# A model with a fixed graph can also say so, which lets DDP plan its buckets ahead:
model = DDP(model, device_ids=[local_rank], static_graph=True)
```
Keep `find_unused_parameters=True` only when some iterations really leave parameters out (branches,
frozen heads chosen per batch, MoE experts that get no tokens).

## Thresholds
Fires whenever the flag is on and no parameter lacked a gradient after an optimizer step (run.json:
needs `gpuadvise profile`). The predicted saving removes the post-forward graph walk and the used-map
all-reduce: by the critical-path replay on a GPU, else their time on the training thread over the
median step. An estimate: the walk's time is what the forward annotation holds after the model's ops.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.job.microbatches import forward_spans, step_rounds
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class DDPUnusedParameters(Rule):
    code = "GA133"
    name = "ddp-unused-parameters"
    title = "DDP looks for unused parameters every iteration, and there are none"
    thresholds = {}

    def check(self, a: Analysis):
        flagged = [d for d in runfacts.ddp(a.facts) if d.find_unused_parameters and d.params_without_grad == 0
                   and not d.unused_parameter_bytes]
        if not flagged:
            return []
        m = a.metrics
        walk_s, walk_e = _walks(a)
        extra = _used_map_allreduces(a, flagged[0].params)
        c = a.collectives
        # the map's all-reduce costs its transfer; what it waits for the other ranks is theirs to answer for,
        # so each is counted at the cost of the quickest of them in the window
        cost = float(c.exposed_us()[extra].min()) if len(extra) else 0.0
        issued = c.issued_us[extra] if len(extra) else np.zeros(0)
        walk_us = perstep.median(perstep.issued(m, walk_s, walk_e - walk_s))
        map_us = perstep.median(perstep.issued(m, issued, np.full(len(extra), cost)))
        saving, basis = self._saving(a, (walk_s, walk_e), extra, walk_us + map_us)
        where = ", ".join(d.created_at for d in flagged)
        message = (f"DistributedDataParallel ({where}) is built with find_unused_parameters=True, yet every one of its "
                   f"{flagged[0].params} parameters had a gradient after every optimizer step and DDP found none "
                   f"unused. The search costs {walk_us / 1e3:.2f} ms per step walking the autograd graph after each "
                   f"forward, and {map_us / 1e3:.2f} ms per step in the extra all-reduce of the used-parameter map "
                   f"(median step).")
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            items=[{"name": "DDP", **d.as_dict()} for d in flagged][:4],
            sources=[d.created_at for d in flagged],
            numbers={"graph_walk_ms_per_step": a.ms(walk_us), "used_map_allreduce_ms_per_step": a.ms(map_us),
                     "used_map_allreduces_per_step": float(perstep.median(perstep.issued(m, issued))),
                     "params": flagged[0].params, "statistic": "median step"},
        )
        keys = c.keys() if len(extra) else []
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis,
                             advice="Build DDP without find_unused_parameters (and with static_graph=True if the "
                                    "graph never changes).", removes=[keys[i] for i in extra.tolist()])]

    @staticmethod
    def _saving(a: Analysis, walks, extra: np.ndarray, total_us: float) -> tuple[float, str]:
        c = a.collectives
        kernels = np.array([int(x) for x in c.correlation[extra] if x >= 0]) if len(extra) else np.zeros(0, int)
        if a.replay is not None and (len(walks[0]) or len(kernels)):
            saving, basis = a.predicted_saving(Scenario(
                "DDP's unused-parameter search off: no graph walk after forward, no used-map all-reduce",
                cpu_removed=iv.union(*walks),
                gpu_time=lambda ops: np.where(ops["correlation"].isin(kernels).to_numpy(), 0.0, np.nan)))
            if saving is not None:
                return saving, f"estimate: {basis}"
        step = a.metrics.median_step_us
        return (100.0 * total_us / step if step > 0 else 0.0,
                "estimate: the graph walk after each forward and the used-map all-reduce's exposed time on the "
                "training thread (median per step), over the median step")

    def positive(self) -> TraceBuilder:
        return _ddp(unused_flag=True, params_without_grad=0)

    def negative(self) -> TraceBuilder:
        return _ddp(unused_flag=True, params_without_grad=2)  # a model that does leave parameters out


def _walks(a: Analysis) -> tuple[np.ndarray, np.ndarray]:
    """Per DDP forward, the stretch after the model's last op in it: where the unused-parameter search runs."""
    spans = forward_spans(a)
    if spans.empty:
        return np.zeros(0), np.zeros(0)
    cpu = a.model.cpu
    ops = cpu[~cpu["is_annotation"].to_numpy()]
    o_ts, o_end, o_tid = (ops[k].to_numpy() for k in ("ts", "end", "tid"))
    starts, ends = [], []
    for ts, end, tid in zip(spans["ts"].to_numpy(), spans["end"].to_numpy(), spans["tid"].to_numpy()):
        inside = (o_tid == tid) & (o_ts >= ts) & (o_end <= end)
        last = float(o_end[inside].max()) if inside.any() else float(ts)
        starts.append(last)
        ends.append(float(end))
    return np.array(starts), np.array(ends)


def _used_map_allreduces(a: Analysis, params: int | None) -> np.ndarray:
    """The used-parameter map's all-reduce in each micro-batch's backward: the one of `params` elements
    where sizes are recorded, else the shortest all-reduce of that backward (rows of a.collectives)."""
    c = a.collectives
    out = []
    for r in step_rounds(a):
        for rows in r.rounds:
            if len(rows) < 2:  # a backward with one all-reduce has no map all-reduce beside its bucket
                continue
            sized = rows[c.nelems[rows] == params] if params else rows[:0]
            out.append(int(sized[0]) if len(sized) else int(rows[np.argmin(c.end_us[rows] - c.start_us[rows])]))
    return np.array(out, dtype=np.int64)


def _ddp(unused_flag: bool, params_without_grad: int) -> TraceBuilder:
    """DDP on gloo: each forward ends with the graph walk, each backward all-reduces a bucket and the used map."""
    b = TraceBuilder(device=None, rank=0, world_size=2, backend="gloo")
    for _ in range(3):
        with b.step():
            with b.op("DistributedDataParallel.forward", cat="user_annotation"):
                b.cpu("aten::linear", 2_000)
                b.idle(1_200)  # prepare_for_backward: the autograd graph walk
            b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 4_000)
            b.host_collective(300)  # the used-parameter map
            b.host_collective(3_000)  # the gradient bucket
            with b.op("Optimizer.step#SGD.step", cat="user_annotation"):
                b.cpu("aten::add_", 300)
    b.facts = {"distributed": {"world_size": 2, "backend": "gloo", "ddp": [
        {"created_at": "train.py:31", "find_unused_parameters": unused_flag, "static_graph": False, "bucket_cap_mb": 25.0,
         "gradient_as_bucket_view": False, "comm_hooks": [], "no_sync_calls": 0, "params": 4,
         "params_without_grad": params_without_grad, "unused_parameter_bytes": 0 if not params_without_grad else 4096}]}}
    return b


RULE = DDPUnusedParameters()

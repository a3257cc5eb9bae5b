"""dataparallel: multi-GPU training through `nn.DataParallel` instead of DistributedDataParallel.

## What it detects
`DataParallel.forward` in the trace (or a DataParallel wrapper recorded by `gpuadvise profile`), with
the per-step scatter / replicate / gather work DataParallel does on the main process.

## Why it matters
DataParallel runs every GPU from one Python process: each step it copies the model to every device,
scatters the batch, gathers the outputs on GPU 0 and reduces the gradients there, all under one GIL.
GPU 0 becomes a bottleneck and the other GPUs wait. The PyTorch docs recommend DistributedDataParallel,
one process per GPU, even on a single machine.

## Fix
```python
# torchrun --nproc_per_node=NUM_GPUS train.py
import torch.distributed as dist
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = torch.nn.parallel.DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])
sampler = torch.utils.data.distributed.DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=per_gpu_batch, sampler=sampler, num_workers=4, pin_memory=True)
```

## Thresholds
Fires whenever DataParallel is in use. The saving is predicted from the replay without the
scatter/replicate/gather/broadcast CPU work DataParallel adds; other gains (no GIL contention, no
GPU-0 bottleneck) are not in the trace and are not counted.
"""

from __future__ import annotations

import re

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.trace import name_mask
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

DP_WORK = ("Broadcast", "ReduceAddCoalesced", "Gather", "Scatter", "replicate", "scatter", "gather", "parallel_apply",
           "BroadcastBackward", "ReduceAddCoalescedBackward", "GatherBackward", "ScatterBackward")


DP_PATTERN = re.compile("|".join(DP_WORK))


class DataParallelRule(Rule):
    code = "GA107"
    name = "dataparallel"
    title = "nn.DataParallel drives all GPUs from one process"
    thresholds = {}

    def check(self, a: Analysis):
        cpu = a.model.cpu
        marker = cpu[name_mask(cpu["name"], lambda n: n.startswith("DataParallel.forward"))]
        py = a.model.python
        py_marker = py[name_mask(py["name"], lambda n: "nn.Module: DataParallel" in n)] if len(py) else py
        wrappers = runfacts.wrappers(a.facts, kind="DataParallel")
        if marker.empty and py_marker.empty and not wrappers:
            return []
        work = cpu[name_mask(cpu["name"], DP_PATTERN.search)]
        saving, basis = a.predicted_saving(Scenario("DataParallel scatter/replicate/gather work removed",
                                                    cpu_removed=iv.union(work["ts"], work["end"])))
        if saving is None:
            saving, basis = 0.0, "not predicted: no GPU timeline"
        devices = sorted(int(d) for d in a.model.gpu["device"].unique()) if len(a.model.gpu) else []
        m = a.metrics
        cpu_ms = perstep.median(perstep.issued(m, work["ts"], work["dur"])) / 1e3  # the report's statistic
        message = (f"The model is wrapped in nn.DataParallel ({len(marker) or len(py_marker) or len(wrappers)} forward calls"
                   f"{f', GPU work on devices {devices}' if devices else ''}); its scatter/replicate/gather ops take "
                   f"{cpu_ms:.2f} ms of CPU time per step (median).")
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            items=[{"name": n, "count": int(len(g)), "total_ms": round(g["dur"].sum() / 1e3, 2)}
                   for n, g in work.assign(name=work["name"].astype(str)).groupby("name")][:8],
            sources=[w.created_at for w in wrappers if w.created_at != "?"],
            numbers={"devices_with_gpu_work": devices, "cpu_ms_per_step": round(cpu_ms, 3), "statistic": "median step"},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis,
                             advice="Switch to DistributedDataParallel, one process per GPU.")]

    def positive(self) -> TraceBuilder:
        return _loop(dp=True)

    def negative(self) -> TraceBuilder:
        return _loop(dp=False)


def _loop(dp: bool) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.op("DataParallel.forward" if dp else "MyModel.forward", cat="user_annotation"):
                if dp:
                    b.cpu("Broadcast", 800)
                    b.cpu("Scatter", 300)
                for _ in range(20):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 100)
                if dp:
                    b.cpu("Gather", 300)
            b.sync()
    b.finish()
    return b


RULE = DataParallelRule()

"""cpu-backend-on-gpu: a GPU job exchanges its tensors through a CPU backend (gloo) instead of NCCL.

## What it detects
Collectives that run on a CPU backend's thread (`gloo:all_reduce` and the like) in a trace whose steps
run kernels on a GPU, or whose run.json says the process group's backend is gloo while a GPU was in
use. NCCL (RCCL on AMD) runs collectives on the GPUs over NVLink/InfiniBand; gloo copies every CUDA
tensor to host memory, reduces it on the CPU over TCP and copies it back.

## Why it matters
For GPU tensors gloo is an order of magnitude slower than NCCL, and its device↔host copies and CPU
reductions sit on the critical path of every step. The PyTorch docs: "use the NCCL backend for
distributed GPU training". (The TensorBoard profiler's recommendation engine flagged the same.)

## Fix
```python
dist.init_process_group("nccl")  # or "cpu:gloo,cuda:nccl" to keep gloo for CPU tensors
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(model.to(local_rank), device_ids=[local_rank])
```

## Thresholds
Fires when a trace with GPU kernels holds collectives run by a CPU backend (or run.json records backend
gloo with a GPU available and collectives in the trace). The predicted saving is an upper bound: the
time the rank spent with nothing else to do inside those collectives, over the median step (NCCL's own
transfer is not free, but is far shorter).
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import collectives as coll, runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class CPUBackendOnGPU(Rule):
    code = "GA135"
    name = "cpu-backend-on-gpu"
    title = "GPU tensors are exchanged through gloo on the CPU, not NCCL"
    thresholds = {}

    def check(self, a: Analysis):
        c = a.collectives
        if c is None or not a.metrics.has_gpu:
            return []
        host = np.flatnonzero(np.array([w == coll.HOST for w in c.where], dtype=bool) & (c.step >= 0))
        if not len(host):
            return []
        m = a.metrics
        exposed = c.exposed_us()[host]
        issued = c.issued_us[host]
        exposed_us = perstep.median(perstep.issued(m, issued, exposed))
        count = perstep.median(perstep.issued(m, issued))
        step = m.median_step_us
        backend = runfacts.job(a.facts).backend or a.model.meta.backend or "a CPU backend"
        kinds = sorted({c.kind[i] for i in host})
        message = (f"The steps run on a GPU, but their collectives ({', '.join(kinds)}; {perstep.count_text(count)} per "
                   f"step) run through {backend} on the CPU: every tensor goes to host memory and back. This rank waits "
                   f"{exposed_us / 1e3:.2f} ms per step inside them with nothing else to do (median step).")
        evidence = Evidence(steps=[s.number for s in m.steps],
                            items=[{"name": k, "count": int(sum(1 for i in host if c.kind[i] == k))} for k in kinds],
                            numbers={"collectives_per_step": float(count), "exposed_ms_per_step": a.ms(exposed_us),
                                     "statistic": "median step"})
        f = self.finding(message=message, evidence=evidence,
                         saving=100.0 * exposed_us / step if step > 0 else 0.0,
                         basis="upper bound: the time inside the CPU backend's collectives with nothing else to do "
                               "(median per step), over the median step",
                         advice="Initialise the process group with the NCCL backend (RCCL on AMD GPUs).")
        f.impact.upper_bound = True
        return [f]

    def positive(self) -> TraceBuilder:
        return _gpu_step(backend="gloo")

    def negative(self) -> TraceBuilder:
        return _gpu_step(backend="nccl")


def _gpu_step(backend: str) -> TraceBuilder:
    b = TraceBuilder(rank=0, world_size=2, backend=backend)
    for _ in range(3):
        with b.step():
            with b.op("aten::linear"):
                for _ in range(10):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 400)
            b.sync()
            if backend == "gloo":
                b.host_collective(3_000)
            else:
                b.comm(600)
            with b.op("Optimizer.step#AdamW.step", cat="user_annotation"):
                b.kernel("multi_tensor_apply_kernel", 200)
            b.sync()
    b.finish()
    return b


RULE = CPUBackendOnGPU()

"""model-on-cpu: the model's parameters are on the CPU although the machine has a GPU.

## What it detects
A run whose run.json says torch could use a GPU (`torch.cuda.is_available()` in the profiled process)
while the parameters of the optimizers that stepped were on the CPU (recorded from the optimizer's
parameter groups at its first step): the model was never moved with `.to(device)`, or a device variable
fell back to "cpu".

## Why it matters
The training ran on the CPU, typically tens of times slower than on the GPU it had, and nothing failed:
the GPU simply stayed idle. When only part of the parameters are on the CPU (a module created after
`model.to(device)`, an embedding kept on the host), every step moves activations between the devices.

## Fix
```python
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = build_model().to(device)  # before constructing the optimizer
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
```

## Thresholds
Fires when the recorded parameters include any on the CPU and the profiled process saw a GPU. Severity
high when all of them are on the CPU, medium when only some are. The saving is not predicted: the trace
holds the CPU run, and how fast this model would run on the GPU is not in it.
"""

from __future__ import annotations

from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import GEMM, TraceBuilder
from gpuadvise.fixtures.runjson import run_json

from .base import Rule


class ModelOnCpu(Rule):
    code = "GA144"
    name = "model-on-cpu"
    title = "The model's parameters are on the CPU while a GPU is present"
    thresholds = {}

    def check(self, a: Analysis):
        devices = runfacts.param_devices(a.facts)
        on_cpu, total = devices.get("cpu", 0), sum(devices.values())
        if not on_cpu or runfacts.cuda_available(a.facts) is not True:
            return []
        m = a.metrics
        gpu = runfacts.device_name(a.facts) or "a GPU"
        kernels = int(len(a.model.kernels))
        nsteps = max(len(m.steps), 1)
        if on_cpu == total:
            what = f"all {total} parameters the optimizer updates are on the CPU"
        else:
            other = ", ".join(f"{n} on {k}" for k, n in sorted(devices.items()) if k != "cpu")
            what = f"{on_cpu} of the {total} parameters the optimizer updates are on the CPU ({other})"
        message = (f"torch could use {gpu}, but {what}; the trace has {kernels} GPU kernels in "
                   f"{nsteps} step(s) of {m.median_step_us / 1e3:.1f} ms (median).")
        evidence = Evidence(steps=[s.number for s in m.steps],
                            items=[{"name": k, "count": n} for k, n in sorted(devices.items())],
                            numbers={"param_devices": devices, "gpu": gpu, "gpu_kernels": kernels,
                                     "median_step_ms": round(m.median_step_us / 1e3, 3)})
        return [self.finding(
            message=message, evidence=evidence, saving=0.0, severity="high" if on_cpu == total else "medium",
            basis="not predicted: the trace holds the CPU run; how fast the model would run on the GPU is not in it",
            advice="Move the model (and each batch) to the GPU before building the optimizer.")]

    def positive(self) -> TraceBuilder:
        b = _cpu_loop()
        b.facts = run_json(param_devices={"cpu": 8})
        return b

    def negative(self) -> TraceBuilder:
        # the same run with the model on the GPU, which did the work
        b = TraceBuilder()
        for _ in range(3):
            with b.step():
                b.idle(300)
                for _ in range(8):
                    with b.op("aten::addmm"):
                        b.kernel(GEMM, 200)
                b.sync()
        b.finish()
        b.facts = run_json(param_devices={"cuda": 8})
        return b


def _cpu_loop() -> TraceBuilder:
    """The profiled steps of a model trained on the CPU: matmuls in CPU ops, no GPU activity (the trace
    still lists the GPU the profiler saw)."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(8):
                b.cpu("aten::addmm", 2_500)
            b.cpu("Optimizer.step#AdamW.step", 1_000, cat="user_annotation")
    return b


RULE = ModelOnCpu()

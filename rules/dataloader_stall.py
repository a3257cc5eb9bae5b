"""dataloader-stall: the training step waits on the input pipeline.

## What it detects
Time each step spends inside the DataLoader iterator (`enumerate(DataLoader)#…__next__`), i.e. the
training loop asking for the next batch and waiting for it. With `num_workers=0` the whole batch is
loaded, decoded and collated on the training thread; with workers, waiting here means the workers
cannot keep up.

## Why it matters
While the training thread waits for data it launches no GPU work, so the GPU idles. How much of that
wait a fix gets back depends on what overlaps it; gpuadvise replays the steps without the wait to
predict the real saving rather than quoting the share of time.

## Fix
```python
loader = torch.utils.data.DataLoader(
    dataset, batch_size=..., shuffle=True,
    num_workers=min(8, os.cpu_count()),  # load batches in parallel worker processes
    pin_memory=True,                     # page-locked batches: async host→device copies
    persistent_workers=True,             # keep workers alive between epochs
    prefetch_factor=4,                   # batches each worker keeps ready
)
for x, y in loader:
    x = x.to(device, non_blocking=True)
```
If workers are already in use and still stall, the per-sample work is too heavy: decode or augment
on the GPU (torchvision.transforms.v2 on tensors, NVIDIA DALI), store pre-processed data, or read from
faster storage.

## Thresholds
Fires when the DataLoader takes at least 5 % of the step time (the PyTorch TensorBoard plugin's
threshold for its DataLoader recommendation). Severity follows the predicted saving: high from 10 %,
medium from 3 %. When the fix adds worker processes, the replay also slows the training thread's own
CPU work by 10 %: workers compete with it for cores (measured 10–25 % slower ops in the kineto
ResNet-50 `num_workers` 0 → 4 pair).
"""

from __future__ import annotations

from gpuadvise.analyzer.measure import intervals as iv
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


class DataloaderStall(Rule):
    code = "GA102"
    name = "dataloader-stall"
    title = "Training waits on the DataLoader"
    thresholds = {"min_step_share_pct": 5.0, "worker_cpu_contention": 1.10}

    def check(self, a: Analysis):
        m = a.metrics
        dl = m.dataloader
        if dl.empty:
            return []
        ps = m.per_step
        share = 100 * ps["dataloader_us"].sum() / max(ps["dur_us"].sum(), 1e-9)
        if share < self.thresholds["min_step_share_pct"]:
            return []
        in_window = dl[dl["step"] >= 0] if m.steps else dl
        single = bool(in_window["single_process"].any())
        per_step_ms = ps["dataloader_us"].median() / 1e3
        step_ms = m.median_step_us / 1e3
        # Worker processes compete with the training thread for CPU: in the kineto ResNet-50 pair, ops on
        # the training thread ran 10-25 % slower with 4 workers than with none. Count the low end.
        contention = self.thresholds["worker_cpu_contention"] if single else 1.0
        saving, basis = a.predicted_saving(Scenario(
            "DataLoader waits removed" + (f", training-thread CPU work {contention - 1:.0%} slower with workers" if single else ""),
            cpu_removed=iv.union(in_window["ts"], in_window["end"]), cpu_scale=contention))
        if saving is None:  # no GPU in the trace: the step shrinks by the wait itself
            saving, basis = share, "share of step time (no GPU timeline to replay)"
        sources = sorted({s for s in in_window["source"] if s})
        loaders = runfacts.dataloaders(a.facts)
        kind = "single-process (`num_workers=0`)" if single else "multi-process"
        message = (f"The {kind} DataLoader takes {share:.1f}% of step time: a median {per_step_ms:.1f} ms of each "
                   f"{step_ms:.1f} ms step is spent waiting for the next batch, with no GPU work being launched.")
        if single:
            advice = "The loader runs in the training process (`num_workers=0`): give it worker processes."
        else:
            advice = "Workers are in use but cannot keep up: add workers, prefetch more, or make each sample cheaper."
        for d in loaders:
            if d.num_workers == 0 or not d.pin_memory:
                where = d.created_at
                advice += (f"\nThe DataLoader created at {where} has num_workers={d.num_workers}, "
                           f"pin_memory={d.pin_memory}, prefetch_factor={d.prefetch_factor}, "
                           f"persistent_workers={d.persistent_workers}.")
                sources.append(where)
        worst = in_window.nlargest(5, "dur")
        evidence = Evidence(
            steps=[int(s.number) for s in m.steps],
            time_ranges_ms=[(a.rel_ms(t), a.rel_ms(e)) for t, e in zip(worst["ts"], worst["end"])],
            items=[{"name": n, "count": int(len(g)), "total_ms": a.ms(g["dur"].sum()), "mean_ms": a.ms(g["dur"].mean())}
                   for n, g in in_window.groupby("name")],
            sources=sources,
            numbers={"dataloader_share_pct": round(share, 1), "median_dataloader_ms_per_step": round(per_step_ms, 2),
                     "median_step_ms": round(step_ms, 2), "single_process": single},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)]

    def positive(self) -> TraceBuilder:
        b = TraceBuilder()
        for _ in range(4):
            with b.step():
                b.cpu(SINGLE, 20_000)
                for _ in range(40):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
                b.sync()
        b.finish()
        return b

    def negative(self) -> TraceBuilder:
        b = TraceBuilder()
        for _ in range(4):
            with b.step():
                b.cpu(MULTI, 100)
                for _ in range(40):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
                b.sync()
        b.finish()
        return b


RULE = DataloaderStall()

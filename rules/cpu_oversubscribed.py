"""cpu-oversubscribed: a CPU run asks for more threads or DataLoader workers than its rank has cores.

## What it detects
A run without a GPU timeline (its steps ran on the CPU), read against the cores each rank has: the usable
cores of its node (run.json: the process's affinity, capped by a cgroup quota) shared by the ranks on the
node (the local world size, `runfacts.cores`). Two cases, each its own finding:
- **threads**: torch runs each op on `torch.get_num_threads()` threads (run.json `settings.num_threads`,
  as the window ended) and that is more than the rank's cores: the ranks' thread teams (or one process
  in a container whose quota is below the machine's core count) take turns on the same cores;
- **workers**: a training DataLoader has more worker processes than the rank has cores besides its
  training process, and the trace shows them feeding the recorded steps (multi-process `__next__`
  spans inside the steps).

## Why it matters
torch's intra-op threads meet at the end of every parallel op: with more threads than cores, each op
waits for the thread that was not running, on every op of every step. torchrun sets `OMP_NUM_THREADS=1`
for each of several ranks on a node for this reason; `mp.spawn`, a container quota or a hand-set count
does not. Loader workers beyond the free cores take their turns from the training process (and from
its threads) whenever they build batches, and each one holds a copy of the dataset's process.

## Fix
```python
import os, torch
cores = len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # this rank's cores
torch.set_num_threads(max(1, cores))                   # at the start of the script (or OMP_NUM_THREADS)
loader = torch.utils.data.DataLoader(dataset, batch_size=..., num_workers=max(0, cores - 1))
```

## Thresholds
Threads: fires when `num_threads` exceeds the rank's cores (severity medium: every parallel op of the step
waits on it). Workers: fires when a training loader's `num_workers` exceeds the rank's cores less one (the
training process's), with the trace's multi-process loader spans in the steps (severity low: workers that
keep ahead sleep most of the step). Silent without run.json's cores, threads or loaders (a trace alone
has none of them) and on a run with a GPU timeline (the DataLoader's workers there are dataloader-stall's).
The saving is not predicted: the trace records the training thread's ops, not the time the other threads
and processes waited for a core.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.runjson import run_json

from .base import Rule

MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
NOT_PREDICTED = ("not predicted: the trace records the training thread's ops, not the time the other threads and "
                 "processes waited for a core")


class CpuOversubscribed(Rule):
    code = "GA171"
    name = "cpu-oversubscribed"
    title = "More threads or DataLoader workers than the rank has cores"
    thresholds = {}

    def check(self, a: Analysis):
        m = a.metrics
        cores = runfacts.cores(a.facts)
        if m is None or m.has_gpu or cores is None:
            return []
        return [f for f in (self._threads(a, cores), self._workers(a, cores)) if f is not None]

    def _threads(self, a: Analysis, cores):
        threads = runfacts.threads(a.facts)
        if threads is None or threads <= cores.per_rank:
            return None
        omp = runfacts.env_vars(a.facts).get("OMP_NUM_THREADS")
        whose = "each rank's" if cores.ranks_on_node > 1 else "the process's"
        message = (f"torch runs each op on {threads} threads (torch.get_num_threads(){f', OMP_NUM_THREADS={omp}' if omp else ''}) "
                   f"but {whose} share of the cores is {cores.per_rank} ({cores.words()}): "
                   f"{threads * cores.ranks_on_node} threads take turns on {cores.usable} cores, and every parallel op "
                   "waits for the thread that was not running.")
        evidence = Evidence(steps=[s.number for s in a.metrics.steps],
                            numbers={"num_threads": threads, "cores_per_rank": cores.per_rank, "usable_cores": cores.usable,
                                     "ranks_on_node": cores.ranks_on_node, **({"omp_num_threads": omp} if omp else {})})
        per = "per rank" if cores.ranks_on_node > 1 else "in the process"
        advice = (f"Run {cores.per_rank} thread{'s' if cores.per_rank != 1 else ''} {per}: "
                  f"`torch.set_num_threads({cores.per_rank})` at the start of the script, or OMP_NUM_THREADS={cores.per_rank} "
                  "in its environment.")
        return self.finding(message=message, evidence=evidence, saving=0.0, basis=NOT_PREDICTED, advice=advice,
                            severity="medium")

    def _workers(self, a: Analysis, cores):
        free = max(0, cores.per_rank - 1)
        over = [ld for ld in runfacts.training_loaders(a.facts) if (ld.num_workers or 0) > free]
        m = a.metrics
        dl = m.dataloader
        fed = dl[(~dl["single_process"].astype(bool)) & (dl["step"] >= 0)] if len(dl) else dl
        if not over or not len(fed):
            return None  # no loader over the cores, or none of its workers fed the recorded steps
        ld = max(over, key=lambda x: x.num_workers or 0)
        loading = runfacts.loader_profile(a.facts)
        demand = ""
        numbers = {"num_workers": ld.num_workers, "free_cores": free, "cores_per_rank": cores.per_rank,
                   "usable_cores": cores.usable, "ranks_on_node": cores.ranks_on_node}
        if loading and loading.get("build_ms_per_batch") and len(m.steps):
            build = float(loading["build_ms_per_batch"])
            batches = max(perstep.median(perstep.by_index(m, fed["step"].to_numpy())), 1.0)  # the median step's
            every = m.median_step_us / 1e3 / batches
            busy = build / every if every > 0 else 0.0
            demand = (f" Building a batch takes {build:.2f} ms and the step uses one every {every:.2f} ms: the workers "
                      f"together are busy {100 * busy:.1f} % of one core's time" + (", the rest of it they wait, each a "
                      "process of its own" if busy < 1 else "") + ".")
            numbers.update(build_ms_per_batch=round(build, 3), batch_every_ms=round(every, 3), statistic="median step")
        who = "each rank has" if cores.ranks_on_node > 1 else "the process has"
        count = f"{ld.num_workers} worker process{'es' if ld.num_workers != 1 else ''}"
        message = (f"The DataLoader at {ld.where} runs {count}, but {who} "
                   f"{cores.per_rank} core{'s' if cores.per_rank != 1 else ''} ({cores.words()}), {free} of them free "
                   f"beside its training process: the workers take their turns from the training process.{demand}")
        advice = (f"Use num_workers={free} for this loader (the rank's cores less the training process's)"
                  + (": with no free core, the training process builds its batches itself." if free == 0 else "."))
        evidence = Evidence(steps=[s.number for s in m.steps], sources=[ld.created_at] if ld.created_at != "?" else [],
                            numbers=numbers)
        return self.finding(message=message, evidence=evidence, saving=0.0, basis=NOT_PREDICTED, advice=advice,
                            severity="low")

    def positive(self) -> TraceBuilder:
        b = _cpu_loop(multi=True)
        b.facts = _facts(threads=8, usable=2, workers=4)
        return b

    def negative(self) -> TraceBuilder:
        # the same loop with a thread per core and one worker on the free core
        b = _cpu_loop(multi=True)
        b.facts = _facts(threads=2, usable=2, workers=1)
        return b


def _facts(threads: int, usable: int, workers: int, ranks: int = 1) -> dict:
    loader = {"created_at": "train.py:30", "num_workers": workers, "pin_memory": False, "batch_size": 16,
              "prefetch_factor": 2, "persistent_workers": False}
    job = {"world_size": ranks, "rank": 0, "local_world_size": ranks, "backend": "gloo"} if ranks > 1 else None
    return run_json(cuda_available=False, cpu={"logical": usable, "usable": usable, "cgroup_limit": None},
                    settings={"num_threads": threads}, dataloaders=[loader], distributed=job)


def _cpu_loop(multi: bool, steps: int = 4) -> TraceBuilder:
    """A CPU training loop: a batch from the loader (its workers' when `multi`), forward, backward, step."""
    b = TraceBuilder(device=None)
    for _ in range(steps):
        with b.step():
            b.cpu(MULTI if multi else "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 200,
                  cat="user_annotation")
            b.cpu("aten::addmm", 3_000)
            b.cpu("aten::mm", 2_500)
            b.idle(300)
    return b


RULE = CpuOversubscribed()

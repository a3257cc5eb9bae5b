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
    # the cores each rank has, less its own (torchrun sets LOCAL_WORLD_SIZE): the advice names the count
    num_workers=max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", 1)) - 1),
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

Under transformers' Trainer the switch is `TrainingArguments(dataloader_num_workers=…,
dataloader_pin_memory=True)`; the advice names it, at your line.

Under Lightning, the switch is the `DataLoader` your `train_dataloader()` (or `LightningDataModule`)
returns; the advice names it, at your line.

## Thresholds
Fires when the DataLoader takes at least 5 % of the median step (the PyTorch TensorBoard plugin's
threshold for its DataLoader recommendation); the share, the quoted wait and step, and the replayed
saving all come from the median step. A step that waits more than 3× the median wait plus 1 ms (the
first batch after the workers start) is an outlier: named, left out of the saving, and on its own
never enough to fire. With workers running, each batch still costs the training process its hand-over
(receiving a batch a worker has ready: 0.1–2 ms measured, the upper end on a busy machine), which more
workers cannot remove: the share that fires, the figures and the saving are of the wait beyond it. The
hand-over is, with run.json's measured loading, all of the wait when the workers keep up (B/k ≤ C, below)
and what the lag B/k − C does not explain otherwise; from the trace alone, the shortest wait of the
steps; never more than 2 ms (a longer wait from workers that keep up on average is batches arriving
unevenly, which more prefetching or workers absorb). Severity follows the predicted saving: high from 10 %,
medium from 3 %. When the fix adds worker processes to a `num_workers=0` loader, each wait shrinks to that
hand-over at its upper end, 2 ms (a loader whose batches take less to build gains nothing from workers:
receiving a ready batch of 32 small tensors from a worker measured 1.8 ms on a busy two-core machine,
building it in the training process 0.3 ms), and the replay also slows the training thread's own CPU
work by 10 %: workers compete with it for cores (measured 10–25 % slower ops in the kineto ResNet-50
`num_workers` 0 → 4 pair).
Workers need cores: each rank has the usable cores of its node (run.json: the process's affinity, capped
by a cgroup quota) shared by the ranks on the node (the local world size), at least one; a rank whose
share is one core (two ranks on two cores) has none to give a worker, and no saving is predicted from
workers.
When `gpuadvise profile` sampled the loading (run.json `capture.loader`), the prediction uses what it
measured, in the median step's terms: B, the time to build a batch (in the training process: the
build's share of its wait over the same batches, of the median wait; in workers: what each took), and
C, the time the step takes between batches (the median step less its wait, per batch). k workers
deliver one batch every B/k ms, so the step waits max(0, B/k − C) per batch, plus what workers cannot
take: the hand-over, and from `num_workers=0` the part of the wait that is not the build (the sampler,
the iterator: they stay in the training process). k is the number that keeps up (⌈B/C⌉), capped by the
free cores (the rank's cores − the training process − the workers already running, each worker counted
as the CPU share of its build: `build_cpu_ms_per_batch`, a build that sleeps on I/O needs little); the replay
shrinks each wait to what is left. No free core, or workers that would hide less than the hand-over
costs: no change is advised and no saving predicted from workers; more workers than the rank's cores
that keep up with fewer: the advice is the count that keeps up. The message names the
user's function with the largest share of the build (the dataset's own `__getitem__` left out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import is_on

from .base import Rule

@dataclass
class LoaderState:
    """The loader in the median step's terms (per batch where it says so) and what its fix leaves."""

    waits: np.ndarray  # per step, µs
    durs: np.ndarray  # per step, µs
    median_wait_us: float
    step_us: float  # the median step
    outlier: np.ndarray  # per step: a wait far above the median
    in_window: object  # the DataLoader spans of the steps
    single: bool  # num_workers=0
    measured: dict | None  # run.json capture.loader
    cores: object  # runfacts.Cores or None
    per_step: float  # batches per step
    between_ms: float  # per batch: the step without its wait
    build_ms: float | None  # per batch (measured)
    floor_us: float  # per step: the hand-over of ready batches from workers already running
    outlier_steps: list
    plan: dict | None  # what more workers do (measured, or no core to give one)
    scenario: Scenario
    wait_left: float  # the share of each wait the fix leaves


SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


class DataloaderStall(Rule):
    code = "GA102"
    name = "dataloader-stall"
    title = "Training waits on the DataLoader"
    thresholds = {"min_step_share_pct": 5.0, "worker_cpu_contention": 1.10, "outlier_x": 3.0, "handover_max_ms": 2.0}
    fix_facts = ("dataloader[*].num_workers", "dataloader[*].pin_memory", "dataloader[*].persistent_workers",
                 "dataloader[*].prefetch_factor", "framework.settings.dataloader_num_workers",
                 "framework.settings.dataloader_pin_memory")

    def state(self, a: Analysis) -> "LoaderState | None":
        """The loading in the median step's terms and what its fix leaves of the waits (the scenario this
        rule's saving and launch-bound's "after the loader fix" both replay); None without a DataLoader."""
        m = a.metrics
        dl = m.dataloader
        if dl.empty:
            return None
        ps = m.per_step
        # one statistic for the share, the figures, the saving and (through the finding) compare's verdict: the
        # median step. A step whose wait is far above the median (the first batch after the workers start) is
        # an outlier: it is reported as such and its wait is not counted as a saving.
        waits = ps["dataloader_us"].to_numpy(dtype=float)
        durs = ps["dur_us"].to_numpy(dtype=float)
        median_wait = float(np.median(waits))
        outlier = waits > self.thresholds["outlier_x"] * median_wait + 1_000.0
        in_window = dl[dl["step"] >= 0] if m.steps else dl
        single = bool(in_window["single_process"].any())
        measured = runfacts.loader_profile(a.facts)  # gpuadvise profile sampled the loading
        cores = runfacts.cores(a.facts)  # the cores each rank has (run.json)
        # the loading in the median step's terms, one computation for every figure quoted and the plan: batches
        # per step, the wait and the time between batches per batch (the step without its wait)
        per_step = batches_per_step(in_window, m)
        step_us = float(np.median(durs))
        wait_b_ms = median_wait / per_step / 1e3
        between_b_ms = max(0.0, step_us - median_wait) / per_step / 1e3
        build_b_ms = build_per_batch_ms(measured, single, wait_b_ms) if measured else None
        handover_ms = self.thresholds["handover_max_ms"]
        # with workers running, part of each wait is the hand-over of a ready batch, which more workers cannot
        # remove: the share that fires, the figures and the saving are of the rest
        floor = 0.0 if single else per_step * handover_floor_us(
            waits[~outlier] / per_step, wait_b_ms * 1e3, measured, handover_ms * 1e3, between_b_ms)
        outlier_steps = [int(s.number) for s, out in zip(m.steps, outlier) if out] if m.steps else []
        counted = in_window[~in_window["step"].isin([i for i, out in enumerate(outlier) if out])] if m.steps else in_window
        # Worker processes compete with the training thread for CPU: in the kineto ResNet-50 pair, ops on
        # the training thread ran 10-25 % slower with 4 workers than with none. Count the low end.
        contention = self.thresholds["worker_cpu_contention"] if single else 1.0
        wait_spans = iv.union(counted["ts"], counted["end"])  # the waits a fix removes (outlier steps left as they are)
        left_out = (f" (outlier step{'s' if len(outlier_steps) > 1 else ''} {', '.join(map(str, outlier_steps))} left as "
                    "they are)" if outlier_steps else "")
        plan = (more_workers(measured, cores, wait_b_ms, between_b_ms, build_b_ms, single, floor / per_step / 1e3,
                             handover_ms) if measured else None)
        if plan is None and single and cores is not None and cores.per_rank <= 1:
            plan = no_change_plan(f"no free core for a worker ({cores.words()}; the training process uses it)",
                                  wait_b_ms, cores)  # unmeasured loading, but the rank has no core to give a worker
        elif plan is None and single and wait_b_ms <= handover_ms:  # unmeasured, and each wait is under a hand-over
            plan = no_change_plan(f"workers would not pay: each wait ({wait_b_ms:.2f} ms a batch) is shorter than "
                                  f"receiving a ready batch from a worker can take (up to {handover_ms:g} ms)",
                                  wait_b_ms, cores)
        if plan is not None:  # the measured build time and free cores say what more workers leave of the wait
            left = plan["wait_left"]
            scenario = Scenario(plan["scenario"] + left_out, cpu_shrink=(wait_spans, left))
        elif floor > 0:  # each wait shrinks to the hand-over
            left = min(1.0, floor / max(median_wait, 1e-9))
            scenario = Scenario(f"DataLoader waits down to the {floor / 1e3:.1f} ms hand-over of a ready batch" + left_out,
                                cpu_shrink=(wait_spans, left))
        else:  # workers take the loading over: each wait shrinks to receiving a ready batch from one
            left = min(1.0, handover_ms * per_step * 1e3 / max(median_wait, 1e-9))
            scenario = Scenario(
                f"DataLoader waits down to the hand-over of a ready batch from a worker (up to {handover_ms:g} ms)"
                + f", training-thread CPU work {contention - 1:.0%} slower with workers" + left_out,
                cpu_shrink=(wait_spans, left), cpu_scale=contention)
        return LoaderState(
            waits=waits, durs=durs, median_wait_us=median_wait, step_us=step_us, outlier=outlier, in_window=in_window,
            single=single, measured=measured, cores=cores, per_step=per_step, between_ms=between_b_ms,
            build_ms=build_b_ms, floor_us=floor, outlier_steps=outlier_steps, plan=plan, scenario=scenario,
            wait_left=left)

    def fix_scenario(self, a: Analysis) -> Scenario | None:
        """What the loader's fix leaves of the waits, as this rule replays it (None without a DataLoader)."""
        st = self.state(a)
        return st.scenario if st is not None else None

    def check(self, a: Analysis):
        st = self.state(a)
        if st is None:
            return []
        m = a.metrics
        waits, durs, median_wait, floor = st.waits, st.durs, st.median_wait_us, st.floor_us
        in_window, single, measured, cores, plan = st.in_window, st.single, st.measured, st.cores, st.plan
        per_step, outlier, outlier_steps = st.per_step, st.outlier, st.outlier_steps
        share_total = float(np.median(100 * waits / np.maximum(durs, 1e-9)))
        share = float(np.median(100 * np.maximum(waits - floor, 0.0) / np.maximum(durs, 1e-9)))
        if share < self.thresholds["min_step_share_pct"]:
            return []
        per_step_ms = median_wait / 1e3
        step_ms = st.step_us / 1e3
        saving, basis = a.predicted_saving(st.scenario)
        if saving is None:  # no GPU in the trace: the step shrinks by the wait itself (what the fix leaves of it)
            saving = share_total * (1 - st.wait_left)
            basis = "share of step time (no GPU timeline to replay)" + (f"; {plan['scenario']}" if plan is not None else "")
        sources = sorted({s for s in in_window["source"] if s})
        loaders = runfacts.training_loaders(a.facts)
        fw = runfacts.framework(a.facts)  # advice names the framework's own switch (TrainingArguments, …)
        main = loaders[0] if loaders else None
        kind = "single-process (`num_workers=0`)" if single else "multi-process"
        if m.steps:
            whole = perstep.the_median_step(m)
            part = f"{perstep.a_median(m)}{per_step_ms:.1f} ms of {perstep.each_step(m)} {step_ms:.1f} ms step"
        else:  # no ProfilerStep: the traced window is the one "step", and it holds many waits
            whole, part = "the traced window", f"{per_step_ms:.1f} ms of the {step_ms:.1f} ms window"
        if floor > 0:
            message = (f"The {kind} DataLoader takes {share:.1f}% of {whole} beyond the hand-over of a ready "
                       f"batch: {part} is spent waiting for the next batch, with no GPU work being launched; about "
                       f"{floor / 1e3:.1f} ms of {'it' if m.steps else 'each wait'} is the hand-over from a worker, which "
                       "more workers do not remove.")
        else:
            message = (f"The {kind} DataLoader takes {share:.1f}% of {whole}: {part} is spent waiting for the next "
                       "batch, with no GPU work being launched.")
        if outlier_steps:
            worst_ms = float(waits[outlier].max()) / 1e3
            message += (f" Step{'s' if len(outlier_steps) > 1 else ''} {', '.join(map(str, outlier_steps))} waited far "
                        f"longer (up to {worst_ms:.1f} ms): an outlier, left out of these figures.")
        if plan is not None and plan["workers"] == plan["workers_now"] and single:
            advice = "The loader runs in the training process (`num_workers=0`): " + plan["why"] + "."
        elif single:
            advice = "The loader runs in the training process (`num_workers=0`): " + (
                f"{switches.num_workers(fw, None, main)}." if fw is not None else "give it worker processes.")
        else:
            advice = "Workers are in use but cannot keep up: add workers, prefetch more, or make each sample cheaper."
        for d in loaders:
            if d.num_workers == 0 or not d.pin_memory:
                advice += (f"\nThe DataLoader {switches.loader_origin(fw, d)} has num_workers={d.num_workers}, "
                           f"pin_memory={d.pin_memory}, prefetch_factor={d.prefetch_factor}, "
                           f"persistent_workers={d.persistent_workers}.")
                if d.created_at != "?":
                    sources.append(d.created_at)  # the user's line, also for a loader a framework built
        if floor > 0:  # what shortens the hand-over itself (not more workers)
            pinned = is_on("pin_memory", a) is not None  # run.json or the trace: never asked for again
            pin = (switches.pin_memory(fw, main) + ": batches are then received on a background thread; "
                   if fw is not None else "pin_memory=True receives batches on a background thread; ")
            advice += (f"\nAbout {floor / 1e3:.1f} ms of each wait is the hand-over of a ready batch, which more workers "
                       "do not shorten: " + ("" if pinned else pin) + "larger batches spread it over more samples.")
        if measured:
            message += " " + loading_sentence(measured, plan, st.build_ms, st.between_ms, per_step, single)
            rest = advice.split("\n", 1)  # the measured advice replaces the generic first line
            advice = workers_advice(measured, plan, fw, main) + ("\n" + rest[1] if len(rest) > 1 else "")
            sources[:0] = [f"{f['file']}:{f['line']}: {f['function']}" for f in hot_functions(measured)[:3]]
        worst = in_window.nlargest(5, "dur")
        evidence = Evidence(
            steps=[int(s.number) for s in m.steps],
            time_ranges_ms=[(a.rel_ms(t), a.rel_ms(e)) for t, e in zip(worst["ts"], worst["end"])],
            items=function_items(measured) if measured else
            [{"name": n, "count": int(len(g)), "total_ms": a.ms(g["dur"].sum()), "mean_ms": a.ms(g["dur"].mean())}
             for n, g in in_window.groupby("name")],
            sources=sources,
            numbers={"dataloader_share_pct": round(share, 1), "median_dataloader_ms_per_step": round(per_step_ms, 2),
                     "median_step_ms": round(step_ms, 2), "single_process": single,
                     "statistic": "median step" if m.steps else "traced window",
                     "handover_floor_ms": round(floor / 1e3, 2),
                     "outlier_steps": outlier_steps,
                     **(loading_numbers(measured, plan, st.build_ms, st.between_ms, per_step) if measured else {}),
                     **({"cores_per_rank": cores.per_rank} if cores is not None else {})},
        )
        workers = plan["workers"] if plan is not None else None
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             fix=self.fix_for(workers, plan is not None and plan["workers"] == plan["workers_now"],
                                              gpu=m.has_gpu, pinned=is_on("pin_memory", a) is not None,
                                              has_workers=not single))]

    def fix_for(self, workers: int | None, no_change: bool, gpu: bool, pinned: bool, has_workers: bool = False) -> str:
        """The Fix with the instance's own numbers: the worker count the advice names (none where no worker
        pays or no core is free), no pinned memory or non-blocking copy on a run without a GPU or a loader
        that pins already (nor the loop that shows the copy), and, where running workers keep up, not the
        paragraph on a build too heavy for them."""
        out = []
        code = heavy = False
        for line in self.fix.splitlines():
            if line.strip().startswith("```"):
                code = not code
            if not code:  # prose says what each switch is; only the code is the instance's
                heavy = heavy or (no_change and has_workers and line.startswith("If workers are already in use"))
                if not heavy:
                    out.append(line)
                heavy = heavy and not line.rstrip().endswith(".")
                continue
            if "for x, y in loader:" in line and not gpu:
                continue  # it shows the non-blocking copy, which a run without a GPU has no use for
            if no_change and "LOCAL_WORLD_SIZE" in line and "num_workers=" not in line:
                continue  # the comment on the count
            if "num_workers=" in line and ("len(os.sched_getaffinity" in line):
                if no_change:
                    continue
                if workers is not None:
                    line = line.split("num_workers=")[0] + f"num_workers={workers},"
            if no_change and ("persistent_workers=" in line or "prefetch_factor=" in line and not has_workers):
                continue  # no workers advised: nothing to keep alive; workers running: more prefetch absorbs
            if ("pin_memory=" in line and (pinned or not gpu)) or ("non_blocking=True" in line and not gpu):
                continue
            out.append(line)
        return "\n".join(out)

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


# -- what `gpuadvise profile` measured of the loading (run.json `capture.loader`) ------------------------

ENTRY_POINTS = {"__getitem__", "__getitems__", "__iter__", "__next__"}


def hot_functions(measured: dict) -> list[dict]:
    """The user's functions the batch build spends its time in, the dataset's entry points left out
    (they hold all of it by definition), biggest share first."""
    return [f for f in measured["functions"] if f["function"] not in ENTRY_POINTS]


def function_items(measured: dict) -> list[dict]:
    return [{"name": f["function"], "where": f"{f['file']}:{f['line']}", "share_of_build_pct": f["share_pct"],
             "per_batch_ms": f["ms_per_batch"]} for f in measured["functions"]]


def batches_per_step(in_window, m) -> float:
    """How many batches a step takes from the loader: the median count of its waits per step (1 at least)."""
    if not m.steps or not len(in_window):
        return 1.0
    counts = in_window.groupby("step").size()
    return float(max(1.0, np.median(counts.to_numpy(dtype=float))))


def build_per_batch_ms(measured: dict, single: bool, wait_ms: float) -> float:
    """The time to build one batch, in the median step's terms. Workers: what each took (their time is in no
    trace). The training process: the build is part of its wait, so the build's share of the wait the probe
    measured over the same batches, of the median wait (one figure, never a build above its own wait)."""
    build = measured["build_ms_per_batch"]
    if not single:
        return build
    probe_wait = measured.get("wait_ms_per_batch")
    share = min(1.0, build / probe_wait) if probe_wait else 1.0
    return share * wait_ms


def handover_floor_us(waits, wait_us: float, measured: dict | None, cap_us: float, between_ms: float) -> float:
    """The part of a multi-process loader's wait per batch that more workers cannot remove: the training
    process receiving (unpickling) a batch a worker has ready. Measured (run.json `capture.loader`): workers
    that keep up (B/k ≤ C, C the median step's time between batches) leave all of the wait to it, else what
    the lag B/k − C does not explain. From the trace alone: the shortest wait of the steps (a batch that was
    ready). Never more than `cap_us`."""
    if measured and measured.get("num_workers"):
        lag = max(0.0, measured["build_ms_per_batch"] / measured["num_workers"] - between_ms) * 1e3
        # no more than a hand-over takes: a longer wait from workers that keep up on average is batches
        # arriving unevenly (a slow batch, a worker short of CPU), which more prefetching absorbs
        return min(max(0.0, wait_us - lag), cap_us)
    return min(float(np.min(waits)), cap_us) if len(waits) else 0.0


def more_workers(measured: dict, cores, wait_ms: float, between_ms: float, build_ms: float, single: bool,
                 floor_ms: float, handover_ms: float) -> dict | None:
    """How much of each wait (per batch, the median step's) is left with more workers, in steady state: k
    workers building a batch in B ms each deliver one every B/k ms; a step that uses one every C ms then
    waits max(0, B/k − C), plus what workers cannot take: the hand-over of a ready batch (`floor_ms`
    measured with workers running; up to `handover_ms` from none) and, from `num_workers=0`, the rest of
    the wait that is not the build (the sampler, the iterator: they stay in the training process).
    Workers added = what keeps up (⌈B/C⌉), capped by the free cores: the cores each rank has (`cores`:
    the usable ones shared by the ranks on the node) less the training process and the workers already
    there, each worker counted as the CPU share of its build (a build that sleeps on a disk needs little
    of a core; at least MIN_CPU_SHARE), and none where the rank has no whole core to spare. No change is
    advised where no core is free or where the workers would hide less than the hand-over costs. None
    when the count of workers is unknown."""
    workers = measured["num_workers"]
    if workers is None:
        return None
    # the CPU a worker needs: the build's CPU share (a build that sleeps on a disk or the network needs little)
    cpu_share = cpu_share_of_build(measured)
    spare = cores.per_rank - 1 - workers * cpu_share if cores is not None else 0.0
    free = max(0, int(spare / max(cpu_share, MIN_CPU_SHARE) + 1e-9)) if spare >= 1 else 0
    keeps_up = int(max(1, -(-build_ms // max(between_ms, 1e-3))))  # ceil(B / C)
    target = int(max(workers, min(workers + free, keeps_up)))
    stays = (max(0.0, wait_ms - build_ms) + handover_ms) if single else floor_ms
    left_ms = max(0.0, build_ms / target - between_ms) + stays if target else wait_ms
    plan = {"free_cores": free, "workers_now": workers, "workers": target, "keeps_up": keeps_up,
            "wait_now_ms": wait_ms, "cores": cores}
    where = f"{cores.words()}" if cores is not None else "the machine's cores not recorded"
    if target == workers or left_ms >= wait_ms:
        if target == workers and keeps_up <= workers and workers:
            who = f"the {workers} workers keep" if workers > 1 else "the worker keeps"
            why = (f"{who} up (one batch every {build_ms / workers:.1f} ms against one used every "
                   f"{between_ms:.1f} ms): the wait is the hand-over and batches arriving unevenly, not the build")
        elif target == workers:
            why = (f"no free core for {'a' if not workers else 'another'} worker ({where}; the training process"
                   + (f" and {workers} worker{'s' if workers > 1 else ''} use them)" if workers else " uses it)"))
        else:
            why = (f"workers would not pay: a batch takes {build_ms:.2f} ms to build, and receiving a ready one from a "
                   f"worker costs the training process up to {handover_ms:g} ms")
        return {**plan, "workers": workers, "wait_left": 1.0, "why": why, "scenario": why}
    return {**plan, "wait_left": min(1.0, left_ms / max(wait_ms, 1e-9)), "why": "",
            "scenario": (f"num_workers {workers} → {target}: one batch every {build_ms / target:.1f} ms (each "
                         f"{build_ms:.1f} ms to build), the step uses one every {between_ms:.1f} ms; {free} free "
                         f"core(s) ({where})" + (f"; the hand-over of a ready batch up to {handover_ms:g} ms" if single
                                                 else ""))}


MIN_CPU_SHARE = 0.05  # a worker is counted as at least a twentieth of a core (its hand-overs, its Python)


def cpu_share_of_build(measured: dict) -> float:
    """The part of a batch's build its thread spent on a CPU (run.json `build_cpu_ms_per_batch`; all of it
    where an older run.json does not say)."""
    cpu, build = measured.get("build_cpu_ms_per_batch"), measured["build_ms_per_batch"]
    return min(1.0, cpu / build) if cpu is not None and build else 1.0


def no_change_plan(why: str, wait_ms: float, cores) -> dict:
    """Loading not measured, and no worker to advise (`why`): nothing predicted from workers."""
    return {"free_cores": 0, "workers_now": 0, "workers": 0, "keeps_up": 1, "wait_now_ms": wait_ms, "cores": cores,
            "wait_left": 1.0, "why": why, "scenario": why}


def loading_sentence(measured: dict, plan: dict | None, build_ms: float, between_ms: float, per_step: float,
                     single: bool) -> str:
    """What the probe measured, in the median step's terms (the build of a batch, the time between batches)."""
    workers = measured["num_workers"]
    each = f" ({per_step:g} per step)" if per_step != 1 else ""
    if single:
        text = f"Building each batch{each} takes {build_ms:.2f} ms of that wait in the training process"
    else:
        text = (f"Each batch{each} takes {build_ms:.1f} ms to build in each of {workers} workers (one batch every "
                f"{build_ms / workers:.1f} ms)")
    text += f"; the step uses one every {between_ms:.1f} ms."
    hot = hot_functions(measured)
    if hot:
        f = hot[0]
        text += f" {f['share_pct']:.0f}% of the build is in `{f['function']}` ({f['file']}:{f['line']})."
    return text


def workers_advice(measured: dict, plan: dict | None, fw=None, loader=None) -> str:
    """`fw`, `loader`: the run's framework and training DataLoader (runfacts), whose own switch is named."""
    if plan is None:
        return "Make each sample cheaper: start with the functions listed in the evidence."
    if plan["workers"] == plan["workers_now"]:
        text = switches.sentence(plan["why"])
        cores = plan.get("cores")
        if plan["workers_now"] and cores is not None and plan["workers_now"] > max(1, cores.per_rank - 1) \
                and plan["keeps_up"] < plan["workers_now"]:
            keep = max(1, min(plan["keeps_up"], cores.per_rank - 1))
            return (text + f"; {plan['workers_now']} workers on {cores.per_rank} core(s) per rank compete with the "
                    f"training process for them: {switches.num_workers(fw, keep, loader)} (it keeps up).")
        if plan["workers_now"] and plan["keeps_up"] <= plan["workers_now"]:  # a cheaper build changes nothing
            return text + ": a larger `prefetch_factor` (batches each worker keeps ready) absorbs uneven batches."
        return text + f": make `{measured['fetch']}` cheaper, starting with the functions listed in the evidence."
    where = plan["cores"].words() if plan.get("cores") is not None else "the machine's cores not recorded"
    text = f"{switches.sentence(switches.num_workers(fw, plan['workers'], loader))} ({plan['free_cores']} free core(s): {where})"
    if plan["workers"] < plan["keeps_up"]:
        text += (f"; {plan['keeps_up']} would keep up, so also make `{measured['fetch']}` cheaper, "
                 "starting with the functions listed in the evidence")
    return text + "."


def loading_numbers(measured: dict, plan: dict | None, build_ms: float, between_ms: float, per_step: float) -> dict:
    out = {"build_per_batch_ms": round(build_ms, 3), "fetch_per_sample_ms": measured["fetch_ms_per_sample"],
           "collate_per_batch_ms": measured["collate_ms_per_batch"], "num_workers": measured["num_workers"],
           "between_batches_ms": round(between_ms, 3), "batches_per_step": per_step}
    if plan is not None:
        out.update(free_cores=plan["free_cores"], suggested_num_workers=plan["workers"])
    return out


RULE = DataloaderStall()

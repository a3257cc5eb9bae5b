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
Under transformers' Trainer the switch is `TrainingArguments(dataloader_num_workers=…,
dataloader_pin_memory=True)`; under Lightning, the `DataLoader` your `train_dataloader()` (or
LightningDataModule) returns; the advice names the one the run used, at your line.

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
medium from 3 %. When the fix adds worker processes, the replay also slows the training thread's own
CPU work by 10 %: workers compete with it for cores (measured 10–25 % slower ops in the kineto
ResNet-50 `num_workers` 0 → 4 pair).
When `gpuadvise profile` sampled the loading (run.json `capture.loader`), the prediction uses what it
measured instead: k workers that each build a batch in B ms deliver one every B/k ms; a step that
uses one every C ms (time between batches) then waits max(0, B/k − C) per batch. k is the number
that keeps up (⌈B/C⌉), capped by the free cores (usable cores − the training process − the
workers already running); the replay shrinks each wait to what is left. No free core: no saving is
predicted from workers, and the advice is to make `__getitem__` cheaper. The message names the
user's function with the largest share of the build (the dataset's own `__getitem__` left out).
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure import intervals as iv, perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.switches_on import is_on

from .base import Rule

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


class DataloaderStall(Rule):
    code = "GA102"
    name = "dataloader-stall"
    title = "Training waits on the DataLoader"
    thresholds = {"min_step_share_pct": 5.0, "worker_cpu_contention": 1.10, "outlier_x": 3.0, "handover_max_ms": 2.0}

    def check(self, a: Analysis):
        m = a.metrics
        dl = m.dataloader
        if dl.empty:
            return []
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
        # with workers running, part of each wait is the hand-over of a ready batch, which more workers cannot
        # remove: the share that fires, the figures and the saving are of the rest
        floor = 0.0 if single else handover_floor_us(waits[~outlier], median_wait, measured,
                                                     self.thresholds["handover_max_ms"] * 1e3)
        share_total = float(np.median(100 * waits / np.maximum(durs, 1e-9)))
        share = float(np.median(100 * np.maximum(waits - floor, 0.0) / np.maximum(durs, 1e-9)))
        if share < self.thresholds["min_step_share_pct"]:
            return []
        per_step_ms = median_wait / 1e3
        step_ms = float(np.median(durs)) / 1e3
        outlier_steps = [int(s.number) for s, out in zip(m.steps, outlier) if out] if m.steps else []
        counted = in_window[~in_window["step"].isin([i for i, out in enumerate(outlier) if out])] if m.steps else in_window
        # Worker processes compete with the training thread for CPU: in the kineto ResNet-50 pair, ops on
        # the training thread ran 10-25 % slower with 4 workers than with none. Count the low end.
        contention = self.thresholds["worker_cpu_contention"] if single else 1.0
        wait_spans = iv.union(counted["ts"], counted["end"])  # the waits a fix removes (outlier steps left as they are)
        left_out = (f" (outlier step{'s' if len(outlier_steps) > 1 else ''} {', '.join(map(str, outlier_steps))} left as "
                    "they are)" if outlier_steps else "")
        plan = more_workers(measured, runfacts.usable_cpus(a.facts), counted, floor / 1e3) if measured else None
        if plan is not None:  # the measured build time and free cores say what more workers leave of the wait
            saving, basis = a.predicted_saving(Scenario(plan["scenario"] + left_out, cpu_shrink=(wait_spans, plan["wait_left"])))
        elif floor > 0:  # each wait shrinks to the hand-over
            saving, basis = a.predicted_saving(Scenario(
                f"DataLoader waits down to the {floor / 1e3:.1f} ms hand-over of a ready batch" + left_out,
                cpu_shrink=(wait_spans, min(1.0, floor / max(median_wait, 1e-9)))))
        else:
            saving, basis = a.predicted_saving(Scenario(
                "DataLoader waits removed" + (f", training-thread CPU work {contention - 1:.0%} slower with workers" if single else "")
                + left_out, cpu_removed=wait_spans, cpu_scale=contention))
        if saving is None:  # no GPU in the trace: the step shrinks by the wait itself (what the fix leaves of it)
            left = plan["wait_left"] if plan is not None else min(1.0, floor / max(median_wait, 1e-9))
            saving = share_total * (1 - left)
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
        if single:
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
            message += " " + loading_sentence(measured, plan)
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
                     "outlier_steps": outlier_steps, **(loading_numbers(measured, plan) if measured else {})},
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


# -- what `gpuadvise profile` measured of the loading (run.json `capture.loader`) ------------------------

ENTRY_POINTS = {"__getitem__", "__getitems__", "__iter__", "__next__"}


def hot_functions(measured: dict) -> list[dict]:
    """The user's functions the batch build spends its time in, the dataset's entry points left out
    (they hold all of it by definition), biggest share first."""
    return [f for f in measured["functions"] if f["function"] not in ENTRY_POINTS]


def function_items(measured: dict) -> list[dict]:
    return [{"name": f["function"], "where": f"{f['file']}:{f['line']}", "share_of_build_pct": f["share_pct"],
             "per_batch_ms": f["ms_per_batch"]} for f in measured["functions"]]


def handover_floor_us(waits, median_wait: float, measured: dict | None, cap_us: float) -> float:
    """The part of a multi-process loader's wait that more workers cannot remove: the training process
    receiving (unpickling) a batch a worker has ready. Measured (run.json `capture.loader`): workers
    that keep up (B/k ≤ C) leave all of the wait to it, else what the lag B/k − C does not explain. From
    the trace alone: the shortest wait of the steps (a batch that was ready). Never more than `cap_us`."""
    if measured and measured.get("num_workers") and measured.get("between_batches_ms") is not None:
        lag = max(0.0, measured["build_ms_per_batch"] / measured["num_workers"] - measured["between_batches_ms"]) * 1e3
        # no more than a hand-over takes: a longer wait from workers that keep up on average is batches
        # arriving unevenly (a slow batch, a worker short of CPU), which more prefetching absorbs
        return min(max(0.0, median_wait - lag), cap_us)
    return min(float(np.min(waits)), cap_us) if len(waits) else 0.0


def more_workers(measured: dict, cpus: int | None, waits, floor_ms: float = 0.0) -> dict | None:
    """How much of each wait is left with more workers, in steady state: k workers building a batch in
    B ms each deliver one every B/k ms; a step that uses one every C ms (its time between batches)
    then waits max(0, B/k − C), plus the hand-over of the batch (`floor_ms`). Workers added = what keeps
    up, capped by the free cores (usable cores minus the training process and the workers already
    there). None when a number is missing."""
    build, between = measured["build_ms_per_batch"], measured["between_batches_ms"]
    workers = measured["num_workers"]
    if between is None or workers is None or not len(waits):
        return None
    wait_now = float(waits["dur"].mean()) / 1e3  # the trace's own wait: the intervals the replay shrinks
    free = max(0, cpus - 1 - workers) if cpus else 0
    keeps_up = max(1, -(-build // max(between, 1e-3)))  # ceil(B / C)
    target = int(max(workers, min(workers + free, keeps_up)))
    if target == workers:
        left = 1.0
    else:
        left = min(1.0, (max(0.0, build / target - between) + floor_ms) / max(wait_now, 1e-9))
    return {"free_cores": free, "workers_now": workers, "workers": target, "keeps_up": int(keeps_up),
            "wait_left": left, "wait_now_ms": wait_now,
            "scenario": (f"num_workers {workers} → {target}: one batch every {build / target:.1f} ms "
                         f"(measured {build:.1f} ms per batch), the step uses one every {between:.1f} ms; "
                         f"{free} free core(s)") if target != workers else
            f"no free core for another worker ({cpus} usable, {workers} workers + the training process)"}


def loading_sentence(measured: dict, plan: dict | None) -> str:
    build, workers = measured["build_ms_per_batch"], measured["num_workers"]
    where = f"in each of {workers} workers (one batch every {build / workers:.1f} ms)" if workers else "in the training process"
    text = f"Each batch takes {build:.1f} ms to build {where}"
    if measured["between_batches_ms"] is not None:
        text += f"; the step uses one every {measured['between_batches_ms']:.1f} ms"
    text += "."
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
        return (f"No free core for another worker ({plan['workers_now']} workers + the training process use them): "
                f"make `{measured['fetch']}` cheaper, starting with the functions listed in the evidence.")
    text = f"{switches.sentence(switches.num_workers(fw, plan['workers'], loader))} ({plan['free_cores']} free core(s) measured)"
    if plan["workers"] < plan["keeps_up"]:
        text += (f"; {plan['keeps_up']} would keep up, so also make `{measured['fetch']}` cheaper, "
                 "starting with the functions listed in the evidence")
    return text + "."


def loading_numbers(measured: dict, plan: dict | None) -> dict:
    out = {"build_per_batch_ms": measured["build_ms_per_batch"], "fetch_per_sample_ms": measured["fetch_ms_per_sample"],
           "collate_per_batch_ms": measured["collate_ms_per_batch"], "num_workers": measured["num_workers"],
           "between_batches_ms": measured["between_batches_ms"], "wait_per_batch_ms": measured["wait_ms_per_batch"]}
    if plan is not None:
        out.update(free_cores=plan["free_cores"], suggested_num_workers=plan["workers"])
    return out


RULE = DataloaderStall()

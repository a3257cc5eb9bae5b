"""step-time-drift: the step got slower during the run, and stayed slower.

## What it detects
The whole run's step times (the step record `gpuadvise profile` writes for every step, profiled or not)
rise from their early level to a slower one, beyond chance (a CUSUM test at 1 %, stalls and a warm-up
left out; analyzer/measure/longrun/changepoints.py). The drift's shape is a step (a new level), a climb (linear)
or a faster climb (its trend grows); it began where the series left its early level (the step of a jump,
the start of a climb's trend; an exponential's where its excess reached the noise), dated to the steps
where every growth law that fits about as well begins (a step; the step time growing as u, u^1.5, u², u³,
u + u², u + u·ln u or exponentially in the steps u since then; the profile likelihood of the onset and the
law's shape together, widened for noise whose steps follow each other, on the whole climb and on its first
stretches), and lasted to the step
before it came back, if it did. The early level is the
median of the unprofiled steps before the onset, the slow one the median of the new level (a step) or of
a climb's last K steps (K = `--slower-steps`, 20 by default).
When a window recorded the slow steps (`--when-slower`, `--on-signal`, `--every`), it is compared with
window 1 as `gpuadvise compare` compares two runs, and the finding names what changed: the findings that
appeared or grew, the part of the step that grew (DataLoader wait, compute, sync, …), the op that grew most.
Where the run sampled the GPU's own telemetry (NVML, the `nvml` extra), a drift during which the SM clock
fell says so: thermal or power throttling, by the reasons NVML reported. When the lower clock accounts for
at least half of the drift (GPU-bound work slows by at most the clock's ratio), the fix is the machine's;
otherwise the finding names the throttling beside what the windows found.
A rise that comes back down and begins at a DataLoader's worker start (the step record notes each iterator
that starts worker processes: every epoch's, unless `persistent_workers=True` keeps them) is no drift but
the loader restarting: when the same steps are slow after the run's other worker starts too, the finding
says so, counts what the restarts cost over the run, and names `persistent_workers=True` as the fix.

## Why it matters
A run that slows down after its first epoch (DataLoader workers re-created each epoch, a cache that no
longer fits, a Python list that grows and is scanned every step), as its memory fills up, or as the GPU
throttles, spends every later step at the slow speed. A profile of the first steps shows none of it.

## Fix
```python
# Record the slow steps while the run is slow, then fix what the comparison names:
#   gpuadvise profile --when-slower 20 train.py      # a window when the median step is 20 % slower
#   gpuadvise trigger RUN                            # or ask a --on-signal run for a window now
# When the finding names throttling, the fix is the machine's: its cooling or power limit
#   nvidia-smi -q -d PERFORMANCE                     # the active clock-throttle reasons
loader = DataLoader(ds, num_workers=8, persistent_workers=True)  # e.g. workers re-created each epoch
history.append(loss.item())                                      # e.g. a growing list of tensors
```

## Thresholds
Fires when a rise is beyond chance (the CUSUM test's p < 1 %) and the slow level is at least 15 % and
0.5 ms above the early level, with at least 2·K unprofiled steps recorded. A finding counts as grown when its predicted saving rose by 5 percentage points between
the windows; an op is named when its time per step grew by a tenth of the drift. The predicted saving is
the share of a slow step the drift costs, 1 − early / slow, for the steps from the start of the drift on
(an upper bound: the steps return to the early level when the cause is fixed). Severity follows it.
A rise is the loader's restart when its onset's 95 % interval (or the onset) lies within a step of a
worker start, it came back down more than K steps before the run's end, and, where the run has worker
starts other than the first and this one, the steps around at least half of them (as many before and after
the start as the rise's) have a median above the midpoint of the early and slow levels. Its predicted
saving is the time those steps around each worker start after the first spend above the early median, of
the unprofiled steps' time (persistent workers still start once); severity follows it.
The clock counts as fallen when the median SM clock of the NVML samples during the drift is at least 5 %
below the one before it and a one-sided Mann-Whitney test on the samples gives p < 0.01 (at least 3
samples a side); a throttle reason is named when NVML reported it in a quarter of the samples during
the drift and in under half as many before it.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.measure.longrun.throttling import throttling_evidence
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.model.steprecord import dated
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.longrun import RunFolder, Window, trace_for

from .base import RunRule

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
# the parts of the step compare's breakdown splits (GPU idle is what the others leave, not a cause)
SHAPES = {"step": "jumped", "climb": "climbed steadily", "faster climb": "climbed ever faster"}
PARTS = {"dataloader": "DataLoader wait", "kernel": "GPU compute", "comm": "communication", "memcpy": "copies",
         "sync": "sync wait"}


class StepTimeDrift(RunRule):
    code = "GA160"
    name = "step-time-drift"
    title = "The step got slower during the run"
    thresholds = {"min_drift_pct": 15.0, "min_drift_ms": 0.5, "min_grown_pts": 5.0, "op_share_of_drift": 0.1}

    def check(self, a: RunAnalysis):
        lv, t = a.levels, self.thresholds
        if lv is None or lv.began_at is None:
            return []
        if lv.change_pct < t["min_drift_pct"] or lv.slow_ms - lv.early_ms < t["min_drift_ms"]:
            return []
        last = a.record.last_step
        restart = _worker_start_at(a, lv)
        if restart is not None and lv.until is not None and last is not None and lv.until < last - lv.k \
                and _recurs(a, lv, restart[0]):
            return [self._epoch_restart(a, lv, restart)]  # a blip after the loader's workers restarted: not a drift
        low, high = lv.began_between or (None, None)
        span = f"from step {lv.began_at}{dated(low, high)} on" if lv.until is None or last is None or \
            lv.until >= last - lv.k else f"from step {lv.began_at}{dated(low, high)} to step {lv.until}"
        shape = SHAPES.get(lv.shape, lv.shape)
        slow_steps = lv.slow_steps or (lv.slow_at, lv.slow_at)
        message = (f"The step time {shape} from a median {lv.early_ms:.2f} ms (steps {lv.early_steps[0]}–"
                   f"{lv.early_steps[1]}) to {lv.slow_ms:.2f} ms (+{lv.change_pct:.0f} %, the median of steps "
                   f"{slow_steps[0]}–{slow_steps[1]}) {span}.")
        if restart is not None:
            message += (f" It began as a DataLoader started {_workers(restart[1])} at step {restart[0]} (each epoch's "
                        "iterator starts its workers anew).")
        first, slow = a.window(1), self._slow_window(a, lv)
        cmp = a.comparisons.get(slow.index) if slow is not None else None
        items: list[dict] = []
        lead = None
        if slow is None:
            message += " No window recorded the slow steps, so the trace cannot say what changed."
            advice = ("Profile again with `--when-slower 15` (a window when the median step is 15 % slower), or with "
                      "`--on-signal` and run `gpuadvise trigger RUN` while it is slow; the windows are then compared.")
        elif cmp is None or first is None or not first.steps or first.steps[1] >= lv.began_at:
            message += (f" Window {slow.index} (steps {slow.steps[0]}–{slow.steps[1]}) recorded the slow steps, but no "
                        "window before the drift to compare it with.")
            advice = f"Read window {slow.index}'s findings: they describe the slow steps."
        else:
            items, lead = self._changes(cmp, slow, lv.slow_ms - lv.early_ms)
            said = "; ".join(i["what"] for i in items[:4]) or "no finding, part of the step or op changed by much"
            message += (f" Window {slow.index} (steps {slow.steps[0]}–{slow.steps[1]}, {_why(slow)}) against window 1 "
                        f"(steps {first.steps[0]}–{first.steps[1]}): {said}.")
            advice = (f"Fix what grew: {lead['rule']} ({lead['topic']}) explains the slow steps best; its finding on "
                      f"window {slow.index} says how." if lead else
                      f"Compare the windows in full: `gpuadvise compare` on window 1's and window {slow.index}'s traces.")
        throttled = _throttling(a, lv)
        if throttled is not None:  # the GPU slowed itself down: the machine is to fix, not (only) the code
            message += " " + throttled.sentence(lv.change_pct)
            advice = throttled.advice() if throttled.explains(lv.change_pct) else \
                advice + " The GPU also throttled: " + throttled.advice()
        saving = 100.0 * (1.0 - lv.early_ms / lv.slow_ms)
        evidence = Evidence(
            steps=list(range(slow.steps[0], slow.steps[1] + 1)) if slow is not None and slow.steps else [],
            items=items,
            numbers={"early_ms": round(lv.early_ms, 3), "slow_ms": round(lv.slow_ms, 3),
                     "drift_pct": round(lv.change_pct, 1), "began_at_step": lv.began_at,
                     "onset_interval": f"steps {low}–{high} (every growth law that fits)" if low is not None else None,
                     "until_step": lv.until,
                     "late_ms": round(lv.late_ms, 3), "k": lv.k, "shape": lv.shape,
                     "statistic": f"median of steps {slow_steps[0]}–{slow_steps[1]}",
                     "chance": float(f"{lv.p_value:.2g}") if lv.p_value is not None else None,
                     "slow_window": slow.index if slow is not None else None,
                     "explained_by": lead["rule"] if lead else None,
                     **(throttled.numbers() | {"clock_share_of_drift_pct": round(throttled.share_of(lv.change_pct), 1)}
                        if throttled is not None else {})})
        basis = (f"the steps from step {lv.began_at} on at the early median ({lv.early_ms:.2f} ms) instead of the "
                 f"slow one ({lv.slow_ms:.2f} ms): the step record's unprofiled steps")
        f = self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)
        f.impact.upper_bound = True  # the drift's cost; its cause's fix is the finding it names
        return [f]

    def _epoch_restart(self, a: RunAnalysis, lv, restart: tuple[int, int]):
        """The slow steps follow a DataLoader iterator starting its workers (an epoch boundary) and the step came
        back after them: the workers' restart, whose cost recurs with every epoch's start, named with its fix."""
        at, n = restart
        starts = [s for s, w in a.record.worker_starts if w > 0]
        before, after = at - lv.began_at, lv.until - at  # the slow steps around the start
        steps, ms = a.record.unprofiled()
        total = float(ms.sum()) if len(ms) else 0.0
        later = [s for s in starts if s > starts[0]]  # persistent workers still start once
        excess = sum(float(np.clip(ms[(steps >= s - before) & (steps <= s + after)] - lv.early_ms, 0, None).sum())
                     for s in later)
        saving = 100.0 * excess / total if total > 0 else 0.0
        listed = ", ".join(str(s) for s in starts[:8]) + (" …" if len(starts) > 8 else "")
        message = (f"Steps {lv.began_at}–{lv.until} ran at a median {lv.slow_ms:.2f} ms against {lv.early_ms:.2f} ms "
                   f"before (+{lv.change_pct:.0f} %), then the step came back: they follow a DataLoader starting "
                   f"{_workers(n)} at step {at}, an epoch's start (worker starts at steps {listed}). Each epoch's "
                   "iterator starts its workers anew: this is the loader restarting, not a drift.")
        loaders = [ld for ld in runfacts.training_loaders(a.facts) if (ld.num_workers or 0) > 0]
        kept = [ld for ld in loaders if ld.persistent_workers]
        where = f" at {loaders[0].where}" if loaders else ""
        if loaders and len(kept) == len(loaders):
            advice = (f"Build the DataLoader{where} once, outside the epoch loop: its workers persist "
                      "(`persistent_workers` is on), but a new loader starts new ones.")
        else:
            advice = (f"Keep the workers between epochs: pass `persistent_workers=True` to the DataLoader{where}.")
        evidence = Evidence(
            steps=list(range(lv.began_at, lv.until + 1)),
            items=[{"name": f"step {s}", "workers": w} for s, w in a.record.worker_starts[:10]],
            numbers={"early_ms": round(lv.early_ms, 3), "slow_ms": round(lv.slow_ms, 3), "drift_pct": round(lv.change_pct, 1),
                     "began_at_step": lv.began_at, "until_step": lv.until, "worker_start_step": at,
                     "worker_starts": len(starts), "restart_cost_ms": round(excess, 3), "k": lv.k,
                     "statistic": f"median of steps {lv.began_at}–{lv.until}"})
        basis = (f"the steps around each later worker start ({len(later)}: {before} before to {after} after it, as "
                 f"around step {at}) at the early median ({lv.early_ms:.2f} ms), of the step record's unprofiled "
                 "steps' time")
        fix = ("```python\n"
               "loader = DataLoader(ds, batch_size=..., persistent_workers=True)  # workers kept between epochs\n"
               "for epoch in range(epochs):\n"
               "    for x, y in loader:\n"
               "        ...\n"
               "```")
        return self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice, fix=fix)

    @staticmethod
    def _slow_window(a: RunAnalysis, lv):
        """The analysed later window whose surroundings ran slowest, within the drift."""
        mid = lv.early_ms + 0.5 * (lv.slow_ms - lv.early_ms)
        inside = [w for w in a.captured() if w.index > 1 and w.steps and w.steps[0] >= lv.began_at
                  and (lv.until is None or w.steps[0] <= lv.until)]
        slow = [w for w in inside if (w.level_ms or 0.0) >= mid]
        pool = slow or inside
        # a window that also holds a stall (an evaluation step) describes the stall as much as the drift
        steady = [w for w in pool if not (w.report.figures and w.report.figures.slow_steps)]
        pool = steady or pool
        return max(pool, key=lambda w: w.level_ms or 0.0) if pool else None

    def _changes(self, cmp: dict, slow, drift_ms: float) -> tuple[list[dict], dict | None]:
        """What grew from window 1 to the slow window, most first: findings, parts of the step, ops (an op
        only when it grew by a tenth of the drift: a small op's wobble explains nothing)."""
        grown = []
        for f in cmp["findings"]["new"]:
            after = f["after"]["est_step_saving_pct"] or 0.0
            grown.append((after, {"kind": "finding", "rule": f["rule"], "topic": f["topic"], "before": None,
                                  "after": after, "what": f"{f['topic']} appeared (its fix predicted to save {after:.0f} % "
                                                          "of the step there)"}))
        for f in cmp["findings"]["still_there"]:
            b, a = f["before"]["est_step_saving_pct"] or 0.0, f["after"]["est_step_saving_pct"] or 0.0
            if a - b >= self.thresholds["min_grown_pts"]:
                grown.append((a, {"kind": "finding", "rule": f["rule"], "topic": f["topic"], "before": b, "after": a,
                                  "what": f"{f['topic']} grew (its fix predicted to save {b:.0f} % → {a:.0f} % of "
                                          "the step)"}))
        grown.sort(key=lambda g: -g[0])
        items = [g[1] for g in grown]
        lead = items[0] if items else None
        parts = [r for r in cmp["breakdown"] if r["part"] in PARTS and r["change_ms"] is not None and r["change_ms"] > 0]
        if parts:
            p = max(parts, key=lambda r: r["change_ms"])
            items.append({"kind": "part", "rule": None, "topic": p["part"], "before": p["before_ms"], "after": p["after_ms"],
                          "what": f"{PARTS[p['part']]} per step {p['before_ms']:.2f} → {p['after_ms']:.2f} ms"})
        ops = [o for o in cmp["ops"] if o["change_ms_per_step"] >= self.thresholds["op_share_of_drift"] * drift_ms]
        if ops:
            o = ops[0]
            items.append({"kind": "op", "rule": None, "topic": o["name"], "before": o["before_ms_per_step"],
                          "after": o["after_ms_per_step"],
                          "what": f"the op that grew most: {o['name']} (+{o['change_ms_per_step']:.2f} ms per step)"})
        return items, lead

    # -- fixtures ---------------------------------------------------------------------------------------
    def positive(self) -> RunFolder:
        return _drifting_run(slow_ms=6.0)

    def negative(self) -> RunFolder:
        return _drifting_run(slow_ms=2.1)  # a 5 % wobble is no drift


def _worker_start_at(a: RunAnalysis, lv) -> tuple[int, int] | None:
    """The DataLoader worker start (step, workers) at the rise's onset: inside its 95 % interval, or a step
    either side of it (the start's step is the one its iterator was built in, the slow ones follow)."""
    low, high = lv.began_between or (lv.began_at, lv.began_at)
    near = [(s, n) for s, n in a.record.worker_starts if n > 0 and low - 1 <= s <= high + 1]
    return min(near, key=lambda x: abs(x[0] - lv.began_at)) if near else None


def _recurs(a: RunAnalysis, lv, at: int) -> bool:
    """Whether the slow steps come back after the run's other worker starts (after the first, which persistent
    workers keep too): the same steps around at least half of them run above the midpoint of the early and
    slow levels (their median). A run with no other start has only this one to show."""
    steps, ms = a.record.unprofiled()
    before, after = at - lv.began_at, lv.until - at
    others = [s for s, n in a.record.worker_starts if n > 0 and s != at][1:]
    mid = lv.early_ms + 0.5 * (lv.slow_ms - lv.early_ms)
    seen = [ms[(steps >= s - before) & (steps <= s + after)] for s in others]
    seen = [x for x in seen if len(x)]
    return not seen or sum(float(np.median(x)) > mid for x in seen) >= len(seen) / 2


def _workers(n: int) -> str:
    return f"{n} worker process{'es' if n != 1 else ''}"


def _drifting_run(slow_ms: float) -> RunFolder:
    """120 steps of 2 ms; from step 60 on the DataLoader takes `slow_ms` − 2 ms more per batch; window 2
    recorded steps 80–82."""
    ms = {n: (2.0 if n < 60 else slow_ms) + 0.01 * (n % 3) for n in range(1, 121)}
    w1 = Window(1, "schedule", start=3)
    w2 = Window(2, "slower", start=79, detail="the median step rose")
    w1.trace = _loader_steps(trace_for(w1), wait_us=100.0)
    w2.trace = _loader_steps(trace_for(w2), wait_us=100.0 + 1000 * (slow_ms - 2.0))
    return RunFolder(ms, [w1, w2])


def _loader_steps(b: TraceBuilder, wait_us: float) -> TraceBuilder:
    for _ in range(3):
        with b.step():
            b.cpu(LOADER, wait_us)
            with b.op("aten::linear"):
                b.cpu("aten::addmm", 1_500.0)
            b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 300.0)
    return b


def _throttling(a: RunAnalysis, lv):
    """The GPU's telemetry over the drift against before it (measure/longrun/throttling.py): the SM clock's fall
    beyond chance and NVML's throttle reasons; None without telemetry or without a fall."""
    return throttling_evidence(a.record.telemetry, (0, lv.began_at - 1), (lv.began_at, lv.until))


def _why(w) -> str:
    words = {"slower": "recorded when slower", "stall": "recorded on a stall", "signal": "recorded on a signal",
             "trigger file": "recorded on request", "every": "recorded on schedule"}
    return words.get(w.trigger, f"trigger {w.trigger}")


RULE = StepTimeDrift()

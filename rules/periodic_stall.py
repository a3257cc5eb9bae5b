"""periodic-stall: every N steps one step takes far longer than the others (evaluation, checkpointing, logging).

## What it detects
Steps in the whole run's step record that take at least twice the level of the steps around them (the
median of K), and 1 ms more, recurring at one distance N beyond chance: most of the steps N apart hold
one, and a hypergeometric test (analyzer/model/recurrence.py) puts the chance of as many at one period,
were they placed at random, under 1 % over every period and first step that could have been tested. The window
that recorded one of them (`--when-slower` places a window on the next predicted stall; `--every` and
`--on-signal` windows may hold one too) names it by what its extra time went to, against the window's
other steps: an evaluation (model forward ops with no backward), data loading (a new epoch's DataLoader
starting its workers), a checkpoint save (device→host copies of the weights), a sync, or CPU time
outside any recorded op (Python or I/O: a checkpoint written to disk, logging, metrics).

## Why it matters
The GPU waits through every stall: an evaluation of 30 s every 1 000 steps of 0.3 s costs 9 % of the run,
and a stall on one rank of a job stalls every rank at the next collective. A profile of a few steps
rarely holds one.

## Fix
```python
# Evaluate less often, on fewer batches, without autograd; checkpoint and log off the training thread
if step % 2000 == 0:
    model.eval()
    with torch.inference_mode():
        evaluate(model, val_loader, max_batches=50)
    model.train()
loader = DataLoader(ds, num_workers=8, persistent_workers=True)  # no worker restart each epoch
torch.distributed.checkpoint.async_save(state_dict, checkpoint_id=path)  # or save from a thread
```

## Thresholds
A stall is at least 2× its level and 1 ms longer; it must recur at least 3 times at one distance N,
cover at least 60 % of the unprofiled steps of its residue class from the first one, be beyond chance
(p < 1 %), and cost at least 1 % of the run's time. The predicted saving is that cost: the stall's median extra time over the time of N steps with one
stall in them (an upper bound: moving the work elsewhere keeps part of it).
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.longrun import RunFolder, Window, trace_for

from .base import RunRule

ADVICE = {
    "evaluation": "Evaluate less often or on fewer batches, under torch.inference_mode(), or in another process.",
    "data loading": "Keep the DataLoader's workers between epochs (persistent_workers=True) and raise prefetch_factor.",
    "checkpoint": "Save checkpoints less often, asynchronously (torch.distributed.checkpoint.async_save), or from a "
                  "copy made on a side stream.",
    "sync": "Read values back less often (log every N steps, accumulate on the GPU and call .item() once).",
    "outside ops": "Move the work off the training thread (a background thread or process for checkpoint writes, "
                   "logging and metrics), or do it less often.",
}


class PeriodicStall(RunRule):
    code = "GA161"
    name = "periodic-stall"
    title = "Every N steps one step stalls"
    thresholds = {"min_x": 2.0, "min_excess_ms": 1.0, "min_repeats": 3, "min_coverage": 0.6, "min_share_pct": 1.0}

    def check(self, a: RunAnalysis):
        t = self.thresholds
        st = a.stalls(t["min_x"], t["min_excess_ms"], t["min_repeats"], t["min_coverage"])
        if st is None or st.share_pct < t["min_share_pct"]:
            return []
        shown = ", ".join(map(str, st.steps[:6])) + (", …" if len(st.steps) > 6 else "")
        message = (f"Every {st.period} steps one step takes {st.excess_ms:.1f} ms more than the {st.base_ms:.2f} ms "
                   f"of the steps around it: steps {shown} ({len(st.steps)} of the {st.expected} unprofiled steps "
                   f"{st.period} apart), {st.share_pct:.1f} % of the run's time.")
        window, slow = self._window(a, st)
        if slow is not None:
            message += (f" Window {window.index} recorded one (step {slow['step']}, {slow['ms']:.1f} ms against "
                        f"{slow['others_ms']:.1f} ms for its other steps): {slow['what']}.")
            advice = ADVICE.get(slow["kind"], "Look at the ops that grew in that step (the evidence lists them).")
        else:
            message += " No window recorded one, so the trace cannot say what it is."
            advice = ("Profile again with `--when-slower 50`: it places a window on the next stall, which then names "
                      "it (an evaluation, a checkpoint, logging, the DataLoader).")
        evidence = Evidence(
            steps=st.steps[:20],
            items=[{"name": o["name"], "extra_ms": o["extra_ms"], "calls": o["calls"], "others_calls": o["others_calls"]}
                   for o in (slow or {}).get("top_ops", [])],
            numbers={"period_steps": st.period, "stalls": len(st.steps), "expected": st.expected,
                     "stall_extra_ms": round(st.excess_ms, 3), "level_ms": round(st.base_ms, 3),
                     "share_pct": round(st.share_pct, 2), "statistic": "median stall",
                     "named_by_window": window.index if window is not None else None,
                     "kind": slow["kind"] if slow is not None else None})
        basis = (f"the stall's median extra time over {st.period} steps with one stall in them "
                 f"({st.period} × {st.base_ms:.2f} ms + {st.excess_ms:.1f} ms), from the step record")
        f = self.finding(message=message, evidence=evidence, saving=st.share_pct, basis=basis, advice=advice)
        f.impact.upper_bound = True
        return [f]

    @staticmethod
    def _window(a: RunAnalysis, st):
        """A window whose trace holds a step of the stall's residue class that its analysis found slow: the
        window placed on a stall first (another window's slow step of that class may be another pause)."""
        phase = st.steps[0] % st.period
        for w in sorted(a.captured(), key=lambda w: (w.trigger != "stall", w.index)):
            fig = w.report.figures
            for s in fig.slow_steps if fig is not None else []:
                if s["step"] % st.period == phase:
                    return w, s
        return None, None

    # -- fixtures ---------------------------------------------------------------------------------------
    def positive(self) -> RunFolder:
        return _stalling_run(stall_steps=[21, 41, 61, 81, 101])

    def negative(self) -> RunFolder:
        return _stalling_run(stall_steps=[17, 44, 58, 90])  # as many slow steps, at no one distance


def _stalling_run(stall_steps: list[int]) -> RunFolder:
    """110 steps of 2 ms with a 20 ms evaluation in `stall_steps`; window 2 recorded steps 80–82."""
    ms = {n: 2.0 + 0.01 * (n % 3) + (20.0 if n in stall_steps else 0.0) for n in range(1, 111)}
    w1 = Window(1, "schedule", start=3)
    w2 = Window(2, "stall", start=79)
    w1.trace = _train_steps(trace_for(w1), evaluation_in=None)
    w2.trace = _train_steps(trace_for(w2), evaluation_in=81 if 81 in stall_steps else None)
    return RunFolder(ms, [w1, w2])


def _train_steps(b: TraceBuilder, evaluation_in: int | None) -> TraceBuilder:
    for _ in range(3):
        number = b.step_no
        with b.step():
            with b.op("aten::linear"):
                b.cpu("aten::addmm", 1_500.0)
            b.cpu("autograd::engine::evaluate_function: AddmmBackward0", 400.0)
            if number == evaluation_in:
                for _ in range(40):  # forward passes without backward: an evaluation
                    with b.op("aten::linear"):
                        b.cpu("aten::addmm", 500.0)
    return b


RULE = PeriodicStall()

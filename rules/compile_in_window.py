"""compile-in-window: the recorded steps measured torch.compile compiling, not training.

## What it detects
Compilation `gpuadvise profile` recorded (run.json `compiled.compiles`) inside the profiled window's
steps: the window fell on the first compiled steps, or a recompile landed in it. From a trace alone, the
compile spans PyTorch records (`_compile.compile_inner`, `compile_fx_inner`, `GraphLowering.run`,
`async_compile.wait`, autotuning: every `… (dynamo_timed)` span, analyzer/measure/basics/compilework.py), one
compile per compile id. The syncs, copies and kernel launches made inside them (the autotuner's) are
counted here and kept out of host-sync, pageable-memcpy, launch-bound and the step figures. The compile seconds
in those steps are compared with the steps' recorded time (every recorded step, those left out of the
figures for one-time costs included). This rule owns that compilation: warm-up-capture leaves the
one-time costs it finds in those steps to it, so one cost is reported once.

## Why it matters
Dynamo tracing and Inductor code generation run on the CPU inside the step that first calls the
compiled function: seconds, against milliseconds of training. A trace of those steps shows a CPU-bound,
idle-GPU job whatever the real steady state is, and every other verdict (utilization, launch overhead,
stalls) reads that distorted picture. This is a capture problem, not a training one.

## Fix
Record steps after the model has compiled: start the window later (`gpuadvise profile --wait 20
train.py`), or with your own profiler skip the compiling steps:
```python
from torch.profiler import profile, schedule
with profile(schedule=schedule(wait=20, warmup=2, active=3)) as prof:   # wait past the compiles
    for batch in loader:
        train_step(batch)
        prof.step()
```
If compiles keep landing in the window however late it starts, the model recompiles in steady state:
see compile-recompiles.

## Thresholds
Any compile recorded in a step of the window (phase `active`). Severity high when compiling took at
least 10 % of the recorded steps' time (the ProfilerStep spans in the trace), else medium. No time saving is predicted: the capture must be
fixed first.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.calls import COPY_CALLS, LAUNCH_CALLS, SYNC_CALLS
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.compiled import WINDOW, compiled_facts, compiled_loop

from .base import Rule

HIGH_SHARE = 10.0


class CompileInWindow(Rule):
    code = "GA152"
    name = "compile-in-window"
    topic = "capture-problem"
    title = "The recorded steps measured compilation, not training"
    thresholds = {"high_share_pct": HIGH_SHARE}

    def check(self, a: Analysis):
        facts = a.compile_facts
        inside = runfacts.compiles_in_window(facts)
        if not inside:
            return []
        steps = sorted({c["step"] for c in inside if isinstance(c.get("step"), int)})
        seconds = sum(c["seconds"] for c in inside)
        # the recorded steps' time as the trace has it (run.json does not time step 0, the script's start)
        # (the steps left out of the figures for one-time costs, compilation among them, included)
        recorded_s = sum(s.dur for s in a.metrics.steps + a.metrics.left_out_steps) / 1e6
        share = 100.0 * seconds / recorded_s if recorded_s > 0 else None
        where = sorted({str(c.get("where")) for c in inside if c.get("where")})
        recompiles = sum(1 for c in inside if c.get("recompile_reason") or c.get("recompile") is True)
        where_ran = f"the recorded step(s) {', '.join(map(str, steps))}" if steps else "the recorded window"
        message = f"{len(inside)} torch.compile compile(s) ran inside {where_ran} ({seconds:.2f} s"
        message += f", {share:.0f}% of the recorded steps' time)" if share is not None else ")"
        message += f"; {recompiles} of them recompile(s)." if recompiles else ": the window fell on the first compiled steps."
        last = max((c["step"] for c in runfacts.compile_events(facts) if isinstance(c.get("step"), int)), default=0)
        work = self._compiler_calls(a)
        if work:
            message += f" Inside the compile spans: {work}, kept out of every other figure."
        advice = (f"Start the window after step {last} (e.g. `gpuadvise profile --wait {last + 5}`), once the model has "
                  "compiled." if not recompiles else
                  "Compiles keep landing in the window: fix the recompiles first (compile-recompiles), then capture again.")
        evidence = Evidence(steps=steps, sources=where[:5],
                            items=[{"name": str(c.get("module") or c.get("function") or _compile_name(c)), "where": c.get("where"), "step": c.get("step"),
                                    "seconds": c.get("seconds")} for c in inside[:10]],
                            numbers={"compiles_in_window": len(inside), "compile_seconds": round(seconds, 3),
                                     "share_of_recorded_pct": round(share, 1) if share is not None else None})
        return [self.finding(message=message, evidence=evidence, saving=0.0, advice=advice,
                             basis="not a time saving: the capture must be fixed first",
                             severity="high" if share is None or share >= HIGH_SHARE else "medium")]

    @staticmethod
    def _compiler_calls(a: Analysis) -> str:
        """The syncs, copies and kernel launches the compiler made (autotuning), in words; "" when none."""
        work = a.metrics.compile_work
        rt = a.model.runtime
        if not work or not len(rt):
            return ""
        calls = rt[work.inside(rt["ts"].to_numpy(dtype=float))]
        names = calls["name"].astype(str)
        counts = [(int(names.isin(SYNC_CALLS.keys()).sum()), "blocking call", "blocking calls"),
                  (int(names.isin(COPY_CALLS).sum()), "copy call", "copy calls"),
                  (int(names.isin(LAUNCH_CALLS).sum()), "kernel launch", "kernel launches")]
        return ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts if n)

    def positive(self) -> TraceBuilder:
        b = compiled_loop()
        b.facts = compiled_facts([{"step": WINDOW[0], "seconds": 6.0}])
        return b

    def negative(self) -> TraceBuilder:
        b = compiled_loop()
        b.facts = compiled_facts([{"step": 0, "seconds": 6.0}])
        return b


def _compile_name(c: dict) -> str:
    """A compile the trace shows without its function: by its compile id (frame/recompile)."""
    return f"compile {c['compile_id']} (frame {str(c['compile_id']).split('/')[0]})" if c.get("compile_id") else "a compile"


RULE = CompileInWindow()

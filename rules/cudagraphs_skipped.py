"""cudagraphs-skipped: `mode="reduce-overhead"` asked for CUDA graphs, but they were not replayed.

## What it detects
A `torch.compile(..., mode="reduce-overhead")` call (or `options={"triton.cudagraphs": True}`) in a
run where Inductor skipped CUDA graphs: run.json `compiled.cudagraphs` holds the skip count and
reasons Inductor reported ("skipping cudagraphs due to mutated inputs", "… cpu device", "… dynamic
shape inputs" …) and how many graphs were captured and replayed (`CUDAGraph.capture_begin` /
`replay` calls); the trace is checked for CUDA graph launches (`cudaGraphLaunch`).

## Why it matters
reduce-overhead exists to replace a step's hundreds of kernel launches by one graph launch. When
Inductor skips the graphs it says so only in a log line nobody enabled: the model runs compiled but
launch-bound, and the user believes the launch overhead is gone.

## Fix
Remove what the skip reason names:
```python
batch = batch.to("cuda", non_blocking=True)    # "cpu device": every input on the GPU
model = torch.compile(model, mode="reduce-overhead", dynamic=False)  # "dynamic shape": fixed sizes
# "mutated inputs": do not modify inputs in place inside the compiled function (x.add_ → x = x + …)
torch.compiler.cudagraph_mark_step_begin()     # once per iteration when outputs are kept across steps
```
`TORCH_LOGS=perf_hints` prints each skip with its reason.

## Thresholds
CUDA graphs requested, a GPU present, and either a skip recorded, or no capture, no replay and no
`cudaGraphLaunch` in the trace. No time saving is predicted here: what the graphs would save is the
launch overhead launch-bound reports.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.compiled import compiled_facts, compiled_loop

from .base import Rule


class CudagraphsSkipped(Rule):
    code = "GA153"
    name = "cudagraphs-skipped"
    title = "reduce-overhead asked for CUDA graphs, but they were not replayed"
    thresholds = {}

    def check(self, a: Analysis):
        cg = runfacts.compiled(a.facts).get("cudagraphs")
        if not isinstance(cg, dict) or cg.get("requested") is not True or runfacts.cuda_available(a.facts) is False:
            return []
        skips = cg.get("skips") if isinstance(cg.get("skips"), int) else 0
        reasons = [str(r) for r in cg.get("skip_reasons") or [] if r]
        captures = cg.get("captures") if isinstance(cg.get("captures"), int) else 0
        replays = cg.get("replays") if isinstance(cg.get("replays"), int) else 0
        launches = a.compiled.cuda_graph_launches if a.compiled is not None else 0
        if not skips and (captures or replays or launches):
            return []
        why = f": {reasons[0]}" if reasons else (" (no reason recorded)" if skips else "")
        message = (f"torch.compile was asked for CUDA graphs (reduce-overhead), but Inductor skipped them {skips} "
                   f"time(s){why}; {captures} graph(s) captured, {replays} replayed, {launches} cudaGraphLaunch "
                   "call(s) in the trace.")
        advice = (f"Inductor's reason: {'; '.join(reasons[:3])}." if reasons else
                  "Run with `TORCH_LOGS=perf_hints` to see why Inductor skipped the graphs.")
        evidence = Evidence(steps=[s.number for s in a.metrics.steps],
                            items=[{"name": r} for r in reasons[:5]],
                            numbers={"skips": skips, "captures": captures, "replays": replays,
                                     "graph_launches_in_trace": launches})
        return [self.finding(message=message, evidence=evidence, saving=0.0, advice=advice, severity="medium",
                             basis="not predicted here: the launch overhead graphs would remove is launch-bound's")]

    def positive(self) -> TraceBuilder:
        b = compiled_loop()
        b.facts = compiled_facts(mode="reduce-overhead",
                                 cudagraphs={"skips": 1, "skip_reasons": ["skipping cudagraphs due to mutated inputs "
                                                                          "(1 instances)"]})
        return b

    def negative(self) -> TraceBuilder:
        b = compiled_loop(graph_launch=True)
        b.facts = compiled_facts(mode="reduce-overhead", cudagraphs={"captures": 2, "replays": 14})
        return b


RULE = CudagraphsSkipped()

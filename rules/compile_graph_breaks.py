"""compile-graph-breaks: torch.compile splits the model into several graphs, with eager Python between them.

## What it detects
Graph breaks `gpuadvise profile` recorded (run.json `compiled.graph_breaks`, from dynamo's
`dynamo_graph_break_reason` reports): each with its reason ("Unsupported Tensor.item() call", "print",
a data-dependent branch …) and the user's file:line where dynamo stopped. In the trace, the compiled
frames (`Torch-Compiled Region`) are matched with the graphs that ran inside them (`CompiledFunction`,
`## Call CompiledFxGraph`): region time outside every graph is the eager island a break leaves.
Breaks are ranked by how often dynamo hit them. From a trace alone (no run.json: a trace recorded with plain
`torch.profiler`), a break is a compiled region of one frame running inside a region of another: dynamo
resumes the code after a break in a new frame, called from the one it broke out of. The trace names
neither the reason nor the line; the finding names the frames and says how to list the breaks.

## Why it matters
Each break ends a graph: the work after it cannot be fused with the work before it, each island runs
op by op in Python with its own kernel launches, and a break on `.item()` or a data-dependent `if`
also waits for the GPU to finish (a host sync) in the middle of the model. A break inside a value that
changes every call also makes the resume function recompile (see compile-recompiles).

## Fix
Remove what dynamo cannot trace from the compiled function:
```python
# print / logging inside forward: drop it, or guard it with `if not torch.compiler.is_compiling():`
scale = h.abs().max()                   # keep the value a tensor instead of `.item()`
h = h / (1.0 + scale)
torch._dynamo.config.capture_scalar_outputs = True    # or let dynamo trace `.item()` into the graph
model = torch.compile(model, fullgraph=True)          # fail loudly on any break while you fix them
```
`torch._dynamo.explain(model)(*inputs)` lists every break with its reason.

## Thresholds
Any graph break at a user file:line. The predicted saving is the eager-island time the trace shows in
the recorded steps, minus compiling recorded in those steps (run.json, or the trace's compile spans),
as a share of the steps: an
upper bound, since the ops in the islands still run once compiled. A trace without graph spans (the
`eager` backend) or without run.json step times gives no prediction.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import frames, runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.compiled import TRAIN, compiled_facts, compiled_loop

from .base import Rule


NO_REASON = "the trace does not record why; `torch._dynamo.explain(model)(*inputs)` lists it"


def _place(b: dict) -> str:
    """A break named in the user's terms: by its library (never the library's file), else by the compiled
    frames the trace shows."""
    if b.get("library_where"):
        return f"code inside {frames.package(str(b['library_where']))}"
    return f"compiled frame {b['frame']} (resumed inside frame {b.get('broke_out_of', '?')})"


class CompileGraphBreaks(Rule):
    code = "GA151"
    name = "compile-graph-breaks"
    title = "torch.compile graph breaks leave eager Python between graphs"
    thresholds = {}

    def check(self, a: Analysis):
        # a break dynamo located only in library code (a run.json from before frames were judged) is named
        # by its library, never by the library's file
        facts = a.compile_facts
        breaks = [dict(b, where=b.get("where") or _place(b), reason=b.get("reason") or NO_REASON)
                  for b in runfacts.graph_break_sites(facts)
                  if b.get("where") or b.get("library_where") or b.get("frame")]
        if not breaks:
            return []
        breaks.sort(key=lambda b: -(b.get("count") if isinstance(b.get("count"), int) else 0))
        top = breaks[0]
        saving, basis, numbers = self._saving(a)
        numbers.update(graph_breaks=len(breaks), first_where=top.get("where"), first_reason=top.get("reason"))
        sync = [b for b in breaks if "item()" in str(b.get("reason")) or "data-dependent" in str(b.get("reason"))]
        message = (f"torch.compile broke the graph at {len(breaks)} place(s); first at {top.get('where')}: "
                   f"\"{top.get('reason')}\".")
        if numbers.get("island_pct") is not None:
            message += (f" In the recorded steps {numbers['island_pct']:.1f}% of the step ran eagerly between graphs "
                        f"({numbers['regions_per_step']} compiled-frame calls a step).")
        advice = "; ".join(f"{b.get('where')}: {b.get('reason')}" for b in breaks[:5] if b["reason"] != NO_REASON)
        advice = f"Remove the break(s) — {advice}." if advice else \
            "List the breaks with `torch._dynamo.explain(model)(*inputs)` (reason and line of each) and remove them."
        if sync:
            advice += " `.item()` / data-dependent control flow also syncs with the GPU there: keep the value a tensor."
        items = [{"name": str(b.get("reason")), "where": b.get("where"), "count": b.get("count"),
                  "steps": b.get("steps")} for b in breaks[:10]]
        return [self.finding(message=message, saving=saving, basis=basis, advice=advice,
                             evidence=Evidence(steps=[s.number for s in a.metrics.steps], items=items,
                                               sources=[s for s in (runfacts.site(b["where"]) for b in breaks[:10]) if s],
                                               numbers=numbers))]

    @staticmethod
    def _saving(a: Analysis) -> tuple[float, str, dict]:
        ct = a.compiled
        if ct is None or not ct.steps or not ct.graph_spans:
            return 0.0, ("not predicted: the trace does not show where the graphs ran (no CompiledFunction spans; "
                         "the `eager` backend has none)"), {}
        compile_s = runfacts.compile_seconds_by_step(a.compile_facts)
        island = sum(max(0.0, (s.island_us or 0.0) - 1e6 * compile_s.get(s.number, 0.0)) for s in ct.steps)
        total = sum(s.dur_us for s in ct.steps)
        if total <= 0:
            return 0.0, "not predicted: no recorded step time", {}
        pct = 100.0 * island / total
        regions = max(s.regions for s in ct.steps)
        numbers = {"island_pct": round(pct, 1), "island_ms_per_step": round(island / len(ct.steps) / 1e3, 3),
                   "regions_per_step": regions}
        return pct, (f"eager time inside compiled frames but outside their graphs in the {len(ct.steps)} recorded "
                     "step(s), compiling in those steps left out: an upper bound"), numbers

    def finding(self, **kw):
        f = super().finding(**kw)
        f.impact.upper_bound = f.impact.est_step_saving_pct > 0
        return f

    def positive(self) -> TraceBuilder:
        b = compiled_loop(breaks=1, island_us=3_000, with_item=True)
        b.facts = compiled_facts(breaks=[{"where": f"{TRAIN}:25", "reason": "Unsupported Tensor.item() call with "
                                          "capture_scalar_outputs=False", "count": 1, "steps": [0]}])
        return b

    def negative(self) -> TraceBuilder:
        b = compiled_loop()
        b.facts = compiled_facts()
        return b


RULE = CompileGraphBreaks()

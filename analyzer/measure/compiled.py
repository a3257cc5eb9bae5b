"""Compiled work in the trace and in run.json: how much of each step ran inside torch.compile's graphs,
and how much ran eagerly between them (run.json's compile events are read in model/runfacts.py).

In the trace, dynamo's `Torch-Compiled Region: F/N` spans mark a compiled frame running (the resume
function after a graph break nests inside the frame it broke out of); the graph itself runs inside
AOTAutograd's `CompiledFunction` / `CompiledFunctionBackward` or Inductor's `## Call CompiledFxGraph`
spans. Region time outside those graph spans is Python that dynamo could not put in a graph: the eager
islands a graph break leaves (and any compilation that happened there, which is counted apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuadvise.analyzer.model.calls import GRAPH_LAUNCHES
from gpuadvise.analyzer.model.kernels import inductor_kind
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

from . import intervals
from .metrics import Metrics

REGION = "Torch-Compiled Region"
GRAPH_SPANS = ("CompiledFunction", "CompiledFunctionBackward")
GRAPH_ANNOTATION = "## Call CompiledFxGraph"


@dataclass
class StepSplit:
    number: int
    dur_us: float  # the step's CPU span
    compiled_us: float  # inside graphs (or inside compiled regions when the trace has no graph spans)
    island_us: float | None  # inside compiled regions but outside their graphs; None without graph spans
    regions: int  # compiled-frame calls (one more per graph break the step runs through)


@dataclass
class CompiledTrace:
    steps: list[StepSplit]
    graph_spans: bool  # the trace shows where graphs run, not only where compiled frames run
    inductor_kernels: dict = field(default_factory=dict)  # kind → {"count", "us"}
    cuda_graph_launches: int = 0

    @property
    def compiled_pct(self) -> float:
        total = sum(s.dur_us for s in self.steps)
        return 100.0 * sum(s.compiled_us for s in self.steps) / total if total > 0 else 0.0


    def describe(self) -> str:
        """One line for the report: the compiled share of the recorded steps and what ran between graphs."""
        parts = []
        if self.steps:
            total = sum(s.dur_us for s in self.steps)
            line = f"torch.compile: {self.compiled_pct:.0f}% of the recorded steps' CPU time ran inside compiled " + \
                   ("graphs" if self.graph_spans else "frames")
            if self.graph_spans and total > 0:
                island = sum(s.island_us or 0.0 for s in self.steps)
                line += f", {100.0 * island / total:.0f}% between graphs (eager code, and any compiling)"
            regions = max(s.regions for s in self.steps)
            parts.append(line + f" ({regions} compiled-frame call{'s' if regions != 1 else ''} a step)")
        if self.inductor_kernels:
            parts.append("Inductor kernels: " + ", ".join(f"{v['count']} {k} ({v['us'] / 1e3:.2f} ms)"
                                                          for k, v in sorted(self.inductor_kernels.items())))
        if self.cuda_graph_launches:
            parts.append(f"{self.cuda_graph_launches} CUDA graph launches")
        return "; ".join(parts) or "torch.compile: compiled work in the trace"


def compiled_trace(model: TraceModel, metrics: Metrics) -> CompiledTrace | None:
    """The compiled share of each step; None when the trace shows no compiled work at all."""
    cpu = model.cpu
    names = cpu["name"].astype(str) if len(cpu) else None
    regions = cpu[name_mask(cpu["name"], lambda n: n.startswith(REGION))] if names is not None else cpu
    graphs = cpu[name_mask(cpu["name"], lambda n: n in GRAPH_SPANS or n.startswith(GRAPH_ANNOTATION))] \
        if names is not None else cpu
    kernels = _inductor_kernels(model)
    launches = int(model.runtime["name"].isin(GRAPH_LAUNCHES).sum()) if len(model.runtime) else 0
    if not len(regions) and not len(graphs) and not kernels and not launches:
        return None
    reg = intervals.union(regions["ts"].to_numpy(float), regions["end"].to_numpy(float))
    gra = intervals.union(graphs["ts"].to_numpy(float), graphs["end"].to_numpy(float))
    has_graphs = len(graphs) > 0
    islands = intervals.subtract(reg, gra) if has_graphs else None
    out = []
    for s in metrics.steps:
        inside = intervals.covered(*(gra if has_graphs else reg), s.start, s.end)
        island = float(np.sum(intervals.covered(*islands, s.start, s.end))) if islands is not None else None
        n = int(((regions["ts"] >= s.start) & (regions["ts"] < s.end)).sum()) if len(regions) else 0
        out.append(StepSplit(s.number, float(s.cpu_dur), float(np.sum(inside)), island, n))
    return CompiledTrace(out, has_graphs, kernels, launches)


def _inductor_kernels(model: TraceModel) -> dict:
    k = model.kernels
    out: dict[str, dict] = {}
    if not len(k):
        return out
    for name, dur in zip(k["name"].astype(str), k["dur"].to_numpy(float)):
        kind = inductor_kind(name)
        if kind:
            e = out.setdefault(kind, {"count": 0, "us": 0.0})
            e["count"] += 1
            e["us"] = round(e["us"] + float(dur), 3)
    return out

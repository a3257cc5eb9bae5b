"""Compiled work in the trace and in run.json: how much of each step ran inside torch.compile's graphs,
and how much ran eagerly between them (run.json's compile events are read in model/runfacts.py).

In the trace, dynamo's `Torch-Compiled Region: F/N` spans mark a compiled frame running (the resume
function after a graph break nests inside the frame it broke out of); the graph itself runs inside
AOTAutograd's `CompiledFunction` / `CompiledFunctionBackward` or Inductor's `## Call CompiledFxGraph`
spans. Region time outside those graph spans is Python that dynamo could not put in a graph: the eager
islands a graph break leaves (and any compilation that happened there, which is counted apart).

A trace recorded without `gpuadvise profile` has no run.json: `trace_compile_facts` reads the same
facts from the trace alone and writes them as run.json's `compiled` section, so the compile rules read
one set of facts (model/runfacts.py) whichever source they came from. From the trace:
- compiles: the compile spans (compilework.py), one per compile id F/R, with their seconds and step;
- recompiles: a compile span of compile F/R with R > 0 (frame F's R-th recompile), and a compiled frame
  F running as F/R with R above every R of that frame in the first recorded step (R > 0 for a frame not
  seen there);
- graph breaks: a compiled region of one frame running inside a region of another (dynamo resumes the
  code after a break in a new frame, called from the frame it broke out of), one site per resumed frame.
The trace names no reason and no source line for either: those fields stay empty.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.calls import GRAPH_LAUNCHES
from gpuadvise.analyzer.model.kernels import inductor_kind, is_matmul_like
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

from ..basics import intervals, perstep
from ..basics.compilework import CompileWork, region_id
from ..basics.metrics import Metrics

REGION = "Torch-Compiled Region"
MODEL_MATMULS_MIN = 20  # matmul kernels enough to say where the model runs
MODEL_MATMULS_COMPILED = 0.25  # … and the share of them a compiled model launches inside compiled code, at least
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
    # (matmul kernels launched inside a compiled region or graph span on the launching thread, all matmul
    # kernels), in the steps where there are steps; None without region or graph spans to look in
    matmuls: tuple[int, int] | None = None

    @property
    def beside_eager_model(self) -> bool:
        """Compiled code that launched under a quarter of the model's matmul kernels (of 20 or more): a
        compiled helper beside a model that runs eagerly."""
        if self.matmuls is None:
            return False
        inside, total = self.matmuls
        return total >= MODEL_MATMULS_MIN and inside < MODEL_MATMULS_COMPILED * total

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
            parts.append(perstep.count_of(self.cuda_graph_launches, "CUDA graph launch", "CUDA graph launches"))
        if self.beside_eager_model:
            inside, total = self.matmuls
            parts.append(f"the model runs eagerly: {inside} of its {total} matmul kernels were launched inside "
                         "compiled code")
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
    matmuls = _matmuls_in_compiled_code(model, metrics, pd.concat([regions, graphs])) \
        if len(regions) or has_graphs else None
    return CompiledTrace(out, has_graphs, kernels, launches, matmuls)


def _matmuls_in_compiled_code(model: TraceModel, metrics: Metrics, spans: pd.DataFrame) -> tuple[int, int]:
    """How many of the matmul kernels (in the steps, when there are steps) were launched from inside a
    compiled region or graph span on the launching thread, and how many there are. A kernel replayed from
    a CUDA graph counts where its graph was launched. A compiled model launches its matmuls there, the
    backward's included (CompiledFunctionBackward runs on the autograd thread); a compiled helper beside
    an eager model launches none of them."""
    from ..basics.spans import gpu_ops_launched_in

    k, rt = model.kernels, model.runtime
    if not len(k) or not len(rt):
        return 0, 0
    k = k[name_mask(k["name"], is_matmul_like)]
    if metrics.steps:
        k = k[k["ts"].between(*metrics.window)]
    calls = rt[rt["correlation"].isin(k["correlation"])].drop_duplicates("correlation")
    inside = gpu_ops_launched_in(model, calls.rename(columns={"ts": "launch_ts"}), spans)
    return int(k["correlation"].isin(inside["correlation"]).sum()), len(k)


def _inductor_kernels(model: TraceModel) -> dict:
    k = model.kernels
    out: dict[str, dict] = {}
    if not len(k):
        return out
    names = k["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # each name judged once; only Inductor's rows walked
        kinds = [inductor_kind(str(c)) for c in names.cat.categories] + [None]  # code -1 (no name): None
        codes = names.cat.codes.to_numpy()
        mine = np.flatnonzero(np.array([x is not None for x in kinds])[codes])
        of_row = [kinds[c] for c in codes[mine].tolist()]
    else:
        every = [inductor_kind(n) for n in names.astype(str)]
        mine = np.flatnonzero([x is not None for x in every])
        of_row = [every[i] for i in mine.tolist()]
    for kind, dur in zip(of_row, k["dur"].to_numpy(float)[mine]):
        if kind:
            e = out.setdefault(kind, {"count": 0, "us": 0.0})
            e["count"] += 1
            e["us"] = round(e["us"] + float(dur), 3)
    return out


def trace_compile_facts(model: TraceModel, metrics: Metrics) -> dict:
    """run.json's `compiled` section as the trace alone shows it (module docstring); {} when the trace
    holds no compiled region and no compile span."""
    cpu = model.cpu
    work = metrics.compile_work or CompileWork()
    regions = cpu[name_mask(cpu["name"], lambda n: n.startswith(REGION))] if len(cpu) else cpu
    if not len(regions) and not work:
        return {}
    steps = sorted(metrics.steps + metrics.left_out_steps, key=lambda s: s.start)

    starts = [s.start for s in steps]

    def step_at(ts: float) -> int | None:
        k = bisect_right(starts, ts) - 1
        return steps[k].number if k >= 0 and ts < steps[k].end else None

    compiles: dict[str, dict] = {}
    for i, sp in enumerate(work.spans):
        key = sp.compile_id or f"?{i}"
        c = compiles.setdefault(key, {"compile_id": sp.compile_id or None, "function": None, "where": None,
                                      "step": step_at(sp.ts), "phase": "active", "seconds": 0.0,
                                      "recompile_reason": None, "fail_reason": None, "autotuning": False,
                                      "source": "trace"})
        c["seconds"] = round(c["seconds"] + (sp.end - sp.ts) / 1e6, 6)
        c["autotuning"] = c["autotuning"] or sp.autotuning
    runs = sorted((float(t), float(e), region_id(str(n)) or "")
                  for t, e, n in zip(regions["ts"], regions["end"], regions["name"].astype(str)))
    seen = sorted([(t, cid) for t, _, cid in runs if cid] +
                  [(_first_ts(work, c["compile_id"]), c["compile_id"])
                   for c in compiles.values() if c["compile_id"]])
    first = steps[0] if steps else None
    base: dict[str, int] = {}
    for t, cid in seen:
        if first is not None and first.start <= t < first.end:
            f, r = cid.split("/")
            base[f] = max(base.get(f, -1), int(r))
    recompiles, met = [], set()
    for t, cid in seen:
        if cid in met:
            continue
        met.add(cid)
        f, r = cid.split("/")
        step = step_at(t)
        compiled_here = cid in compiles and int(r) > 0  # a compile span of F's R-th compile: a recompile
        ran_anew = first is not None and t >= first.end and int(r) > base.get(f, 0)
        if compiled_here or ran_anew:
            recompiles.append({"compile_id": cid, "function": None, "where": None, "frame": cid, "step": step,
                               "phase": "active", "reason": None, "source": "trace"})
    again = {r["compile_id"] for r in recompiles}
    for c in compiles.values():  # run.json names the failed guard; the trace only that it was a recompile
        c["recompile"] = c["compile_id"] in again
    breaks: dict[tuple, dict] = {}
    open_regions: list[tuple] = []  # the thread's regions running at t, outermost first
    threads = sorted(zip(regions["tid"].astype(str), regions["ts"].astype(float), regions["end"].astype(float),
                         (region_id(str(n)) or "" for n in regions["name"].astype(str))))
    last_tid = None
    for tid, t, e, cid in threads:
        if tid != last_tid:
            open_regions, last_tid = [], tid
        while open_regions and open_regions[-1][1] <= t:
            open_regions.pop()
        outer = next((o for o in reversed(open_regions) if e <= o[1] and o[2]
                      and o[2].split("/")[0] != cid.split("/")[0]), None) if cid else None
        open_regions.append((t, e, cid))
        if outer is None:
            continue
        b = breaks.setdefault((outer[2].split("/")[0], cid.split("/")[0]),
                              {"where": None, "reason": None, "frame": cid.split("/")[0],
                               "broke_out_of": outer[2].split("/")[0], "count": 0, "steps": [], "source": "trace"})
        b["count"] += 1
        n = step_at(t)
        if n is not None and n not in b["steps"]:
            b["steps"].append(n)
    per_step: dict[str, float] = {}
    for c in compiles.values():
        if c["step"] is not None:
            per_step[str(c["step"])] = round(per_step.get(str(c["step"]), 0.0) + c["seconds"], 6)
    return {"surface": "trace", "calls": [], "compiles": list(compiles.values()), "recompiles": recompiles,
            "graph_breaks": list(breaks.values()), "limit_hit": [], "compile_seconds_per_step": per_step,
            "graphs": len({c["compile_id"] for c in compiles.values() if c["compile_id"]} | {r[2] for r in runs if r[2]})}


def _first_ts(work: CompileWork, cid: str) -> float:
    return min(sp.ts for sp in work.spans if sp.compile_id == cid)


def trace_steps(metrics: Metrics) -> dict:
    """run.json's `steps` as the trace shows them: every recorded step (those left out of the figures
    included), its CPU span in ms, all of them recorded ("active")."""
    steps = sorted(metrics.steps + metrics.left_out_steps, key=lambda s: s.start)
    return {"clock": "trace", "number": [s.number for s in steps], "phase": ["active"] * len(steps),
            "ms": [round(s.cpu_dur / 1e3, 3) for s in steps]}

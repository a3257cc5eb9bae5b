"""inference-with-grad: evaluation or inference steps record autograd although nothing calls backward.

## What it detects
Profiled steps (or, without steps, the whole trace) that run forward ops with autograd recording on and
no backward pass: ops carry an autograd `Sequence number` (the profiler writes it on ops run in grad
mode) and the sequence numbers advance, which only happens when autograd creates graph nodes, while no
backward op (`autograd::engine::evaluate_function: …`, `…Backward`, `AccumulateGrad`, `aten::…_backward`)
runs in the same step. That is an evaluation or inference
loop without `torch.no_grad()` / `torch.inference_mode()`. Steps that also train (forward and backward in
one step) are not examined.

## Why it matters
With grad mode on, every op on a tensor that requires grad (the model's parameters do) creates an
autograd node and keeps the tensors its backward would need: the activations of the whole forward
stay in memory until the outputs are dropped, and each op pays the bookkeeping on the CPU. Without a
backward pass none of it is ever used. `inference_mode()` also skips version counters and view
tracking.

## Fix
```python
model.eval()
with torch.inference_mode():  # or torch.no_grad() when the outputs are used in autograd later
    for x, y in val_loader:
        preds = model(x.to(device, non_blocking=True))
```

## Thresholds
Fires when at least half of the profiled steps (at least one) have no backward op and create at least 3
autograd nodes each (distinct sequence numbers per thread; ops that merely run in grad mode on tensors
that need no grad repeat the same number). The step-time saving is not predicted: the trace cannot
separate autograd's bookkeeping from the ops' own time, and the larger gain is memory (activations
freed as the forward goes). Severity medium when every step is affected, else low.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics.source_lines import python_source, user_frame_from_stack
from gpuadvise.analyzer.model.trace import name_mask
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

BACKWARD = "autograd::engine::evaluate_function:"
# Backward work as traces name it: the engine's wrapper (torch ≥ 1.10), autograd node names (2021 traces
# have `CudnnConvolutionBackward` with no wrapper), gradient accumulation and aten's *_backward kernels.
BACKWARD_NAME = re.compile(r"^autograd::engine::evaluate_function:|Backward\d*$|AccumulateGrad|_backward(_\w+)?$")


def is_backward(name: str) -> bool:
    return bool(BACKWARD_NAME.search(name))
GEMM = "ampere_sgemm_128x64_tn"


class InferenceWithGrad(Rule):
    code = "GA142"
    name = "inference-with-grad"
    title = "Forward passes record autograd but no backward runs (evaluation without no_grad)"
    thresholds = {"min_nodes_per_step": 3, "min_step_share": 0.5}

    def check(self, a: Analysis):
        cpu = a.model.cpu
        if cpu.empty or "seq" not in cpu or not (cpu["seq"] >= 0).any():
            return []  # grad mode never on, or a trace that does not record sequence numbers
        m, t = a.metrics, self.thresholds
        windows = [(s.start, s.end) for s in m.steps] or [m.window]
        ops = cpu[~cpu["is_annotation"].to_numpy()]
        ts = ops["ts"].to_numpy()
        starts = np.array([w[0] for w in windows])
        ends = np.array([w[1] for w in windows])
        k = np.searchsorted(starts, ts, side="right") - 1
        inside = (k >= 0) & (ts < ends[np.clip(k, 0, None)])
        step = np.where(inside, k, -1)
        backward = name_mask(ops["name"], is_backward)
        has_backward = np.bincount(step[backward & inside], minlength=len(windows)) > 0
        if has_backward.all():
            return []  # every step trains: the usual case, settled without looking at sequence numbers
        seq = ops["seq"].to_numpy()
        recorded = inside & (seq >= 0) & ~backward & ~has_backward[np.clip(step, 0, None)]
        # distinct (thread, sequence number) pairs per step: one per autograd node created there
        pairs = pd.DataFrame({"step": step[recorded], "tid": ops["tid"].to_numpy()[recorded], "seq": seq[recorded]})
        nodes = np.bincount(pairs.drop_duplicates()["step"].to_numpy(), minlength=len(windows))
        affected = np.flatnonzero(~has_backward & (nodes >= t["min_nodes_per_step"]))
        if not len(affected) or len(affected) < t["min_step_share"] * len(windows):
            return []

        hit = recorded & np.isin(step, affected)
        rows = ops[hit]
        top = rows.assign(name=rows["name"].astype(str)).groupby("name").size().sort_values(ascending=False)
        numbers = [m.steps[i].number for i in affected] if m.steps else []
        per_step_nodes = nodes[affected]
        source = _source(a, rows)
        if m.steps:
            nodes_text = (f"{'a median ' if len(affected) > 1 else ''}"
                          f"{perstep.count_of(float(np.median(per_step_nodes)), 'graph node')} per step")
            where = f"{len(affected)} of {len(windows)} profiled steps run"
        else:  # no ProfilerStep: the traced window is the one "step"
            nodes_text = f"{perstep.count_of(float(per_step_nodes[0]), 'graph node')} in the trace"
            where = "The traced window runs"
        message = (f"{where} forward ops with autograd recording ({nodes_text}) and no backward pass"
                   f"{f' ({source})' if source else ''}: evaluation or inference without torch.no_grad().")
        evidence = Evidence(
            steps=numbers,
            time_ranges_ms=[(a.rel_ms(windows[i][0]), a.rel_ms(windows[i][1])) for i in affected[:5]],
            items=[{"name": n, "count": int(c)} for n, c in top.head(8).items()],
            sources=[source] if source else [],
            numbers={"steps_affected": int(len(affected)), "steps": len(windows),
                     "autograd_nodes_per_step": [int(x) for x in per_step_nodes],
                     "ops_recording_per_step": round(float(np.median(np.bincount(step[hit], minlength=len(windows))[affected])), 1),
                     "statistic": "median affected step" if m.steps else "traced window"},
        )
        return [self.finding(
            message=message, evidence=evidence, saving=0.0,
            severity="medium" if len(affected) == len(windows) else "low",
            basis="not predicted: the trace cannot separate autograd's bookkeeping from the ops' own time; the main "
                  "gain is memory, the activations autograd keeps for a backward that never runs",
            advice="Wrap evaluation and inference in torch.inference_mode() (or torch.no_grad()).")]

    def positive(self) -> TraceBuilder:
        return _loop(eval_steps=4, grad=True)

    def negative(self) -> TraceBuilder:
        # the same evaluation loop under no_grad: the ops carry no sequence numbers
        return _loop(eval_steps=4, grad=False)


def _source(a: Analysis, rows) -> str:
    """The user line of the first recorded forward op, when the trace has stacks (--with-stack)."""
    for stack in rows["call_stack"].astype(str).head(50):
        frame = user_frame_from_stack(stack)
        if frame:
            return frame
    if len(rows) and not a.model.python.empty:
        r = rows.iloc[0]
        return python_source(a.model, float(r["ts"]), float(r["end"]), int(r["tid"]))
    return ""


def _loop(eval_steps: int, grad: bool, train_steps: int = 0) -> TraceBuilder:
    """Steps of a 4-layer MLP: training steps (forward with sequence numbers, then their backward), then
    evaluation steps (forward only; with `grad` its ops carry advancing sequence numbers)."""
    b = TraceBuilder()
    seq = 0
    for i in range(train_steps + eval_steps):
        train = i < train_steps
        with b.step():
            b.idle(200)
            first = seq
            for _ in range(4):
                args = {"Sequence number": seq, "Fwd thread id": 0} if (grad or train) else {}
                with b.op("aten::linear", **args):
                    with b.op("aten::addmm"):
                        b.kernel(GEMM, 150)
                args = {"Sequence number": seq + 1, "Fwd thread id": 0} if (grad or train) else {}
                with b.op("aten::relu", **args):
                    b.kernel("void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min>", 20)
                seq += 2 if (grad or train) else 0
            if train:
                for n in range(seq - 1, first - 1, -1):
                    with b.op(f"{BACKWARD} AddmmBackward0", **{"Sequence number": n, "Fwd thread id": 1}):
                        b.kernel(GEMM, 150)
            b.sync()
    b.finish()
    return b


RULE = InferenceWithGrad()

"""Which pass of training each CPU op ran in: the forward, the backward, or a forward op run again inside
the backward (activation checkpointing's recompute). The one place that tells them apart: the FLOP count
(measure/flops.py: model FLOPs leave the recompute out, hardware FLOPs keep it) and the recompute rule
read it.

How the trace shows it:
- **The backward** is what the autograd engine runs: every op inside an
  `autograd::engine::evaluate_function: …` span on its thread (the engine's own thread on a GPU, the
  caller's on a CPU). The ops a backward node calls run with grad mode off, so they carry no autograd
  sequence number.
- **A recomputed forward op** runs inside that span with grad mode on (checkpointing must build the
  graph it then differentiates), so it carries a sequence number, like every op of the forward does,
  and it is no backward node itself. Reentrant checkpointing (`use_reentrant=True`, the `CheckpointFunction`
  autograd function) runs it inside `CheckpointFunctionBackward`; non-reentrant checkpointing
  (`use_reentrant=False`, Hugging Face's `gradient_checkpointing_enable()` by default, selective
  checkpointing) runs it inside the backward node whose saved tensor was unpacked first. Either way the op
  with the sequence number is the root of the recomputed call tree; every op nested in it (the addmm in a
  linear, the kernels' ops) is recomputed too.
- A backward with `create_graph=True` (double backward: gradient penalties, some meta-learning) records
  its own graph, so its backward ops carry sequence numbers too: seen as a backward formula op
  (`aten::…_backward`) with one, recompute is not told apart there (`Passes.create_graph`) and nothing is
  called recomputed.
- torch.compile's own recompute (AOTAutograd's min-cut partitioner) happens inside the compiled backward
  graph and is not visible as ops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .spans import inside_any
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

FORWARD, BACKWARD, RECOMPUTE = 0, 1, 2  # `Passes.of` codes
NAMES = ("forward", "backward", "recompute")
ENGINE = "autograd::engine::evaluate_function: "
# autograd's own events: the engine's span, the node it runs (`AddmmBackward0`, `CheckpointFunctionBackward`,
# a custom Function's `…Backward`), AccumulateGrad
NODE = re.compile(r"^autograd::engine::|Backward\d*$|^torch::autograd::")
# an op a backward formula calls: with a sequence number it was recorded into a graph (create_graph=True)
BACKWARD_FORMULA = re.compile(r"^aten::\w*_backward(_\w+)?$")
REENTRANT = "CheckpointFunctionBackward"


@dataclass(frozen=True)
class Passes:
    of: np.ndarray  # per `model.cpu` row: FORWARD (everything outside the backward), BACKWARD, RECOMPUTE
    create_graph: bool = False  # the backward recorded a graph: recompute not told apart (module docstring)
    reentrant: bool = False  # the recompute ran in CheckpointFunctionBackward (torch.utils.checkpoint, use_reentrant=True)

    @property
    def recomputed(self) -> np.ndarray:
        return self.of == RECOMPUTE

    @property
    def backward(self) -> np.ndarray:
        return self.of == BACKWARD

    @property
    def any_recompute(self) -> bool:
        return bool(self.recomputed.any())


def passes(model: TraceModel) -> Passes:
    """The pass of every CPU op (module docstring); worked out once per model."""
    held = model.__dict__.get("_passes")
    if held is not None and held[0] is model.cpu:
        return held[1]
    out = _passes(model.cpu)
    model.__dict__["_passes"] = (model.cpu, out)
    return out


def _passes(cpu: pd.DataFrame) -> Passes:
    of = np.zeros(len(cpu), dtype=np.int8)
    if cpu.empty:
        return Passes(of)
    engine = name_mask(cpu["name"], lambda n: n.startswith(ENGINE))
    if not engine.any():
        return Passes(of)
    ts, end, tid = cpu["ts"].to_numpy(dtype=float), cpu["end"].to_numpy(dtype=float), cpu["tid"].to_numpy()
    in_backward = inside_any(ts, tid, cpu[engine])
    of[in_backward] = BACKWARD
    seq = cpu["seq"].to_numpy() >= 0
    ann = cpu["is_annotation"].to_numpy(dtype=bool)
    graphed = in_backward & seq & ~ann
    if (graphed & name_mask(cpu["name"], BACKWARD_FORMULA.match)).any():
        return Passes(of, create_graph=True)
    roots = graphed & ~name_mask(cpu["name"], NODE.search)
    if not roots.any():
        return Passes(of)
    recomputed = inside_any(ts, tid, cpu[roots], ends=end)
    of[recomputed & in_backward] = RECOMPUTE
    reentrant = bool(name_mask(cpu["name"], lambda n: n == REENTRANT).any())
    return Passes(of, reentrant=reentrant)

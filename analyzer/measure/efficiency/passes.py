"""Which pass of training each CPU op ran in: the forward, the backward, or a forward op run again inside
the backward (activation checkpointing's recompute). The one place that tells them apart: the FLOP count
(measure/efficiency/flops.py: model FLOPs leave the recompute out, hardware FLOPs keep it) and the recompute rule
read it.

How the trace shows it:
- **The backward** is what the autograd engine runs: every op inside an
  `autograd::engine::evaluate_function: …` span on its thread (the engine's own thread on a GPU, the
  caller's on a CPU). The ops a backward node calls run with grad mode off, so they carry no autograd
  sequence number.
- **A recomputed forward op** is one activation checkpointing ran again inside the backward, and every
  op nested in it (the addmm in a linear, the kernels' ops): measure/efficiency/recompute.py finds them (ops with an
  autograd sequence number inside a backward node, outermost among the aten ops, that replay ops the
  forward ran), for torch.utils.checkpoint re-entrant or not, selective checkpointing and Hugging Face's.
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

from . import recompute
from ..basics.spans import inside_any
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

FORWARD, BACKWARD, RECOMPUTE = 0, 1, 2  # `Passes.of` codes
NAMES = ("forward", "backward", "recompute")
ENGINE = "autograd::engine::evaluate_function: "
# an op a backward formula calls: with a sequence number it was recorded into a graph (create_graph=True)
BACKWARD_FORMULA = re.compile(r"^aten::\w*_backward(_\w+)?$")


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
    return model.per_cpu_frame("passes", _passes)


def _passes(model: TraceModel) -> Passes:
    cpu = model.cpu
    of = np.zeros(len(cpu), dtype=np.int8)
    if cpu.empty:
        return Passes(of)
    engine = name_mask(cpu["name"], lambda n: n.startswith(ENGINE))
    if not engine.any():
        return Passes(of)
    ts, tid = cpu["ts"].to_numpy(dtype=float), cpu["tid"].to_numpy()
    in_backward = inside_any(ts, tid, cpu[engine])
    of[in_backward] = BACKWARD
    seq = cpu["seq"].to_numpy() >= 0
    ann = cpu["is_annotation"].to_numpy(dtype=bool)
    graphed = in_backward & seq & ~ann
    if (graphed & name_mask(cpu["name"], BACKWARD_FORMULA.match)).any():
        return Passes(of, create_graph=True)
    found = recompute.find(model)  # the recomputed forward ops and every op inside them
    if found is None:
        return Passes(of)
    of[found.rows] = RECOMPUTE
    return Passes(of, reentrant=found.reentrant)

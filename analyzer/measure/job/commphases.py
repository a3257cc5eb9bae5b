"""Where in the training step each collective was issued, and which kind of parallelism issued it.

A job that trains a large model runs several kinds of collective in every step, each for its own reason:
FSDP gathers each layer's parameters before its forward and again before its backward, and
reduce-scatters its gradients after; tensor parallelism all-reduces (or all-gathers and reduce-scatters)
activations inside forward and backward; pipeline stages send and receive; expert parallelism exchanges
tokens all-to-all (as sharded embeddings exchange their lookups); DDP all-reduces gradients during
backward; an optimizer may all-reduce a norm.

Each collective is placed by where its rank *issued* it (the launch of its kernel, the `c10d::` call of a
CPU backend's span), on the thread that issued it:

- phase: "forward", "backward" or "optimizer" inside a step, "" outside every step ("graph" for a kernel
  of a CUDA graph captured before the trace began: its phase is not in the trace). Inside an
  `Optimizer.step#` annotation it is the optimizer's; inside an FSDP annotation the annotation says
  (FSDP2's `FSDP::pre_forward`, `FSDP::pre_backward`, `FSDP::backward_prefetch`,
  `FSDP::post_backward_reduce`, FSDP1's `FullyShardedDataParallel.…`: a name with "backward" in it is
  backward, else one with "forward" is forward); else inside an autograd op
  (`autograd::engine::evaluate_function: …`), or from the step's first one until its optimizer step, is
  backward, and before it forward. A kernel a CUDA graph ran is placed where its launch was captured into
  the graph (measure/compiled/cudagraphs.py), in the step that replayed the graph.
- scheme: "fsdp" inside an FSDP annotation; "tp" inside a functional collective's op (`_c10d_functional::…`,
  what DTensor's tensor and sequence parallelism issue); "pp" for sends and receives; "a2a" for all-to-all
  (an expert layer's dispatch and combine, sharded embeddings' lookups: the trace does not say which);
  "optimizer" in the optimizer step; "ddp" for an all-reduce in backward of a job whose forward DDP
  annotates (`DistributedDataParallel.forward`), "dp" for one without; else "".
"""

from __future__ import annotations

import re

import numpy as np

from ..basics.metrics import Metrics
from ..basics.spans import inside_any
from ..basics.steps import launch_steps
from gpuadvise.analyzer.model import collectives as coll
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

FSDP = re.compile(r"^(FSDP::|FullyShardedDataParallel\.)")
BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function:")
OPTIMIZER = re.compile(r"^Optimizer\.step#")
DDP_FORWARD = re.compile(r"^DistributedDataParallel\.forward$")

PHASES = ("forward", "backward", "optimizer")
SCHEMES = {"fsdp": "FSDP", "tp": "tensor parallel", "pp": "pipeline", "a2a": "all-to-all", "ddp": "DDP",
           "dp": "data parallel", "optimizer": "optimizer", "": ""}


def place(model: TraceModel, m: Metrics, issued_us: np.ndarray, issued_tid: np.ndarray,
          kinds: list[str], step_at: np.ndarray | None = None) -> tuple[list[str], list[str]]:
    """Per collective (issued at `issued_us`, model clock, on thread `issued_tid`): its phase and scheme.
    `step_at`: when its step issued it, where that is not `issued_us` (a CUDA graph's kernel: issued by the
    graph's replay, placed where its launch was captured)."""
    n = len(kinds)
    if not n:
        return [], []
    cpu = model.cpu
    spans = {k: cpu[name_mask(cpu["name"], p.match)] for k, p in (("fsdp", FSDP), ("backward", BACKWARD_OP),
                                                                  ("optimizer", OPTIMIZER))}
    spans["tp"] = cpu[name_mask(cpu["name"], coll.FUNCTIONAL.match)]
    fsdp_names = [str(x).lower() for x in spans["fsdp"]["name"]]
    fsdp_bw = spans["fsdp"][np.array(["backward" in x for x in fsdp_names], dtype=bool)]
    fsdp_fw = spans["fsdp"][np.array(["forward" in x for x in fsdp_names], dtype=bool)]
    t, tid = np.asarray(issued_us, dtype=float), np.asarray(issued_tid)
    in_fsdp = inside_any(t, tid, spans["fsdp"])
    in_tp = inside_any(t, tid, spans["tp"])
    in_opt = inside_any(t, tid, spans["optimizer"])
    phase = np.full(n, "", dtype=object)
    step = launch_steps(m.steps, t if step_at is None else np.asarray(step_at, dtype=float))
    ours = step >= 0
    if not m.steps:  # one whole-trace step
        ours[:] = True
    phase[ours] = "forward"
    # backward: from the step's first autograd op (on any thread) to its optimizer step
    bw = spans["backward"]
    if len(bw):
        bw_start = _first_per_step(m, bw["ts"].to_numpy(dtype=float))
        opt_start = _first_per_step(m, spans["optimizer"]["ts"].to_numpy(dtype=float))
        k = np.clip(step, 0, None)
        first = bw_start[k] if len(bw_start) else np.full(n, np.inf)
        stop = opt_start[k] if len(opt_start) else np.full(n, np.inf)
        phase[ours & (t >= first) & (t < stop)] = "backward"
        phase[ours & inside_any(t, tid, bw)] = "backward"
    phase[inside_any(t, tid, fsdp_fw)] = "forward"
    phase[inside_any(t, tid, fsdp_bw)] = "backward"
    phase[in_opt] = "optimizer"
    ddp = bool(name_mask(cpu["name"], DDP_FORWARD.match).any()) if len(cpu) else False
    scheme = []
    for i, kind in enumerate(kinds):
        if in_fsdp[i]:
            scheme.append("fsdp")
        elif in_tp[i]:
            scheme.append("tp")
        elif kind == "send_recv":
            scheme.append("pp")
        elif kind == "all_to_all":
            scheme.append("a2a")
        elif phase[i] == "optimizer":
            scheme.append("optimizer")
        elif kind == "all_reduce" and phase[i] == "backward":
            scheme.append("ddp" if ddp else "dp")
        else:
            scheme.append("")
    return phase.tolist(), scheme


def _first_per_step(m: Metrics, ts: np.ndarray) -> np.ndarray:
    """Per step (one for a trace without steps): the earliest of `ts` in it, inf where none."""
    count = max(len(m.steps), 1)
    out = np.full(count, np.inf)
    if not len(ts):
        return out
    k = launch_steps(m.steps, ts) if m.steps else np.zeros(len(ts), dtype=np.int64)
    for j in range(count):
        mine = ts[k == j]
        if len(mine):
            out[j] = float(mine.min())
    return out


def label(scheme: str, kind: str, phase: str) -> str:
    """A collective's place in words: "FSDP all-gather in forward", "tensor parallel all-reduce in backward"."""
    who = SCHEMES.get(scheme, scheme) if scheme not in ("optimizer", "a2a") else ""
    return f"{who + ' ' if who else ''}{where(kind, phase)}"


def where(kind: str, phase: str) -> str:
    """A collective and its phase in words: "all-gather in forward", "all-reduce outside the steps"."""
    words = kind.replace("_", "-") if kind != "send_recv" else "send/receive"
    return words + (" in a CUDA graph" if phase == "graph" else f" in {phase}" if phase else " outside the steps")

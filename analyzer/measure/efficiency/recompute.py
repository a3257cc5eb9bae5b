"""Forward ops run again inside the backward: activation checkpointing as the trace shows it.

`torch.utils.checkpoint` keeps a segment's inputs instead of its activations and runs the segment's
forward again when the backward needs them. The trace shows that second forward wherever it ran:

- **re-entrant** (`use_reentrant=True`, Hugging Face's default before transformers 4.35): inside the
  backward node `CheckpointFunctionBackward`, which re-runs the segment and then its own backward;
- **non-reentrant** (`use_reentrant=False`, the default torch recommends; selective checkpointing and
  `create_selective_checkpoint_contexts` build on it): inside whichever backward node first unpacks a
  tensor the segment saved, from a saved-tensor hook;
- either way as ops recorded **with grad mode on** (the profiler gives them an autograd sequence
  number, `model.cpu.seq` ≥ 0) **inside a backward node's span** (`autograd::engine::evaluate_function:`
  on the same thread). The backward's own ops run with grad mode off and carry none.

A double backward (`create_graph=True`: a gradient penalty, MAML) also records ops with grad mode on
inside backward nodes, but they are the backward's formulas, not a forward: they call `*_backward` ops,
or they are the ops a forward op calls (`aten::mm`, `aten::t` inside `aten::linear`) rather than the
forward's own outermost ops. So a recomputed op must be outermost among the aten ops around it (no
`aten::` op contains it on its thread), and every group of them (the ops of one outermost backward
node) must call no `*_backward` op, and most of its ops (MIN_FORWARD_SHARE) must be ops the forward ran
outermost too; a group that does otherwise is not counted.

The interface:
- `find(model, launches=None)` → `Recompute`, or None when the trace shows no recompute;
- `Recompute.rows` (positions in `model.cpu`) and `Recompute.contains(external_ids)`: the ops that ran
  inside a recompute, at any depth (the `aten::addmm` inside a recomputed `aten::linear`). For FLOPs:
  model FLOPs leave them out, hardware FLOPs keep them (PaLM's MFU and HFU);
- `Recompute.kernels`: the GPU ops they launched (rows of `metrics.launches`), when `find` got them;
- `per_step(rc, metrics)`: each step's recompute time, CPU and GPU, for the report's statistic.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..basics import intervals as iv
from ..basics import perstep
from ..basics.spans import TOUCH_US, gpu_ops_launched_in, ops_inside, outermost
from gpuadvise.analyzer.model.trace import TraceModel, distinct_names, name_mask

NODE = "autograd::engine::evaluate_function: "
# autograd's own ops: a node's span and its apply (`AddmmBackward0`, `CheckpointFunctionBackward`,
# `torch::autograd::AccumulateGrad`, `torch::autograd::CopySlices`): never a forward op
_AUTOGRAD = re.compile(r"^autograd::|^torch::autograd::|Backward\d*$")
_BACKWARD_OP = re.compile(r"backward", re.I)  # `aten::convolution_backward`, `aten::_softmax_backward_data`, …
# a recompute re-runs the forward's ops, with a little of checkpoint's own work between them (restoring
# the RNG state clones a tensor with grad mode on): most of a group's outermost ops must be ops the
# forward ran outermost too
MIN_FORWARD_SHARE = 0.5
REENTRANT_NODE = NODE + "CheckpointFunctionBackward"
# what the Python frames (`with_stack=True`) show of the API that asked for the recompute
_SELECTIVE = re.compile(r"selective_checkpoint|_CachingTorchDispatchMode|_CachedTorchDispatchMode|"
                        r"SelectiveCheckpointContext|create_selective_checkpoint_contexts")
_HF = re.compile(r"transformers/.*(gradient_checkpointing|GradientCheckpointingLayer|_with_checkpointing)")
_CHECKPOINT_FRAME = re.compile(r"torch/utils/checkpoint\.py")


@dataclass(frozen=True)
class Recompute:
    """The forward ops a trace ran again inside its backward.

    `ops`: the outermost recomputed ops, rows of `model.cpu` (`name`, `ts`, `end`, `dur`, `tid`,
    `external_id`, `seq`), in time order; `groups`: per op, the outermost backward node it ran in (an
    index; one group is one segment's recompute, or several segments re-run by one node); `rows`: the
    positions in `model.cpu` of every op inside them (them included), sorted; `ids`: their External
    ids; `forms`: how it was asked for, in words ("torch.utils.checkpoint, non-reentrant", …), empty
    when the trace shows only the ops."""

    ops: pd.DataFrame
    groups: np.ndarray
    rows: np.ndarray
    ids: np.ndarray
    forms: list[str] = field(default_factory=list)
    reentrant: bool = False
    selective: bool = False
    hugging_face: bool = False
    kernels: pd.DataFrame | None = None  # the GPU ops they launched (`metrics.launches` rows), when asked for

    @property
    def group_spans(self) -> pd.DataFrame:
        """Per group (`np.unique(groups)` order): `ts`, `end` (its first recomputed op's start, its last
        one's end: the Python between them included) and `tid`."""
        g = self.ops.groupby(self.groups)
        return pd.DataFrame({"ts": g["ts"].min(), "end": g["end"].max(), "tid": g["tid"].first()})

    @property
    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """The union of the groups' CPU spans (µs)."""
        g = self.group_spans
        return iv.union(g["ts"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float))

    @property
    def segments(self) -> int:
        """Recompute groups: the backward nodes that re-ran a forward."""
        return int(len(np.unique(self.groups)))

    def contains(self, external_ids) -> np.ndarray:
        """Which of these ops (by External id) ran inside a recompute, at any depth."""
        ext = np.asarray(external_ids, dtype=np.int64)
        if not len(self.ids):
            return np.zeros(ext.shape, dtype=bool)
        at = np.clip(np.searchsorted(self.ids, ext), 0, len(self.ids) - 1)
        return (self.ids[at] == ext) & (ext >= 0)



def find(model: TraceModel, launches: pd.DataFrame | None = None) -> Recompute | None:
    """The forward ops the trace ran again inside its backward; None when it ran none (or shows no
    backward). With `launches` (`metrics.launches`), the GPU ops they launched too (`Recompute.kernels`)."""
    cpu = model.cpu
    if cpu.empty:
        return None
    names = cpu["name"]
    node = name_mask(names, lambda n: n.startswith(NODE))
    if not node.any():
        return None
    real = ~cpu["is_annotation"].to_numpy(dtype=bool)
    autograd = name_mask(names, _AUTOGRAD.search)
    aten = name_mask(names, lambda n: n.startswith("aten::"))
    ts, end, tid = (cpu[c].to_numpy() for c in ("ts", "end", "tid"))
    outer = outermost(ts, end, tid, aten & real)
    nodes = cpu[node]
    in_node = cpu.index.isin(ops_inside(model, nodes).index)
    forward_names = set(distinct_names(names[real & ~autograd & outer & ~in_node]))
    seq = cpu["seq"].to_numpy()
    cand = np.flatnonzero(real & ~autograd & outer & in_node & (seq >= 0))
    if not len(cand):
        return None
    group = _outermost_span(ts[cand], end[cand], tid[cand], nodes)
    ops = cpu.iloc[cand]
    inner = _inner_rows(ts, end, tid, real, cand)  # every op inside a candidate, with its candidate's position
    bad_groups = set()
    inner_names = names.iloc[inner[:, 0]].astype(str).to_numpy() if len(inner) else np.array([], dtype=str)
    if len(inner):
        backward_call = np.fromiter((bool(_BACKWARD_OP.search(n)) and not _AUTOGRAD.search(n) for n in inner_names),
                                    dtype=bool, count=len(inner_names))
        bad_groups |= set(group[inner[backward_call, 1]].tolist())
    top_names = ops["name"].astype(str).to_numpy()
    known = np.fromiter((n in forward_names for n in top_names), dtype=bool, count=len(top_names))
    groups, at = np.unique(group, return_inverse=True)
    known_share = np.bincount(at, weights=known.astype(float)) / np.bincount(at)
    bad_groups |= set(groups[known_share < MIN_FORWARD_SHARE].tolist())
    keep = ~np.isin(group, list(bad_groups))
    if not keep.any():
        return None
    ops, group = ops[keep], group[keep]
    kept_pos = np.flatnonzero(keep)
    inside = inner[np.isin(inner[:, 1], kept_pos), 0] if len(inner) else np.array([], dtype=np.int64)
    rows = np.unique(np.concatenate([inside, cand[keep]]).astype(np.int64))
    ids = np.unique(cpu["external_id"].to_numpy()[rows].astype(np.int64))
    ids = ids[ids >= 0]
    frames = distinct_names(model.python["name"]) if not model.python.empty else []
    node_names = set(distinct_names(nodes["name"]))
    reentrant = REENTRANT_NODE in node_names and bool(ops.index.isin(
        ops_inside(model, nodes[nodes["name"].astype(str) == REENTRANT_NODE]).index).any())
    selective = any(_SELECTIVE.search(f) for f in frames)
    hf = any(_HF.search(f) for f in frames)
    forms = []
    if any(_CHECKPOINT_FRAME.search(f) for f in frames) or reentrant or selective:
        forms.append("torch.utils.checkpoint, " + ("re-entrant" if reentrant else "non-reentrant")
                     + (", selective" if selective else ""))
    if hf:
        forms.append("Hugging Face gradient checkpointing")
    out = ops[["name", "ts", "end", "dur", "tid", "external_id", "seq"]].copy()
    out["name"] = out["name"].astype(str)
    order = np.argsort(out["ts"].to_numpy(), kind="stable")
    out = out.iloc[order].reset_index(drop=True)
    kernels = gpu_ops_launched_in(model, launches, out) if launches is not None else None
    return Recompute(out, group[order], rows, ids, forms, reentrant, selective, hf, kernels)


def per_step(rc: Recompute, m) -> dict[str, np.ndarray]:
    """Per step (in `metrics.per_step` order): `cpu_us`, the time its thread spent in the recompute (each
    group from its first op's start to its last op's end); `gpu_us`, the summed GPU time of the ops it
    launched (`rc.kernels`; zero without them); `ops`, the outermost recomputed ops it issued. Placed by
    the iteration that issued them (`perstep.issued`)."""
    o, g = rc.ops, rc.group_spans
    cpu_us = perstep.issued(m, g["ts"], g["end"] - g["ts"])
    gpu = rc.kernels
    gpu_us = perstep.issued(m, gpu["launch_ts"], gpu["gpu_us"]) if gpu is not None and len(gpu) else np.zeros(len(cpu_us))
    return {"cpu_us": cpu_us, "gpu_us": gpu_us, "ops": perstep.issued(m, o["ts"])}


def _outermost_span(ts, end, tid, spans: pd.DataFrame) -> np.ndarray:
    """Per item: the index (into `spans`' rows) of the outermost span on its thread holding it."""
    s_ts, s_end, s_tid = (spans[c].to_numpy() for c in ("ts", "end", "tid"))
    out = np.full(len(ts), -1, dtype=np.int64)
    for t in np.unique(tid):
        on = np.flatnonzero(tid == t)
        mine = np.flatnonzero(s_tid == t)
        order = mine[np.lexsort((-s_end[mine], s_ts[mine]))]
        reach = np.maximum.accumulate(s_end[order])
        top = np.concatenate([[True], s_ts[order][1:] >= reach[:-1] - TOUCH_US])  # not inside an earlier span
        tops = order[top]
        k = np.searchsorted(s_ts[tops], ts[on], side="right") - 1
        out[on] = np.where(k >= 0, tops[np.clip(k, 0, None)], -1)
    return out


def _inner_rows(ts, end, tid, real, outer_rows: np.ndarray) -> np.ndarray:
    """(row, position in `outer_rows`) of every real op inside one of the ops at `outer_rows` on its
    thread (those ops left out). The outer ops do not overlap on a thread (they are outermost)."""
    pairs = []
    o_tid = tid[outer_rows]
    for t in np.unique(o_tid):
        mine = np.flatnonzero(o_tid == t)
        order = mine[np.argsort(ts[outer_rows[mine]], kind="stable")]
        o_ts, o_end = ts[outer_rows[order]], end[outer_rows[order]]
        rows = np.flatnonzero(real & (tid == t))
        k = np.searchsorted(o_ts, ts[rows], side="right") - 1
        kk = np.clip(k, 0, None)
        ok = (k >= 0) & (end[rows] <= o_end[kk]) & (rows != outer_rows[order][kk])
        pairs.append(np.stack([rows[ok], order[kk[ok]]], axis=1))
    return np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)


_WIDTH = {"c10::BFloat16": 2, "BFloat16": 2, "c10::Half": 2, "Half": 2, "float": 4, "Float": 4, "double": 8,
          "Double": 8, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}


def saved_bytes(model: TraceModel, rc: Recompute, device_types=None) -> tuple[np.ndarray, str] | tuple[None, str]:
    """Per recompute group (`np.unique(rc.groups)` order): the bytes its recompute kept for the backward,
    and how that was found:

    - "memory events": the `[memory]` events (`profile_memory=True`) inside the group's recomputed ops,
      allocations less frees, on `device_types` (c10 device types; every one when None): the
      activations the recompute made and did not free, which the forward would have kept without it;
    - "shapes": without those events, the inputs the recomputed matmuls, convolutions and attention ops
      save for their backward (their first input; q, k, v and the output for attention), from the
      recorded shapes and dtypes: a lower bound, norms and activation functions save more;
    - (None, "") when neither is in the trace."""
    groups, at = np.unique(rc.groups, return_inverse=True)
    o_ts, o_end = rc.ops["ts"].to_numpy(dtype=float), rc.ops["end"].to_numpy(dtype=float)
    mem = model.memory
    if device_types is not None and len(mem):
        mem = mem[np.isin(mem["device_type"].to_numpy(), list(device_types))]
    if len(mem):
        m_ts, m_bytes = mem["ts"].to_numpy(dtype=float), mem["bytes"].to_numpy(dtype=float)
        order = np.argsort(m_ts, kind="stable")
        m_ts, csum = m_ts[order], np.concatenate([[0.0], np.cumsum(m_bytes[order])])
        net = csum[np.searchsorted(m_ts, o_end, side="right")] - csum[np.searchsorted(m_ts, o_ts, side="left")]
        if np.any(np.searchsorted(m_ts, o_end, side="right") > np.searchsorted(m_ts, o_ts, side="left")):
            return np.maximum(np.bincount(at, weights=net, minlength=len(groups)), 0.0), "memory events"
    cpu = model.cpu
    if "input_dims" not in cpu or not len(rc.rows):
        return None, ""
    rows = rc.rows
    dims = cpu["input_dims"].iloc[rows].astype(str).to_numpy()
    types = cpu["input_type"].iloc[rows].astype(str).to_numpy()
    names = cpu["name"].iloc[rows].astype(str).to_numpy()
    per_row = np.zeros(len(rows))
    for i, (n, d, t) in enumerate(zip(names, dims, types)):
        if len(d) <= 2 or not _SAVES_INPUT.match(n):
            continue
        try:
            shapes = json.loads(d)
        except ValueError:
            continue
        kinds = t.split(",")
        tensors = 3 if "attention" in n else 1
        first = [s for s in shapes[:tensors] if isinstance(s, list) and s and all(isinstance(x, int) for x in s)]
        width = next((_WIDTH[k.strip()] for k in kinds if k.strip() in _WIDTH), 0)
        per_row[i] = width * sum(float(np.prod(s)) for s in first) * (4 / 3 if tensors == 3 else 1)
    if not per_row.any():
        return None, ""
    # each row to its group: the outermost op holding it
    ts, end, tid = (cpu[c].to_numpy() for c in ("ts", "end", "tid"))
    r_ts, r_end, r_tid = ts[rows], end[rows], tid[rows]
    group_of = np.full(len(rows), -1)
    for j, (a, b, t) in enumerate(zip(o_ts, o_end, rc.ops["tid"].to_numpy())):
        group_of[(r_tid == t) & (r_ts >= a) & (r_end <= b)] = at[j]
    ok = group_of >= 0
    # an op counted once: the outermost op with shapes (a linear, not the addmm inside it)
    keep = ok & ~_inside_another(r_ts, r_end, r_tid, per_row > 0)
    return np.bincount(group_of[keep], weights=per_row[keep], minlength=len(groups)), "shapes"


# ops whose backward needs their (first) input, as recorded with shapes: matmuls, convolutions, attention
_SAVES_INPUT = re.compile(r"^aten::(linear|matmul|mm|addmm|bmm|baddbmm|conv\w*|convolution|_convolution|"
                          r"_scaled_dot_product_\w*attention\w*|scaled_dot_product_attention)$")


def _inside_another(ts, end, tid, mask) -> np.ndarray:
    """Per item: whether another item that `mask` picks holds it on its thread."""
    out = np.zeros(len(ts), dtype=bool)
    idx = np.flatnonzero(mask)
    order = idx[np.lexsort((-end[idx], ts[idx], tid[idx]))]
    reach, last_tid = -np.inf, None
    for i in order:
        if tid[i] != last_tid:
            reach, last_tid = -np.inf, tid[i]
        if end[i] <= reach:
            out[i] = True
        else:
            reach = max(reach, end[i])
    return out

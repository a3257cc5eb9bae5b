"""What each precision fix does to the kernels of a step: the model behind `no-tensor-cores`.

A fix changes three things, each from the hardware's own numbers (model/devices.py):

- **The fp32 SIMT matmul kernels run on the matrix units**, each bounded by its roofline
  (measure/efficiency/roofline.py). With the kernel's op shapes recorded (`record_shapes`, or the harness's shape
  probe) it moves from its fp32 roofline to the fix's: a large compute-bound GEMM runs the ratio of the
  peaks faster, a skinny one (M = 8) bound by reading its weight runs the ratio of the operand widths
  faster, a tiny one bound by its launch latency not at all; it keeps the fraction of its attainable
  roofline it reached in fp32, and never beats the new hardware bound. Without shapes its bound is
  unknown: the headline takes it as memory-bound (the operand widths' ratio: bf16 2×, TF32 1×), the top of
  the range as a large compute-bound GEMM (the peak ratio), and the finding says so.
- **Under autocast (bf16/fp16, fp8) the memory-bound kernels around the matmuls move half the bytes**:
  the activations they read and write are 16-bit. Their time × AUTOCAST_MEMORY_FACTOR; not the
  optimizer's kernels (the parameters stay fp32), not kernels already in 16 bits, not communication.
- **Autocast adds casts**: each weight is cast to 16 bits in the forward and its gradient back to fp32,
  12 bytes per weight element per training step (6 for a forward pass) at CAST bandwidth. Weights are
  counted from `aten::linear`'s recorded shapes; without shapes the casts are not counted (and the
  finding says so).
- TF32 changes the matmuls only (same fp32 data, same bytes).

Calibrated on the open H100 pairs (`../shared/traces/h100`, tf32 pair: `tf32-before` fp32 SIMT, `-after`
bf16 autocast, `-after_tf32` TF32 on; an 8-layer 4096-wide MLP, batch 2048):
- LARGE_GEMM_EFFICIENCY: the forward addmm (68.7 GFLOP) took 1336 µs in fp32 SIMT (51.4 TFLOP/s, 77 % of
  66.9), 89.2 µs in bf16 (770, 78 % of 989.4), 170.4 µs in TF32 (403, 81 % of 494.7);
- AUTOCAST_MEMORY_FACTOR 0.6: GELU forward 0.61, GELU backward 0.63, the bias-gradient reduction 0.61 of
  their fp32 time per call under bf16 autocast (the fused AdamW kernel unchanged: 202 µs both);
- CAST_BANDWIDTH_EFFICIENCY 0.6: autocast's two cast kernels moved 1.61 GB per step in 794 µs (2.0 of
  3.35 TB/s).
Assumed, not measured: fp8 reaches bf16's large-GEMM efficiency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import roofline
from .gemm import GEMM_OPS, kernels_by_op, matmul_mkn, parse_dims
from ..basics.spans import annotation_spans, gpu_ops_launched_in
from gpuadvise.analyzer.model.devices import Spec
from gpuadvise.analyzer.model.kernels import SIXTEEN_BIT, is_comm, is_matmul_like
from gpuadvise.analyzer.model.trace import TraceModel, distinct_names, names_in

LARGE_GEMM_EFFICIENCY = roofline.COMPUTE_EFFICIENCY
AUTOCAST_MEMORY_FACTOR = 0.6
CAST_BANDWIDTH_EFFICIENCY = 0.6
MIN_KERNEL_US = roofline.LATENCY_FLOOR_US  # a short kernel is bound by its launch and memory, not its math
OPERAND_BYTES = roofline.OPERAND_BYTES
AUTOCAST = ("bf16", "fp16", "fp8")
_OPTIMIZER_KERNEL = re.compile(r"multi_tensor_apply|fused_adam|FusedAdam|_foreach_|adam|sgd_", re.I)
FP8_LIBRARY = re.compile(r"transformer_engine|torchao|float8|Float8Linear|te_gemm|fp8_autocast", re.I)


@dataclass
class Work:
    """The fp32 SIMT matmul kernels of a trace (one row per kernel), with what the shapes say of them,
    and the kernels autocast would halve."""

    # correlation, ts, dur, flops (NaN: unknown), mkn (batch, M, K, N or None), share (of its op's kernel time), cast_bytes
    matmuls: pd.DataFrame
    memory_bound: pd.DataFrame  # correlation, ts, dur
    trains: bool

    @property
    def simt_us(self) -> float:
        return float(self.matmuls["dur"].sum())

    @property
    def known_share(self) -> float:
        """Share of the SIMT matmul time whose FLOPs the shapes give."""
        known = self.matmuls.loc[self.matmuls["flops"].notna(), "dur"].sum()
        return float(known / self.simt_us) if self.simt_us > 0 else 0.0

    def achieved_tflops(self) -> float | None:
        k = self.matmuls[self.matmuls["flops"].notna()]
        return float(k["flops"].sum() / k["dur"].sum() / 1e6) if len(k) and k["dur"].sum() > 0 else None

    @property
    def cast_bytes(self) -> float:
        return float(self.matmuls["cast_bytes"].sum())


def work(model: TraceModel, launches: pd.DataFrame, simt_names: set[str], trains: bool) -> Work:
    """The kernels named in `simt_names` with their ops' FLOPs and shapes where recorded (`trains`: the
    weights' gradients are cast back too), and the memory-bound kernels around them."""
    k = model.kernels
    simt = k[names_in(k["name"], simt_names)][["name", "correlation", "ts", "dur"]]
    # kernels whose launch the trace holds: the queue left by steps before the window is not replayed
    simt = simt[simt["correlation"].isin(model.runtime["correlation"])]
    joined = kernels_by_op(model)
    joined = joined[names_in(joined["name"], simt_names)][["correlation", "op_external_id"]].drop_duplicates("correlation")
    simt = simt.merge(joined, on="correlation", how="left")
    simt["flops"], simt["mkn"], simt["share"], simt["cast_bytes"] = np.nan, None, 1.0, 0.0
    ops = _shaped_ops(model)
    if len(ops) and simt["op_external_id"].notna().any():
        shares = simt["dur"] / simt.groupby("op_external_id")["dur"].transform("sum")  # an op's FLOPs over its kernels
        by_op = ops.set_index("external_id")
        on = simt["op_external_id"].isin(by_op.index)
        ids = simt.loc[on, "op_external_id"]
        simt.loc[on, "flops"] = by_op.loc[ids, "flops"].to_numpy() * shares[on].to_numpy()
        simt.loc[on, "share"] = shares[on].to_numpy()
        simt.loc[on, "mkn"] = pd.Series(list(by_op.loc[ids, "mkn"]), index=simt.index[on], dtype=object)
        first = on & ~simt.duplicated("op_external_id")  # the weight's casts go with the op's first kernel
        cast_ids = simt.loc[first, "op_external_id"]
        per_elem = 12.0 if trains else 6.0
        simt.loc[first, "cast_bytes"] = by_op.loc[cast_ids, "weight_elems"].to_numpy() * per_elem
    return Work(simt.reset_index(drop=True), _memory_bound(model, launches), trains)


def _shaped_ops(model: TraceModel) -> pd.DataFrame:
    """Matmul ops with recorded shapes: external_id, flops, mkn, weight_elems (the weight a linear
    layer's forward casts under autocast, counted on its inner op)."""
    cpu = model.cpu
    cols = ["external_id", "flops", "mkn", "weight_elems"]
    if cpu.empty:
        return pd.DataFrame(columns=cols)
    ops = cpu[names_in(cpu["name"], GEMM_OPS)][["name", "external_id", "input_dims", "ts", "end", "tid"]]
    ops = ops[ops["input_dims"].astype(str).str.len() > 2]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    keys = list(zip(ops["name"].astype(str), ops["input_dims"].astype(str)))
    parsed = {k: matmul_mkn(k[0], parse_dims(k[1])) for k in set(keys)}  # each distinct (op, shapes) once
    mkn = [parsed[k] for k in keys]
    out = pd.DataFrame({"external_id": ops["external_id"].to_numpy(), "mkn": mkn,
                        "flops": [2.0 * x[0] * x[1] * x[2] * x[3] if x else np.nan for x in mkn],
                        "weight_elems": 0.0})
    # a linear layer's weight is cast once per call; its kernels are launched by the addmm/mm inside it: the
    # next matmul op on its thread, when that one lies within the linear's span
    order = np.lexsort((ops["ts"].to_numpy(dtype=float), ops["tid"].to_numpy()))
    names = ops["name"].astype(str).to_numpy()[order]
    ts, end, tid = (ops[c].to_numpy()[order] for c in ("ts", "end", "tid"))
    linear = names == "aten::linear"
    inner = np.zeros(len(order), dtype=bool)
    inner[:-1] = linear[:-1] & ~linear[1:] & (tid[1:] == tid[:-1]) & (ts[1:] >= ts[:-1]) & (end[1:] <= end[:-1])
    weights = np.array([float(x[2] * x[3]) if x else 0.0 for x in (mkn[i] for i in order)])
    target = np.where(inner, np.arange(len(order)) + 1, np.arange(len(order)))  # the inner op, else the linear
    w = np.zeros(len(order))
    np.add.at(w, target[linear], weights[linear])
    out.loc[order, "weight_elems"] = w
    return out.drop_duplicates("external_id", keep="last")


def _memory_bound(model: TraceModel, launches: pd.DataFrame) -> pd.DataFrame:
    """Kernels autocast would halve: neither matmul nor communication, not the optimizer's, not 16-bit."""
    k = model.kernels
    if k.empty:
        return pd.DataFrame(columns=["correlation", "ts", "dur"])
    names = distinct_names(k["name"])
    keep = {n for n in names if not is_matmul_like(n) and not is_comm(n) and not SIXTEEN_BIT.search(n)
            and not _OPTIMIZER_KERNEL.search(n)}
    out = k[names_in(k["name"], keep)][["correlation", "ts", "dur"]]
    optimizer = gpu_ops_launched_in(model, launches, annotation_spans(model, "Optimizer."))
    if len(optimizer):
        out = out[~out["correlation"].isin(optimizer["correlation"])]
    return out


def fp8_library(model: TraceModel) -> bool:
    """An fp8 training library (Transformer Engine, torchao float8) shows in the trace's ops, frames or kernels."""
    for frame in (model.cpu, model.python, model.kernels):
        if len(frame) and any(FP8_LIBRARY.search(n) for n in distinct_names(frame["name"])[:5000]):
            return True
    return False


def assumed(w: Work, speedup: float) -> pd.Series:
    """Every SIMT matmul kernel `speedup`× faster (never below a launch-bound floor): for a GPU the device
    table does not know."""
    d = w.matmuls["dur"].to_numpy(dtype=float)
    return pd.Series(np.maximum(d / speedup, np.minimum(d, MIN_KERNEL_US)), index=_key(w.matmuls))


def durations(w: Work, spec: Spec, dtype: str, end: str = "conservative") -> pd.Series:
    """New duration (µs) of every kernel the fix changes, by (correlation, start) (`apply` reads it).
    `end` = "conservative" (the headline): kernels with shapes keep their distance from their roofline,
    kernels without are taken as memory-bound (the operand widths' ratio); "optimistic" (the top of the
    range): kernels with shapes reach their new roofline, kernels without gain the peak ratio."""
    m = w.matmuls
    out = pd.Series(kernel_durations(m, spec, dtype, end), index=_key(m))
    if dtype in AUTOCAST:
        if spec.memory_gbps:
            out = out + m["cast_bytes"].to_numpy(dtype=float) / (spec.memory_gbps * CAST_BANDWIDTH_EFFICIENCY * 1e3)
        mb = w.memory_bound
        if len(mb):
            d = mb["dur"].to_numpy(dtype=float)
            out = pd.concat([out, pd.Series(np.maximum(d * AUTOCAST_MEMORY_FACTOR, np.minimum(d, MIN_KERNEL_US)),
                                            index=_key(mb))])
    return out[~out.index.duplicated()]


def kernel_durations(matmuls: pd.DataFrame, spec: Spec, dtype: str, end: str = "conservative") -> np.ndarray:
    """Each fp32 SIMT matmul kernel's duration in `dtype` (µs), bounded by its roofline on `spec`."""
    dur = matmuls["dur"].to_numpy(dtype=float)
    share = matmuls["share"].to_numpy(dtype=float) if "share" in matmuls else np.ones(len(dur))
    peak_s = roofline.peak_speedup(spec, dtype) or 1.0
    blind = peak_s if end == "optimistic" else min(peak_s, roofline.unknown_shape_speedup(dtype))
    # an op split over several kernels: each is bounded as its share of the op
    share = np.where(np.isfinite(share) & (share > 0), share, 1.0)
    new = np.maximum(dur / blind, np.minimum(dur, MIN_KERNEL_US))  # without a shape (or a peak for it)
    shapes: dict = {}  # each distinct shape's kernels, worked out together
    for i, mkn in enumerate(matmuls["mkn"]):
        if isinstance(mkn, (tuple, list)) and mkn:
            shapes.setdefault(tuple(mkn), []).append(i)
    for mkn, rows in shapes.items():
        law = roofline.shape_law(mkn, spec, dtype, optimistic=end == "optimistic")
        if law is not None:
            rows = np.array(rows)
            new[rows] = roofline.apply_law(dur[rows] / share[rows], *law) * share[rows]
    return np.minimum(dur, new)


def limits(w: Work, spec: Spec, dtype: str) -> dict:
    """What bounds the SIMT matmul time with known shapes once in `dtype`: the share of that time (%) whose
    kernels are compute-, memory- or latency-bound, and the speed-up of that time, its bound's and the
    peak ratio's."""
    m = w.matmuls
    known = m[[isinstance(x, (tuple, list)) for x in m["mkn"]]]
    out = {"compute": 0.0, "memory": 0.0, "latency": 0.0}
    if known.empty:
        return {"limited_by_pct": out, "speedup": None, "peak_speedup": roofline.peak_speedup(spec, dtype)}
    total = float(known["dur"].sum())
    for d, mkn in zip(known["dur"].to_numpy(dtype=float), known["mkn"]):
        b = roofline.attainable(tuple(mkn), spec, dtype)
        if b is not None:
            out[b.limiter] += d
    new = kernel_durations(known, spec, dtype).sum()
    peak = roofline.peak_speedup(spec, dtype)
    return {"limited_by_pct": {k: round(100 * v / total, 1) for k, v in out.items()},
            "speedup": round(total / new, 1) if new > 0 else None, "peak_speedup": round(peak, 1) if peak else None}


def _key(frame: pd.DataFrame) -> pd.MultiIndex:
    """One GPU op: its launch's correlation id and its start (a CUDA graph's kernels share one correlation)."""
    return pd.MultiIndex.from_arrays([frame["correlation"].to_numpy(), frame["ts"].to_numpy(dtype=float)])


def apply(durations_by_op: pd.Series, ops: pd.DataFrame) -> np.ndarray:
    """The new durations for a replay's GPU ops (NaN: unchanged)."""
    return durations_by_op.reindex(_key(ops)).to_numpy(dtype=float)

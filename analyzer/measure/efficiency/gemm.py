"""Matrix-multiply ops with the shapes `record_shapes=True` recorded: their FLOPs, their alignment, and
the GPU time of the kernels each one launched (the kernel ↔ op join goes through the runtime call's
External id, which names the innermost op that launched it: aten::mm/addmm, not the aten::linear
around them).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..compiled.cudagraphs import captured

from gpuadvise.analyzer.model.trace import TraceModel, names_in

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
HALF_TYPES = ("Half", "BFloat16", "half", "bfloat16")


def parse_dims(text: str) -> list:
    try:
        dims = json.loads(text)
    except (ValueError, TypeError):
        return []
    return dims if isinstance(dims, list) else []


def _shape(x) -> list[int] | None:
    return x if isinstance(x, list) and x and all(isinstance(d, int) and not isinstance(d, bool) for d in x) else None


def matmul_mkn(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of one op from its input shapes; None when the shapes do not say. aten::matmul
    follows torch.matmul: a 1-D operand is a row (or column) vector, and batch dimensions broadcast."""
    shapes = [_shape(d) for d in dims]
    if name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation"):
        shapes = shapes[1:]  # the bias / input added to the product comes first
    a = shapes[0] if shapes else None
    b = shapes[1] if len(shapes) > 1 else None
    if name == "aten::matmul" and a is not None and b is not None:
        return _matmul_mkn(a, b)
    if a is None or b is None or len(a) < 2:
        return None
    if name in ("aten::bmm", "aten::baddbmm") and len(a) == 3 and len(b) == 3:
        return a[0], a[1], a[2], b[2]
    m = int(np.prod(a[:-1]))  # leading dims fold into M (a 3-D input to linear/matmul)
    return 1, m, a[-1], (b[0] if name == "aten::linear" else b[-1])  # linear's weight is [out, in]


def _matmul_mkn(a: list[int], b: list[int]) -> tuple[int, int, int, int] | None:
    if len(b) < 3:  # a matrix (or vector) on the right: every leading dim of `a` folds into M
        m = int(np.prod(a[:-1])) if len(a) > 1 else 1
        return 1, m, a[-1], (b[-1] if len(b) == 2 else 1)
    m = a[-2] if len(a) > 1 else 1
    lead_a, lead_b = a[:-2], b[:-2]
    width = max(len(lead_a), len(lead_b))
    lead_a, lead_b = [1] * (width - len(lead_a)) + lead_a, [1] * (width - len(lead_b)) + lead_b
    if any(x != y and 1 not in (x, y) for x, y in zip(lead_a, lead_b)):
        return None
    return int(np.prod([max(x, y) for x, y in zip(lead_a, lead_b)])), m, a[-1], b[-1]


def matmul_flops(name: str, dims: list) -> float:
    """2·M·K·N (times the batch) for one op from its input shapes; NaN when the shapes do not say."""
    mkn = matmul_mkn(name, dims)
    if mkn is None:
        return float("nan")
    batch, m, k, n = mkn
    return 2.0 * batch * m * k * n


def misaligned(dims: list, multiple: int = 8) -> list[int]:
    """The last-two dimensions of any input that are not multiples of `multiple`."""
    bad = []
    for shape in dims:
        s = _shape(shape)
        if s is not None and len(s) >= 2:
            bad += [d for d in s[-2:] if d % multiple]
    return bad


def gemm_ops(model: TraceModel) -> pd.DataFrame:
    """One row per matmul op with recorded shapes: name, external_id, dims (text), half (16-bit inputs),
    flops, odd (misaligned dimensions), kernel_us (the GPU time of the kernels it launched itself)."""
    cols = ["name", "external_id", "dims", "half", "flops", "odd", "kernel_us"]
    cpu = model.cpu
    if cpu.empty:
        return pd.DataFrame(columns=cols)
    ops = cpu[names_in(cpu["name"], GEMM_OPS)]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    out = pd.DataFrame({"name": ops["name"].astype(str).to_numpy(), "external_id": ops["external_id"].to_numpy(),
                        "dims": ops["input_dims"].astype(str).to_numpy(),
                        "half": ops["input_type"].astype(str).str.contains("|".join(HALF_TYPES)).to_numpy()})
    # parse each distinct (op, shapes) once
    keys = out[["name", "dims"]].drop_duplicates()
    parsed = [parse_dims(d) for d in keys["dims"]]
    keys = keys.assign(flops=[matmul_flops(n, p) for n, p in zip(keys["name"], parsed)],
                       odd=[misaligned(p) for p in parsed])
    out = out.merge(keys, on=["name", "dims"], how="left")
    k = kernels_by_op(model)
    out["kernel_us"] = out["external_id"].map(k.groupby("op_external_id")["dur"].sum()).fillna(0.0).to_numpy()
    return out[cols]


def kernels_by_op(model: TraceModel) -> pd.DataFrame:
    """Kernels with the External id of the op whose runtime call launched them (`op_external_id`); a kernel
    a CUDA graph ran, the op captured into the graph where the trace holds the capture (measure/compiled/cudagraphs.py)."""
    k = model.kernels
    rt = model.runtime[["correlation", "external_id"]].drop_duplicates("correlation")
    rt = rt[rt["correlation"] >= 0].rename(columns={"external_id": "op_external_id"})
    graphed = captured(model).calls
    if len(graphed):  # such a kernel's launch is its captured one
        k = k.assign(correlation=k["correlation"].where(~k.index.isin(graphed.index),
                                                         graphed["correlation"].reindex(k.index)).astype(np.int64))
    return k.merge(rt, on="correlation", how="inner")

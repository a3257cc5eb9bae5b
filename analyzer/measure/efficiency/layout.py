"""Tensor-layout conversions around convolutions: the kernels cuDNN and MIOpen run to turn an NCHW tensor
into the NHWC layout their fastest convolution kernels want, and back.

cuDNN names them `nchwToNhwcKernel` / `nhwcToNchwKernel` (cuDNN 8/9, also under
`cudnn::engines_precompiled::`) and `convertTensor_kernel`; MIOpen's NHWC solvers run
`batched_transpose_<tile>_<type>` and `general_4d_reorder_<tile>_…` kernels, and older releases
`transpose_NCHW2NHWC` / `transpose_NHWC2NCHW`. A kernel counts as a conversion only when a convolution op
launched it (its External id, or its launch call's, is a convolution op's): other libraries' transposes
(`cuda::batched_transpose<…>` in a transformer) are not the convolution's layout. A trace without CPU
ops (GPU-only) cannot attribute; there only the names no other library uses count.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.kernels import head
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

CONVERSION = re.compile(
    r"nchwToNhwc|nhwcToNchw|convertTensor_kernel|transpose_NCHW2NHWC|transpose_NHWC2NCHW|"
    r"^batched_transpose_\d+x\d+_|^general_4d_reorder_\d+x\d+_")
# names only cuDNN/MIOpen use: counted in a trace that cannot attribute kernels to ops
LIBRARY_ONLY = re.compile(r"nchwToNhwc|nhwcToNchw|transpose_NCHW2NHWC|transpose_NHWC2NCHW|"
                          r"^batched_transpose_\d+x\d+_|^general_4d_reorder_\d+x\d+_")
NCHW_TO_NHWC = re.compile(r"nchwToNhwc|NCHW2NHWC", re.I)
NHWC_TO_NCHW = re.compile(r"nhwcToNchw|NHWC2NCHW", re.I)


def is_conv_op(name: str) -> bool:
    """A convolution op or its backward (`aten::cudnn_convolution`, `aten::convolution_backward`,
    `aten::miopen_convolution`, `CudnnConvolutionBackward0` …)."""
    return "convolution" in name.lower() or name.startswith("aten::conv")


def _conv_ops(model: TraceModel) -> pd.DataFrame:
    cpu = model.cpu
    if not len(cpu):
        return cpu
    return cpu[name_mask(cpu["name"], is_conv_op) & (cpu["external_id"] > 0)]


def _launching_ext(model: TraceModel, k: pd.DataFrame) -> np.ndarray:
    """Each kernel's External id, else its launch call's."""
    ext = k["external_id"].to_numpy()
    missing = ext <= 0
    rt = model.runtime
    if missing.any() and len(rt):
        calls = rt[rt["correlation"] > 0].drop_duplicates("correlation")
        by_corr = pd.Series(calls["external_id"].to_numpy(), index=calls["correlation"].to_numpy())
        found = pd.Series(k["correlation"].to_numpy()[missing]).map(by_corr).fillna(-1).to_numpy()
        ext = ext.copy()
        ext[missing] = found.astype(ext.dtype)
    return ext


def conv_kernels(model: TraceModel) -> pd.DataFrame:
    """Kernels a convolution op launched, conversions left out."""
    k = model.kernels
    ops = _conv_ops(model)
    if not len(k) or not len(ops):
        return k.iloc[0:0]
    inside = np.isin(_launching_ext(model, k), ops["external_id"].to_numpy())
    conv = k[inside]
    return conv[~name_mask(conv["name"], lambda n: bool(CONVERSION.search(head(n))))]


def has_conversion_kernels(model: TraceModel) -> bool:
    """Any kernel named like a layout conversion, whoever launched it (a cheap check by name)."""
    k = model.kernels
    return bool(len(k)) and bool(name_mask(k["name"], lambda n: bool(CONVERSION.search(head(n)))).any())


def conversions(model: TraceModel) -> pd.DataFrame:
    """The layout-conversion kernels convolutions launched, with the op that launched each (`op`, `op_dims`:
    its input shapes, "" when not recorded); in a trace that links no kernel to an op, the kernels whose
    names only cuDNN/MIOpen use (`op` "")."""
    k = model.kernels
    if not len(k):
        return k.assign(op=pd.Series(dtype=str), op_dims=pd.Series(dtype=str))
    named = k[name_mask(k["name"], lambda n: bool(CONVERSION.search(head(n))))]
    if not len(named):
        return named.assign(op=pd.Series(dtype=str), op_dims=pd.Series(dtype=str))
    ops = _conv_ops(model)
    linked = (k["external_id"] > 0).any() or (len(model.runtime) and (model.runtime["external_id"] > 0).any())
    if not linked:
        out = named[name_mask(named["name"], lambda n: bool(LIBRARY_ONLY.search(head(n))))]
        return out.assign(op="", op_dims="")
    ext = _launching_ext(model, named)
    first = ops.drop_duplicates("external_id").set_index("external_id") if len(ops) else None
    keep = np.isin(ext, ops["external_id"].to_numpy()) if len(ops) else np.zeros(len(named), bool)
    out = named[keep]
    ext = ext[keep]
    if first is None or not len(out):
        return out.assign(op=pd.Series(dtype=str), op_dims=pd.Series(dtype=str))
    return out.assign(op=first["name"].astype(str).reindex(ext).to_numpy(),
                      op_dims=first["input_dims"].astype(str).reindex(ext).to_numpy())


def direction(name: str) -> str:
    """"NCHW→NHWC", "NHWC→NCHW" or "layout conversion" (a name that does not say)."""
    n = head(name)
    if NCHW_TO_NHWC.search(n):
        return "NCHW→NHWC"
    if NHWC_TO_NCHW.search(n):
        return "NHWC→NCHW"
    return "layout conversion"


# Batch norm on NCHW tensors. With the activations in channels_last, cuDNN runs batch norm as its
# semi-persistent NHWC kernels (`batchnorm_fwtr_nhwc_semiPersist`, `batchnorm_bwtr_nhwc_semiPersist`),
# which keep a tile's statistics on chip: the forward pass reads the activation once and writes it once
# (the NCHW kernels read it twice: statistics, then normalisation), the backward reads the activation and
# its gradient once and writes the input gradient (the NCHW kernels read both twice). Both are
# memory-bound, so the NHWC kernel's time is the NCHW kernel's × the ratio of the passes over memory.
BN_FORWARD_PASSES = 2 / 3  # (read + write) / (read + read + write)
BN_BACKWARD_PASSES = 3 / 5  # (read x, read dy, write dx) / (x, dy twice, dx)


def is_batch_norm_op(name: str) -> bool:
    """A batch-norm op that launches kernels (`aten::cudnn_batch_norm`, `aten::native_batch_norm`,
    their `_backward`s, `aten::miopen_batch_norm` …)."""
    return "batch_norm" in name.lower()


def batch_norm_kernels(model: TraceModel) -> pd.DataFrame:
    """The kernels batch-norm ops launched on NCHW tensors (names without `nhwc`), with `backward` (bool:
    launched by a backward op) and `passes` (the NHWC kernel's time as a share of this one's)."""
    k = model.kernels
    cpu = model.cpu
    empty = k.iloc[0:0].assign(backward=pd.Series(dtype=bool), passes=pd.Series(dtype=float))
    if not len(k) or not len(cpu):
        return empty
    ops = cpu[name_mask(cpu["name"], is_batch_norm_op) & (cpu["external_id"] > 0)]
    if not len(ops):
        return empty
    ext = _launching_ext(model, k)
    keep = np.isin(ext, ops["external_id"].to_numpy())
    keep &= ~np.asarray(name_mask(k["name"], lambda n: "nhwc" in head(n).lower()), bool)
    out, ext = k[keep], ext[keep]
    if not len(out):
        return empty
    names = ops.drop_duplicates("external_id").set_index("external_id")["name"].astype(str)
    backward = names.reindex(ext).str.contains("backward", case=False).fillna(False).to_numpy(bool)
    return out.assign(backward=backward, passes=np.where(backward, BN_BACKWARD_PASSES, BN_FORWARD_PASSES))

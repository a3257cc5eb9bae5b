"""The FLOPs of the ops a trace recorded with their shapes (`record_shapes=True`, or `gpuadvise profile`'s
shapes probe), and the GPU kernels each one launched.

**The formulas** are PyTorch's own (torch.utils.flop_counter, `FlopCounterMode`: 2 FLOPs per
multiply-add, elementwise work not counted), one function per op family:

- `matmul_flops`: 2·M·K·N per product (mm, addmm, bmm, baddbmm, matmul, linear, _scaled_mm); einsum's
  equation is not recorded, so it is counted on the bmm/mm it calls.
- `conv_flops`: 2 · batch · output positions · C_out · C_in/groups · kernel size for the forward (the
  input positions of a transposed convolution), the output shape worked out from the input, the stride,
  padding and dilation; `conv_backward_flops`: the same again for each gradient it computes (input and
  weight, `output_mask`). FlopCounterMode counts a grouped convolution's weight gradient `groups` times
  too many (it leaves the groups out); here it is counted once.
- `attention_flops` (forward: QKᵀ and PV, 2·B·H·Sq·Sk·(Dqk + Dv)) and `attention_backward_flops` (the
  scores recomputed, then dV, dP, dQ and dK: 2·B·H·Sq·Sk·(3·Dqk + 2·Dv)), H the query's heads (grouped-
  query attention broadcasts K and V). The fused kernels keep no scores from the forward, so their
  backward computes QKᵀ again: FlopCounterMode counts it, and so do hardware FLOPs; model FLOPs leave it
  out (`OpCount.recomputed`), which makes a transformer's model FLOPs 6·N per token for its weights plus
  12·L·H·Q·T for its attention, as PaLM's appendix B counts them. **Causal masking is counted as the kernels run it**: the fused
  kernels (flash, memory-efficient, cuDNN, CPU flash, flash-attn) skip the masked entries, so a causal
  call counts only the unmasked part of the Sq × Sk scores (`causal_fraction`: about half, (S+1)/2S for a
  square mask); FlopCounterMode, and the 6·N + 12·L·H·Q·T estimate nanoGPT prints its MFU with, count
  it whole (`OpCount.whole`). SDPA's math backend computes the whole product and masks it afterwards: its
  bmm ops are counted whole, as it ran. FlopCounterMode does not count the CPU flash kernel
  (`_scaled_dot_product_flash_attention_for_cpu`) at all; here it gets the same formula as the others.
  A nested (variable-length) call records packed [total, H, D] inputs without the sequence lengths: not
  counted.

**Each FLOP is counted once, at the innermost op that has a formula and recorded shapes** (`counted_ops`):
aten::linear calls aten::addmm (or matmul → mm), SDPA's math path calls matmul → bmm, the SDPA ops call
the kernels' own ops (`_flash_attention_forward`), conv2d → convolution → _convolution → cudnn_convolution:
the innermost op is the one whose kernels did the work and whose input dtypes are the ones the kernels ran
in (under autocast, `aten::linear` still records fp32 inputs; its mm records bf16). An outer op with a
formula is counted only where nothing inside it could be (its inner ops recorded no shapes).

**The kernels**: an op's kernels are those its runtime calls launched, its own and its inner ops'
(`op_kernels`: correlation id → runtime call → the counted op whose span holds it, on its thread). An op's
FLOPs are shared among its matrix kernels by their time (a cuDNN attention backward launches three
kernels, one of which does the math), so a step's FLOPs and the time their kernels took come from the
same kernels, and fall in the steps those kernels ran in.

Each counted op also carries its pass (measure/efficiency/passes.py: forward, backward, or a forward recomputed in
the backward) and the dtype its inputs had.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from . import gemm
from .passes import BACKWARD, NAMES as PASS_NAMES, passes
from gpuadvise.analyzer.model.flopops import SIGNATURES, Signature
from gpuadvise.analyzer.model.kernels import is_matmul_like
from gpuadvise.analyzer.model.trace import TraceModel, names_in

FAMILIES = ("matmul", "conv", "attention")
FAMILY_WORDS = {"matmul": "matmuls", "conv": "convolutions", "attention": "attention"}
# the profiler's dtype names → the device table's
DTYPES = {"c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16", "float": "fp32",
          "Float": "fp32", "double": "fp64", "Double": "fp64", "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
          "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}
COLUMNS = ["row", "name", "family", "backward", "pass", "flops", "whole", "recomputed", "causal", "dtype", "ts", "end",
           "tid", "external_id"]


class OpCount(tuple):
    """An op's FLOPs as its kernels ran them; `whole`: the same with causal attention counted whole, as
    FlopCounterMode counts it (the same as `flops` for every other op); `causal` True/False for attention
    (None: the trace does not say), None for other ops; `recomputed`: the part of `flops` that redoes
    forward work (a fused attention backward computes the scores QKᵀ again), hardware FLOPs but not model
    FLOPs."""

    __slots__ = ()

    def __new__(cls, flops: float, whole: float | None = None, causal: bool | None = None, recomputed: float = 0.0):
        return super().__new__(cls, (float(flops), float(flops if whole is None else whole), causal, float(recomputed)))

    flops = property(lambda self: self[0])
    whole = property(lambda self: self[1])
    causal = property(lambda self: self[2])
    recomputed = property(lambda self: self[3])


UNKNOWN = OpCount(math.nan)


# -- the formulas ---------------------------------------------------------------------------------------


def matmul_flops(name: str, dims: list) -> float:
    """2·M·K·N (times the batch) of a matmul-family op from its input shapes; NaN when they do not say."""
    return gemm.matmul_flops(name, dims)


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    """One spatial dimension of a convolution's output (PyTorch's Conv docs)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def conv_flops(x: list[int], w: list[int], out_spatial: list[int] | None = None, transposed: bool = False,
               stride=None, padding=None, dilation=None) -> float:
    """2 · batch · positions · C_out · C_in/groups · kernel size: `w` is [C_out, C_in/groups, k…] ([C_in,
    C_out/groups, k…] transposed), so its first two dims multiply to the channel pairs either way. The
    positions are the output's (`out_spatial`, or worked out from stride/padding/dilation), the input's
    for a transposed convolution."""
    if len(x) < 3 or len(w) != len(x):
        return math.nan
    kernel = w[2:]
    if transposed:
        positions = x[2:]
    elif out_spatial is not None:
        positions = out_spatial
    else:
        nd = len(kernel)
        s, p, d = (_expand(v, nd, default) for v, default in ((stride, 1), (padding, 0), (dilation, 1)))
        if s is None or p is None or d is None:
            return math.nan
        positions = [conv_output_size(n, k, si, pi, di) for n, k, si, pi, di in zip(x[2:], kernel, s, p, d)]
    if any(n <= 0 for n in positions):
        return math.nan
    return 2.0 * x[0] * math.prod(positions) * w[0] * w[1] * math.prod(kernel)


def conv_backward_flops(grad_out: list[int], x: list[int], w: list[int], transposed: bool, groups: int = 1,
                        output_mask=(True, True, False)) -> float:
    """The gradients `output_mask` asks for: the input's (a transposed convolution of grad_output with the
    weight) and the weight's (a convolution of the input with grad_output) each cost the forward's FLOPs;
    the bias gradient is a sum (not counted). `groups` is unused by the count (module docstring)."""
    if len(grad_out) != len(x) or len(x) < 3:
        return math.nan
    forward = conv_flops(x, w, out_spatial=None if transposed else grad_out[2:], transposed=transposed)
    wanted = int(bool(output_mask[0])) + int(bool(output_mask[1])) if len(output_mask) >= 2 else 2
    return forward * wanted


def causal_fraction(s_q: int, s_k: int, bottom_right: bool = False) -> float:
    """The share of the Sq × Sk scores a causal mask leaves: PyTorch aligns it at the top left (query i sees
    keys 0…i), the flash-attn library at the bottom right (the last query sees every key)."""
    if s_q <= 0 or s_k <= 0:
        return 1.0
    offset = (s_k - s_q) if bottom_right else 0
    seen = np.clip(np.arange(s_q, dtype=np.int64) + 1 + offset, 0, s_k).sum()
    return float(seen) / (s_q * s_k)


def attention_flops(q: list[int], k: list[int], v: list[int], causal: bool | None = False,
                    bottom_right: bool = False) -> OpCount:
    """QKᵀ and PV of one attention call, [B, H, S, D] shapes (module docstring)."""
    shape = _bhsd(q, k, v)
    if shape is None:
        return UNKNOWN
    b, h, s_q, s_k, d_qk, d_v = shape
    whole = 2.0 * b * h * s_q * s_k * (d_qk + d_v)
    return OpCount(whole * (causal_fraction(s_q, s_k, bottom_right) if causal else 1.0), whole, causal)


def attention_backward_flops(q: list[int], k: list[int], v: list[int], causal: bool | None = False,
                             bottom_right: bool = False) -> OpCount:
    """The scores recomputed (`recomputed`), dV, dP, dQ and dK of one attention call, [B, H, S, D] shapes."""
    shape = _bhsd(q, k, v)
    if shape is None:
        return UNKNOWN
    b, h, s_q, s_k, d_qk, d_v = shape
    whole = 2.0 * b * h * s_q * s_k * (3 * d_qk + 2 * d_v)
    share = causal_fraction(s_q, s_k, bottom_right) if causal else 1.0
    return OpCount(whole * share, whole, causal, recomputed=2.0 * b * h * s_q * s_k * d_qk * share)


def _bhsd(q, k, v):
    if not (q and k and v and len(q) == len(k) == len(v) == 4):
        return None
    b, h, s_q, d_qk = q
    if k[0] != b or v[0] != b or k[3] != d_qk or v[2] != k[2] or k[1] <= 0 or h % k[1]:
        return None
    return b, h, s_q, k[2], d_qk, v[3]


def _expand(value, nd: int, default: int):
    """A conv argument as one int per spatial dim: an int list, one int, 'valid'/'same' padding."""
    if value is None:
        return [default] * nd
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * nd
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return value * nd if len(value) == 1 else value if len(value) == nd else None
    return None


# -- one op from its recorded arguments -------------------------------------------------------------------


def op_flops(name: str, dims: list, concrete: list | None = None) -> OpCount:
    """The FLOPs of one op from its recorded input shapes and scalar arguments (`Concrete Inputs`);
    UNKNOWN (NaN) where the op has no formula or its shapes do not say."""
    sig = SIGNATURES.get(name)
    if sig is None or not dims:
        return UNKNOWN
    concrete = concrete or []
    if sig.family == "matmul":
        return OpCount(matmul_flops(name, dims)) if sig.tensors else UNKNOWN
    if sig.family == "conv":
        return OpCount(_conv(sig, dims, concrete))
    return _attention(sig, dims, concrete)


def _conv(sig: Signature, dims: list, concrete: list) -> float:
    tensors = [_shape(dims[i]) if i < len(dims) else None for i in sig.tensors]
    if any(t is None for t in tensors):
        return math.nan
    transposed = sig.transposed if isinstance(sig.transposed, bool) else _flag(concrete, sig.transposed)
    if transposed is None:
        return math.nan
    if sig.backward:
        grad_out, x, w = tensors
        mask = _value(concrete, sig.output_mask)
        mask = mask if isinstance(mask, list) and len(mask) >= 2 else [True, True]
        return conv_backward_flops(grad_out, x, w, transposed, output_mask=[bool(m) for m in mask])
    x, w = tensors
    if transposed:
        return conv_flops(x, w, transposed=True)
    # an argument the op has but the trace did not record (a PyTorch too old to record Concrete Inputs):
    # the output's size is unknown, never the default's
    args = {k: _value(concrete, getattr(sig, k)) for k in ("stride", "padding", "dilation")}
    if any(getattr(sig, k) is not None and v is None for k, v in args.items()):
        return math.nan
    padding = args["padding"]
    if isinstance(padding, str):  # conv2d(padding="same" / "valid")
        if padding == "same":
            return conv_flops(x, w, out_spatial=x[2:])
        padding = 0 if padding == "valid" else None
        if padding is None:
            return math.nan
    return conv_flops(x, w, stride=args["stride"], padding=padding, dilation=args["dilation"])


def _attention(sig: Signature, dims: list, concrete: list) -> OpCount:
    first = sig.grad_out + 1 if sig.backward else 0
    qkv = [_shape(dims[i]) if i < len(dims) else None for i in range(first, first + 3)]
    if any(t is None for t in qkv):
        return UNKNOWN
    if sig.layout == "bshd":
        qkv = [[t[0], t[2], t[1], t[3]] if len(t) == 4 else t for t in qkv]
    raw = _value(concrete, sig.causal)
    if sig.mask_type:
        causal = None if not isinstance(raw, int) or isinstance(raw, bool) else raw in (1, 2)
        bottom_right = raw == 2
    else:
        causal = raw if isinstance(raw, bool) else None
        bottom_right = sig.bottom_right
    formula = attention_backward_flops if sig.backward else attention_flops
    return formula(*qkv, causal=causal, bottom_right=bottom_right)


def _shape(x):
    return x if isinstance(x, list) and x and all(isinstance(d, int) and not isinstance(d, bool) for d in x) else None


def _value(concrete: list, i: int | None):
    """One scalar argument from `Concrete Inputs`: an int, a float, a bool, an int list, or the text."""
    if i is None or i >= len(concrete):
        return None
    text = concrete[i]
    if not isinstance(text, str) or not text:
        return None
    if text in ("True", "False"):
        return text == "True"
    try:  # int lists; a bool list is written the Python way ("[False, True, True]")
        return json.loads(text.replace("True", "true").replace("False", "false") if text[0] == "[" else text)
    except ValueError:
        return text


def _flag(concrete: list, i) -> bool | None:
    v = _value(concrete, i)
    return v if isinstance(v, bool) else None


def parse_list(text: str) -> list:
    """A recorded JSON list (`Input Dims`, `Concrete Inputs`), or [] when it is not one."""
    return gemm.parse_dims(text)


def dtype_of(input_type: str, sig: Signature | None) -> str | None:
    """The dtype an op ran in, from its recorded input types (the first tensor's that has one)."""
    kinds = input_type.split(",") if input_type else []
    picks = [kinds[i] for i in (sig.tensors if sig is not None and sig.tensors else range(len(kinds)))
             if i < len(kinds)] + kinds
    for kind in picks:
        if kind.strip() in DTYPES:
            return DTYPES[kind.strip()]
    return None


# -- the ops of a trace -----------------------------------------------------------------------------------


def counted_ops(model: TraceModel) -> pd.DataFrame:
    """One row per op whose FLOPs are counted (module docstring): `row` (its position in `model.cpu`), name,
    family, backward (a gradient op: conv/attention backward, or any op of the backward pass), pass
    ("forward", "backward", "recompute"), flops, whole (causal attention counted whole), recomputed (the part of
    flops that redoes forward work: a fused attention backward's scores), causal, dtype
    ("bf16", "fp16", "fp32", "fp8", "fp64"; None when not recorded), ts, end, tid, external_id. Worked out
    once per model."""
    return model.per_cpu_frame("counted_ops", _counted_ops)


def _counted_ops(model: TraceModel) -> pd.DataFrame:
    cpu = model.cpu
    if cpu.empty or "input_dims" not in cpu:
        return pd.DataFrame(columns=COLUMNS)
    rows = np.flatnonzero(names_in(cpu["name"], SIGNATURES))
    if not rows.size:
        return pd.DataFrame(columns=COLUMNS)
    ops = cpu.iloc[rows]
    concrete_col = ops["input_concrete"] if "input_concrete" in ops else pd.Series("", index=ops.index)
    names = ops["name"].astype(str).to_numpy()
    dims = ops["input_dims"].astype(str).to_numpy()
    concrete = concrete_col.astype(str).to_numpy()
    types = ops["input_type"].astype(str).to_numpy()
    counts: dict = {}  # each distinct (op, shapes, scalars) once
    found = [counts.get(key) or counts.setdefault(key, op_flops(key[0], parse_list(key[1]), parse_list(key[2])))
             for key in zip(names, dims, concrete)]
    flops = np.array([c.flops for c in found])
    resolved = np.isfinite(flops)
    if not resolved.any():
        return pd.DataFrame(columns=COLUMNS)
    ts, end, tid = (ops[c].to_numpy() for c in ("ts", "end", "tid"))
    counted = resolved & ~_has_inner(ts, end, tid, resolved)
    pick = np.flatnonzero(counted)
    of = passes(model).of[rows[pick]]
    sigs = [SIGNATURES[n] for n in names[pick]]
    out = pd.DataFrame({
        "row": rows[pick],
        "name": names[pick],
        "family": [s.family for s in sigs],
        "backward": np.array([s.backward for s in sigs], dtype=bool) | (of == BACKWARD),
        "pass": np.asarray(PASS_NAMES, dtype=object)[of],
        "flops": flops[pick],
        "whole": np.array([found[i].whole for i in pick]),
        "recomputed": np.array([found[i].recomputed for i in pick]),
        "causal": [found[i].causal for i in pick],
        "dtype": [dtype_of(t, s) for t, s in zip(types[pick], sigs)],
        "ts": ts[pick], "end": end[pick], "tid": tid[pick],
        "external_id": ops["external_id"].to_numpy()[pick],
    })
    return out


def _has_inner(ts, end, tid, resolved) -> np.ndarray:
    """Whether another resolved op lies inside each op, on its thread. Ops on a thread nest, so among the
    resolved ops in (thread, start, longest first) order, one holds another iff the next one lies inside it."""
    idx = np.flatnonzero(resolved)
    order = idx[np.lexsort((-end[idx], ts[idx], tid[idx]))]
    inner = np.zeros(len(ts), dtype=bool)
    if order.size > 1:
        a, b = order[:-1], order[1:]
        inner[a] = (tid[b] == tid[a]) & (ts[b] >= ts[a]) & (end[b] <= end[a])
    return inner


def op_kernels(model: TraceModel, ops: pd.DataFrame | None = None) -> pd.DataFrame:
    """The kernels the counted ops launched (module docstring): one row per kernel with `op` (the op's
    index in `ops`), `correlation`, `name`, `device`, `ts`, `dur`, and `flops`, the op's FLOPs shared among
    its matrix kernels by their time (among all its kernels when none is a matrix kernel)."""
    ops = counted_ops(model) if ops is None else ops
    cols = ["op", "correlation", "name", "device", "ts", "dur", "flops"]
    k = model.kernels
    if ops.empty or k.empty or model.runtime.empty:
        return pd.DataFrame(columns=cols)
    calls = model.runtime[["correlation", "tid", "ts"]]
    calls = calls[calls["correlation"] >= 0].drop_duplicates("correlation").rename(columns={"ts": "call_ts"})
    k = k[["correlation", "name", "device", "ts", "dur"]].merge(calls, on="correlation", how="inner")
    if k.empty:
        return pd.DataFrame(columns=cols)
    op_of = np.full(len(k), -1, dtype=np.int64)
    call_ts, call_tid = k["call_ts"].to_numpy(dtype=float), k["tid"].to_numpy()
    o_ts, o_end, o_tid = (ops[c].to_numpy() for c in ("ts", "end", "tid"))
    for t in np.unique(o_tid):
        mine = np.flatnonzero(o_tid == t)
        mine = mine[np.argsort(o_ts[mine], kind="stable")]
        on = np.flatnonzero(call_tid == t)
        if not on.size:
            continue
        j = np.searchsorted(o_ts[mine], call_ts[on], side="right") - 1
        ok = (j >= 0) & (call_ts[on] <= o_end[mine[np.clip(j, 0, None)]])
        op_of[on[ok]] = mine[j[ok]]
    k = k.assign(op=op_of)[op_of >= 0].drop(columns=["call_ts", "tid"])
    if k.empty:
        return pd.DataFrame(columns=cols)
    matrix = np.fromiter((is_matmul_like(str(n)) for n in k["name"]), dtype=bool, count=len(k))
    has_matrix = pd.Series(matrix).groupby(k["op"].to_numpy()).transform("any").to_numpy()
    weight = k["dur"].to_numpy(dtype=float) * np.where(has_matrix, matrix, True)
    weight = np.where(weight > 0, weight, np.where(has_matrix, matrix, True) * 1e-9)  # zero-length kernels
    total = pd.Series(weight).groupby(k["op"].to_numpy()).transform("sum").to_numpy()
    k["flops"] = ops["flops"].to_numpy()[k["op"].to_numpy()] * weight / total
    return k[cols].reset_index(drop=True)

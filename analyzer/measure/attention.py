"""How attention ran: every attention call of a trace's forward, the path it took and the kernels it
launched, forward and backward.

The paths, by the ops and kernels the trace records:

- **fused** `scaled_dot_product_attention` backends: flash (`aten::_scaled_dot_product_flash_attention`,
  kernels `flash_fwd_kernel`, `pytorch_flash::flash_fwd…`), memory-efficient
  (`_scaled_dot_product_efficient_attention`, `fmha_cutlassF…`), cuDNN (`_scaled_dot_product_cudnn_attention`,
  `cudnn_generated_fort_native_sdpa…`), the CPU's flash (`_scaled_dot_product_flash_attention_for_cpu`),
  a device's own (`_scaled_dot_product_fused_attention_overrideable`), and the flash-attn library
  (`flash_attn::_flash_attn_forward`);
- **SDPA's math fallback** (`aten::_scaled_dot_product_attention_math`): bmm → softmax → bmm, the T × T
  scores written to memory and read back;
- **written by hand**: a batched matmul, a softmax, a batched matmul on one thread with at most
  MAX_BETWEEN ops between each (the scale, a mask, dropout), where the shapes (when recorded) say
  attention: the first product is [..., Tq, D] × [..., D, Tk], the second takes its [..., Tq, Tk]
  result (the same batch × heads) against [..., Tk, Dv]. Without recorded shapes only `bmm`/`baddbmm`
  pairs are taken, or `matmul`s that dispatched to a bmm (a product of batched matrices).

A call's forward is its span (the fused op, the math op, or first matmul → second matmul); its backward
is every autograd node whose sequence number is one of the forward's ops' (the engine records the
forward op's number on its node). The kernels of both are the launches inside them.

`find(model, launches)` → `Attention` (None without attention). Each call has its shapes where the trace
recorded them (`batch_heads`, `q_len`, `k_len`, `head_dim`, `dtype`), whether it applied a mask (`mask`:
an explicit `attn_mask` to SDPA, a `masked_fill`/`add` between the products of a hand-written one), its
`dropout`, the user's source line and what the Python frames say of the code around it (`library`:
"transformers", "torch.nn.MultiheadAttention" or ""), and its time: GPU kernel time forward and
backward (`fwd_us`, `bwd_us`), the part of it spent on the T × T scores outside the two products
(`scores_us`: scale, mask, softmax, dropout and their gradients), and on a CPU-only trace the same in
CPU time (`cpu_us`, `cpu_scores_us`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .spans import TOUCH_US, gpu_ops_launched_in, ops_inside, outermost
from gpuadvise.analyzer.model import frames as code_frames
from gpuadvise.analyzer.model.kernels import is_matmul_like
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in

FUSED = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "CPU flash",
    "aten::_scaled_dot_product_fused_attention_overrideable": "the device's fused",
    "flash_attn::_flash_attn_forward": "flash-attn",
    "flash_attn::_flash_attn_varlen_forward": "flash-attn",
}
MATH = {"aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_attention_math_for_mps"}
SDPA = "aten::scaled_dot_product_attention"
SOFTMAX = {"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}
PRODUCTS = {"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum"}
BATCHED = {"aten::bmm", "aten::baddbmm"}  # batched by name: taken without recorded shapes
MASKS = {"aten::masked_fill", "aten::masked_fill_", "aten::add", "aten::add_", "aten::where", "aten::baddbmm"}
DROPOUT = {"aten::dropout", "aten::native_dropout", "aten::feature_dropout", "aten::_fused_dropout"}
MAX_BETWEEN = 12  # outermost ops between the products and the softmax (views, scale, mask, dropout, casts)
NODE = "autograd::engine::evaluate_function: "
_DTYPES = {"c10::BFloat16": "bf16", "BFloat16": "bf16", "c10::Half": "fp16", "Half": "fp16", "float": "fp32",
           "Float": "fp32", "double": "fp64", "Double": "fp64"}
_HF = re.compile(r"(^|/)transformers/")
_MHA = re.compile(r"multi_head_attention_forward")
COLUMNS = ["path", "op", "ts", "end", "tid", "external_id", "batch_heads", "heads", "q_len", "k_len", "head_dim",
           "v_dim", "dtype", "mask", "dropout", "causal", "fwd_us", "bwd_us", "scores_us", "cpu_us", "cpu_scores_us",
           "source", "library"]


@dataclass(frozen=True)
class Attention:
    """The attention calls of a trace (module docstring): `calls`, one row per call (COLUMNS), in time
    order; `kernels`, the GPU ops they launched (rows of `metrics.launches` with `call`, the row in
    `calls`, and `backward`)."""

    calls: pd.DataFrame
    kernels: pd.DataFrame

    @property
    def unfused(self) -> pd.DataFrame:
        return self.calls[self.calls["path"].isin(("math", "hand-written"))]

    @property
    def fused(self) -> pd.DataFrame:
        return self.calls[~self.calls["path"].isin(("math", "hand-written"))]


def find(model: TraceModel, launches: pd.DataFrame) -> Attention | None:
    cpu = model.cpu
    if cpu.empty:
        return None
    real = ~cpu["is_annotation"].to_numpy(dtype=bool)
    names = cpu["name"]
    wanted = names_in(names, set(FUSED) | MATH | SOFTMAX)
    if not wanted.any():
        return None
    ts, end, tid = (cpu[c].to_numpy() for c in ("ts", "end", "tid"))
    rows = []  # (path, first row, last row, op row)
    for r in np.flatnonzero(names_in(names, set(FUSED)) & real):
        rows.append((FUSED[str(names.iat[r])], r, r, r))
    math_rows = np.flatnonzero(names_in(names, MATH) & real)
    for r in math_rows:
        rows.append(("math", r, r, r))
    taken = rows and _spans(cpu, [r for _, r, _, _ in rows])
    # hand-written: a softmax outside every SDPA op and outside the backward, between two products
    soft = np.flatnonzero(names_in(names, SOFTMAX) & real)
    if len(soft):
        held = cpu.index.isin(ops_inside(model, cpu[name_mask(names, lambda n: n.startswith(NODE))]).index)
        if taken is not None and len(taken):
            held |= cpu.index.isin(ops_inside(model, taken).index)
        soft = soft[~held[soft]]
    if len(soft):
        rows += _hand_written(cpu, soft, real, ts, end, tid)
    if not rows:
        return None
    return _measure(model, launches, rows)


def _spans(cpu: pd.DataFrame, at: list[int]) -> pd.DataFrame:
    return cpu.iloc[np.asarray(at, dtype=np.int64)][["name", "ts", "end", "tid"]]


def _hand_written(cpu, soft: np.ndarray, real, ts, end, tid) -> list[tuple]:
    """(path, first product's row, second product's row, softmax row) of each softmax between two products."""
    names = cpu["name"]
    aten = name_mask(names, lambda n: n.startswith("aten::")) & real
    out = []
    for t in np.unique(tid[soft]):
        rows = np.flatnonzero(aten & (tid == t))
        rows = rows[outermost(ts[rows], end[rows], tid[rows])]
        top = rows[np.argsort(ts[rows], kind="stable")]  # outermost aten ops on this thread, in time order
        pos = {int(r): i for i, r in enumerate(top)}
        top_names = names.iloc[top].astype(str).to_numpy()
        product = np.isin(top_names, list(PRODUCTS))
        for s in soft[tid[soft] == t]:
            i = pos.get(int(s))
            if i is None:
                continue
            before = np.flatnonzero(product[max(0, i - MAX_BETWEEN - 1):i])
            after = np.flatnonzero(product[i + 1:i + MAX_BETWEEN + 2])
            if not len(before) or not len(after):
                continue
            a, b = top[max(0, i - MAX_BETWEEN - 1) + before[-1]], top[i + 1 + after[0]]
            if _is_attention(cpu, a, b):
                out.append(("hand-written", int(a), int(b), int(s)))
    return out


def _is_attention(cpu, a: int, b: int) -> bool:
    """The two products around a softmax compute attention: [..., Tq, D] × [..., D, Tk], then its
    [..., Tq, Tk] result × [..., Tk, Dv], over the same batch × heads."""
    first, second = _operands(cpu, a), _operands(cpu, b)
    if first is None or second is None:
        return _batched(cpu, a) and _batched(cpu, b)
    (q, k), (p, v) = first, second
    if len(q) < 3 or len(k) != len(q) or len(p) != len(q) or len(v) != len(q):
        return False
    return (q[:-2] == k[:-2] == p[:-2] == v[:-2] and q[-1] == k[-2] and p[-2] == q[-2] and p[-1] == k[-1]
            and v[-2] == k[-1] and k[-1] > 1)


def _batched(cpu, r: int) -> bool:
    """A batched product by its name, or a `matmul`/`einsum` that dispatched to one (a bmm inside it)."""
    if str(cpu["name"].iat[r]) in BATCHED:
        return True
    ts, end, tid = cpu["ts"].to_numpy(), cpu["end"].to_numpy(), cpu["tid"].to_numpy()
    inside = (tid == tid[r]) & (ts >= ts[r]) & (end <= end[r])
    return bool(names_in(cpu["name"][inside], BATCHED).any())


def _operands(cpu, r: int) -> tuple[list, list] | None:
    """The two matrix operands of a product op from its recorded shapes; None when not recorded."""
    name = str(cpu["name"].iat[r])
    dims = _dims(cpu, r)
    if name == "aten::baddbmm":
        dims = dims[1:]
    shapes = [d for d in dims[:2] if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    return (shapes[0], shapes[1]) if len(shapes) == 2 else None


def _dims(cpu, r: int) -> list:
    if "input_dims" not in cpu:
        return []
    try:
        out = json.loads(str(cpu["input_dims"].iat[r]))
    except ValueError:
        return []
    return out if isinstance(out, list) else []


def _types(cpu, r: int) -> list[str]:
    if "input_type" not in cpu:
        return []
    text = str(cpu["input_type"].iat[r])
    return text.split(",") if text and text != "nan" else []


def _measure(model: TraceModel, launches: pd.DataFrame, rows: list[tuple]) -> Attention:
    cpu = model.cpu
    rows.sort(key=lambda x: float(cpu["ts"].iat[x[1]]))
    names = cpu["name"]
    ts, end, tid, seq = (cpu[c].to_numpy() for c in ("ts", "end", "tid", "seq"))
    real = ~cpu["is_annotation"].to_numpy(dtype=bool)
    nodes = cpu[name_mask(names, lambda n: n.startswith(NODE))]
    sdpa = names_in(names, {SDPA} | set(FUSED) | MATH)
    node_seq = nodes["seq"].to_numpy()
    on_cpu = launches is None or launches.empty
    records, kernel_parts = [], []
    for i, (path, first, last, op) in enumerate(rows):
        lo, hi, t = float(ts[first]), float(end[last]), int(tid[first])
        span = pd.DataFrame({"ts": [lo], "end": [hi], "tid": [t], "name": [""]})
        inside = np.flatnonzero(real & (tid == t) & (ts >= lo) & (end <= hi))
        # the autograd nodes of its ops, and of the SDPA op around a backend's (which carries the number
        # where the backend op records none)
        around = np.flatnonzero(sdpa & (tid == t) & (ts <= lo) & (end >= hi))
        mine = np.concatenate([inside, around])
        seqs = set(seq[mine][seq[mine] >= 0].tolist())
        backward = nodes[np.isin(node_seq, list(seqs))] if seqs else nodes.iloc[0:0]
        shape = _shape(cpu, path, first, last, op)
        between = set(names.iloc[inside].astype(str))
        rec = {"path": path, "op": str(names.iat[op]), "ts": lo, "end": hi, "tid": t,
               "external_id": int(cpu["external_id"].iat[op]), **shape,
               "mask": shape.pop("mask", None) if path != "hand-written" else bool(between & MASKS - {"aten::baddbmm"}
                                                                                        or str(names.iat[first]) == "aten::baddbmm"),
               "dropout": bool(between & DROPOUT)}
        rec.update(_python(model, lo, hi, t, cpu["call_stack"].iat[op] if "call_stack" in cpu else ""))
        if not on_cpu:
            fwd = gpu_ops_launched_in(model, launches, span)
            bwd = gpu_ops_launched_in(model, launches, backward)
            for part, flag in ((fwd, False), (bwd, True)):
                if len(part):
                    kernel_parts.append(part.assign(call=i, backward=flag))
            scores = [k for k in (fwd, bwd) if len(k)]
            rec["fwd_us"], rec["bwd_us"] = float(fwd["gpu_us"].sum()), float(bwd["gpu_us"].sum())
            rec["scores_us"] = float(sum(k.loc[~matrix_kernels(k["gpu_name"]), "gpu_us"].sum() for k in scores))
            rec["cpu_us"] = rec["cpu_scores_us"] = 0.0
        else:
            rec["fwd_us"] = rec["bwd_us"] = rec["scores_us"] = 0.0
            rec["cpu_us"], rec["cpu_scores_us"] = _cpu_time(cpu, inside, backward, real, ts, end, tid)
        records.append(rec)
    calls = pd.DataFrame.from_records(records)
    for c in COLUMNS:
        if c not in calls:
            calls[c] = None
    kernels = pd.concat(kernel_parts, ignore_index=True) if kernel_parts else pd.DataFrame(
        columns=list(launches.columns if launches is not None else []) + ["call", "backward"])
    return Attention(calls[COLUMNS], kernels)


def matrix_kernels(names: pd.Series) -> np.ndarray:
    """Which kernels are matrix products (the two products of attention; the rest works on its scores)."""
    return name_mask(names, is_matmul_like)


def _shape(cpu, path: str, first: int, last: int, op: int) -> dict:
    """What the recorded shapes and types say of one call: batch × heads, the lengths, the head dims,
    the dtype, and for SDPA whether an `attn_mask` was passed."""
    out = {"batch_heads": None, "heads": None, "q_len": None, "k_len": None, "head_dim": None, "v_dim": None,
           "dtype": None, "causal": None}
    if path == "hand-written" or path == "math":
        if path == "math":  # the math op's own products: its first and last product inside it
            inner = _inner_products(cpu, op)
            if inner is None:
                return out
            first, last = inner
        a, b = _operands(cpu, first), _operands(cpu, last)
        if a is not None and b is not None and len(a[0]) >= 3:
            q, k = a
            out.update(batch_heads=int(np.prod(q[:-2])), heads=q[-3] if len(q) >= 4 else None, q_len=q[-2],
                       k_len=k[-1], head_dim=q[-1], v_dim=b[1][-1])
        types = _types(cpu, first)
        out["dtype"] = next((_DTYPES[x.strip()] for x in types if x.strip() in _DTYPES), None)
        if path == "math":
            out["mask"] = _sdpa_mask(cpu, op)
        return out
    dims = _dims(cpu, op)
    shapes = [d if isinstance(d, list) else [] for d in dims[:3]]
    if len(shapes) == 3 and all(len(x) == 4 for x in shapes):
        q, k, v = shapes
        out.update(batch_heads=q[0] * q[1], heads=q[1], q_len=q[2], k_len=k[2], head_dim=q[3], v_dim=v[3])
    types = _types(cpu, op)
    out["dtype"] = next((_DTYPES[x.strip()] for x in types if x.strip() in _DTYPES), None)
    out["mask"] = _sdpa_mask(cpu, op)
    return out


def _inner_products(cpu, op: int) -> tuple[int, int] | None:
    """The first and last product op inside a math SDPA op (its QKᵀ and its PV)."""
    names, ts, end, tid = cpu["name"], cpu["ts"].to_numpy(), cpu["end"].to_numpy(), cpu["tid"].to_numpy()
    inside = np.flatnonzero((tid == tid[op]) & (ts >= ts[op]) & (end <= end[op]) & names_in(names, {"aten::bmm"}))
    if len(inside) < 2:
        inside = np.flatnonzero((tid == tid[op]) & (ts >= ts[op]) & (end <= end[op]) & names_in(names, PRODUCTS))
    if len(inside) < 2:
        return None
    inside = inside[np.argsort(ts[inside], kind="stable")]
    return int(inside[0]), int(inside[-1])


def _sdpa_mask(cpu, op: int) -> bool | None:
    """Whether the SDPA call around `op` got an explicit attn_mask (its fourth input has a shape); None
    without recorded shapes."""
    names, ts, end, tid = cpu["name"], cpu["ts"].to_numpy(), cpu["end"].to_numpy(), cpu["tid"].to_numpy()
    around = np.flatnonzero((names == SDPA).to_numpy() & (tid == tid[op]) & (ts <= ts[op]) & (end >= end[op]))
    for r in around[::-1]:
        dims = _dims(cpu, int(r))
        if len(dims) >= 4:
            return isinstance(dims[3], list) and len(dims[3]) > 0
    return None


def _cpu_time(cpu, inside: np.ndarray, backward: pd.DataFrame, real, ts, end, tid) -> tuple[float, float]:
    """A CPU-only trace: the forward span's and backward nodes' time, and the part spent outside the
    products (the scores' elementwise passes), from the outermost ops inside them."""
    total = scores = 0.0
    names = cpu["name"]
    parts = [inside]
    for b in backward.itertuples():
        parts.append(np.flatnonzero(real & (tid == b.tid) & (ts >= b.ts) & (end <= b.end)))
    for part in parts:
        if not len(part):
            continue
        top = part[outermost(ts[part], end[part], tid[part])]
        dur = end[top] - ts[top]
        total += float(dur.sum())
        # the leaves' time outside the products: what a fused kernel does not spend on the scores
        products = PRODUCTS | {"aten::mm", "aten::addmm"}
        keep = _leaves(part, ts, end) & ~names_in(names.iloc[part], products) & ~_under(part, names, ts, end, products)
        scores += float((end[part][keep] - ts[part][keep]).sum())
    return total, scores


def _leaves(part: np.ndarray, ts, end) -> np.ndarray:
    """Which ops of `part` (one thread) hold no other op of it."""
    order = np.lexsort((-end[part], ts[part]))  # a holder comes right before the first op it holds
    s, e = ts[part][order], end[part][order]
    holds = np.zeros(len(part), dtype=bool)
    holds[order[:-1]] = (s[1:] >= s[:-1]) & (e[1:] <= e[:-1] + TOUCH_US)
    return ~holds


def _under(part: np.ndarray, names, ts, end, products: set) -> np.ndarray:
    """Which ops of `part` lie inside a product op of it."""
    is_product = names_in(names.iloc[part], products)
    out = np.zeros(len(part), dtype=bool)
    for p in part[is_product]:
        out |= (ts[part] >= ts[p]) & (end[part] <= end[p]) & (part != p)
    return out


def _python(model: TraceModel, lo: float, hi: float, tid: int, stack) -> dict:
    """The user's line of a call and the library around it, from the Python frames (with_stack) or the
    legacy call stack."""
    py = model.python
    texts: list[str] = []
    if not py.empty:
        p_ts, p_end = py["ts"].to_numpy(), py["end"].to_numpy()
        around = np.flatnonzero((p_ts <= lo) & (p_end >= hi) & (py["tid"].to_numpy() == tid))
        around = around[np.argsort(p_ts[around], kind="stable")]
        texts = [str(py["name"].iat[j]) for j in around][::-1]  # innermost first
    elif isinstance(stack, str) and stack and stack != "nan":
        texts = stack.split(";")
    pick = code_frames.pick(texts) if texts else code_frames.Pick(None)
    source = pick.user.text if pick.user is not None and pick.user.text else (pick.site or "")
    library = ("torch.nn.MultiheadAttention" if any(_MHA.search(x) for x in texts) else
               "transformers" if any(_HF.search(x) for x in texts) else "")
    return {"source": source, "library": library}

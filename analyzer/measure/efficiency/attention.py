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

from ..basics.spans import TOUCH_US, ops_inside, outermost
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
UNFUSED = ("math", "hand-written")
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
        return self.calls[self.calls["path"].isin(UNFUSED)]

    @property
    def fused(self) -> pd.DataFrame:
        return self.calls[~self.calls["path"].isin(UNFUSED)]


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
    index = _Index(cpu)
    node_rows = np.flatnonzero(name_mask(names, lambda n: n.startswith(NODE)))
    by_seq: dict[int, list[int]] = {}
    for r, q in zip(node_rows.tolist(), seq[node_rows].tolist()):
        if q >= 0:
            by_seq.setdefault(q, []).append(r)
    sdpa = np.flatnonzero(names_in(names, {SDPA} | set(FUSED) | MATH))
    on_cpu = launches is None or launches.empty
    frames = _Frames(model)
    records, spans, node_of = [], [], []
    for i, (path, first, last, op) in enumerate(rows):
        lo, hi, t = float(ts[first]), float(end[last]), int(tid[first])
        inside = index.within(lo, hi, t)
        # the autograd nodes of its ops, and of the SDPA op around a backend's (which carries the number
        # where the backend op records none)
        around = sdpa[(tid[sdpa] == t) & (ts[sdpa] <= lo + TOUCH_US) & (end[sdpa] >= hi - TOUCH_US)]
        mine = np.concatenate([inside, around])
        backward = sorted({r for q in set(seq[mine][seq[mine] >= 0].tolist()) for r in by_seq.get(q, ())})
        spans.append((lo, hi, t))
        node_of += [(r, i) for r in backward]
        shape = _shape(cpu, index, sdpa, path, first, last, op)
        between = set(index.names(inside).tolist())
        rec = {"path": path, "op": str(names.iat[op]), "ts": lo, "end": hi, "tid": t,
               "external_id": int(cpu["external_id"].iat[op]), **shape,
               "mask": shape.pop("mask", None) if path != "hand-written" else bool(between & MASKS - {"aten::baddbmm"}
                                                                                        or str(names.iat[first]) == "aten::baddbmm"),
               "dropout": bool(between & DROPOUT), "source": "", "library": "",
               "fwd_us": 0.0, "bwd_us": 0.0, "scores_us": 0.0, "cpu_us": 0.0, "cpu_scores_us": 0.0}
        if path in UNFUSED:  # where the finding points: only the calls a finding is about
            rec.update(frames.of(lo, hi, t, cpu["call_stack"].iat[op] if "call_stack" in cpu else ""))
        if on_cpu:
            rec["cpu_us"], rec["cpu_scores_us"] = _cpu_time(cpu, index, inside, backward)
        records.append(rec)
    calls = pd.DataFrame.from_records(records)
    kernels = pd.DataFrame(columns=list(launches.columns if launches is not None else []) + ["call", "backward"])
    if not on_cpu:
        fwd = _assign(launches, np.array(spans, dtype=float).reshape(-1, 3), np.arange(len(spans)))
        pairs = np.array(node_of, dtype=np.int64).reshape(-1, 2)
        node_spans = np.stack([ts[pairs[:, 0]], end[pairs[:, 0]], tid[pairs[:, 0]]], axis=1).astype(float)
        bwd = _assign(launches, node_spans, pairs[:, 1])
        kernels = pd.concat([launches[fwd >= 0].assign(call=fwd[fwd >= 0], backward=False),
                             launches[(bwd >= 0) & (fwd < 0)].assign(call=bwd[(bwd >= 0) & (fwd < 0)], backward=True)],
                            ignore_index=True)
        scores = ~matrix_kernels(kernels["gpu_name"]) if len(kernels) else np.zeros(0, dtype=bool)
        us = kernels["gpu_us"].to_numpy(dtype=float)
        call = kernels["call"].to_numpy(dtype=np.int64)
        back = kernels["backward"].to_numpy(dtype=bool)
        n = len(calls)
        calls["fwd_us"] = np.bincount(call[~back], weights=us[~back], minlength=n)
        calls["bwd_us"] = np.bincount(call[back], weights=us[back], minlength=n)
        calls["scores_us"] = np.bincount(call[scores], weights=us[scores], minlength=n)
    return Attention(calls[COLUMNS], kernels)


class _Index:
    """The real (not annotation) ops of each thread in start order: the ops inside a span without a scan
    of them all."""

    def __init__(self, cpu: pd.DataFrame):
        self.ts, self.end, self.tid = (cpu[c].to_numpy() for c in ("ts", "end", "tid"))
        tid = self.tid
        col = cpu["name"]
        if isinstance(col.dtype, pd.CategoricalDtype):
            self._codes, self._texts = col.cat.codes.to_numpy(), np.array([str(c) for c in col.cat.categories] + ["nan"])
        else:
            self._texts, self._codes = np.unique(col.astype(str).to_numpy(), return_inverse=True)
        real = ~cpu["is_annotation"].to_numpy(dtype=bool)
        self.threads = {}
        for t in np.unique(tid[real]):
            rows = np.flatnonzero(real & (tid == t))
            rows = rows[np.argsort(self.ts[rows], kind="stable")]
            self.threads[t] = (rows, self.ts[rows])

    def names(self, rows) -> np.ndarray:
        """The ops' names at `rows`, as text."""
        return self._texts[self._codes[rows]]

    def within(self, lo: float, hi: float, t) -> np.ndarray:
        """The rows of thread `t`'s ops that lie inside [lo, hi]."""
        rows, starts = self.threads.get(t, (np.zeros(0, dtype=np.int64), np.zeros(0)))
        a, b = np.searchsorted(starts, lo - TOUCH_US, "left"), np.searchsorted(starts, hi + TOUCH_US, "right")
        got = rows[a:b]
        return got[self.end[got] <= hi + TOUCH_US]


def _assign(launches: pd.DataFrame, spans: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per launch: the `owner` of the latest-starting span (lo, hi, tid rows) on its thread that holds its
    call, -1 for none. Spans on a thread nest or follow each other: the latest start is the innermost."""
    out = np.full(len(launches), -1, dtype=np.int64)
    if not len(spans) or launches.empty:
        return out
    k_ts, k_tid = launches["launch_ts"].to_numpy(dtype=float), launches["tid"].to_numpy()
    for t in np.unique(spans[:, 2]):
        mine = np.flatnonzero(spans[:, 2] == t)
        mine = mine[np.argsort(spans[mine, 0], kind="stable")]
        on = np.flatnonzero(k_tid == t)
        j = np.searchsorted(spans[mine, 0], k_ts[on], side="right") - 1
        ok = (j >= 0) & (k_ts[on] <= spans[mine[np.clip(j, 0, None)], 1])
        out[on[ok]] = owner[mine[j[ok]]]
    return out


def matrix_kernels(names: pd.Series) -> np.ndarray:
    """Which kernels are matrix products (the two products of attention; the rest works on its scores)."""
    return name_mask(names, is_matmul_like)


def _shape(cpu, index: "_Index", sdpa: np.ndarray, path: str, first: int, last: int, op: int) -> dict:
    """What the recorded shapes and types say of one call: batch × heads, the lengths, the head dims,
    the dtype, and for SDPA whether an `attn_mask` was passed."""
    out = {"batch_heads": None, "heads": None, "q_len": None, "k_len": None, "head_dim": None, "v_dim": None,
           "dtype": None, "causal": None}
    if path == "hand-written" or path == "math":
        if path == "math":  # the math op's own products: its first and last product inside it
            inner = _inner_products(cpu, index, op)
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
            out["mask"] = _sdpa_mask(cpu, index, sdpa, op)
        return out
    dims = _dims(cpu, op)
    shapes = [d if isinstance(d, list) else [] for d in dims[:3]]
    if len(shapes) == 3 and all(len(x) == 4 for x in shapes):
        q, k, v = shapes
        out.update(batch_heads=q[0] * q[1], heads=q[1], q_len=q[2], k_len=k[2], head_dim=q[3], v_dim=v[3])
    types = _types(cpu, op)
    out["dtype"] = next((_DTYPES[x.strip()] for x in types if x.strip() in _DTYPES), None)
    out["mask"] = _sdpa_mask(cpu, index, sdpa, op)
    return out


def _inner_products(cpu, index: "_Index", op: int) -> tuple[int, int] | None:
    """The first and last product op inside a math SDPA op (its QKᵀ and its PV)."""
    inside = index.within(float(index.ts[op]), float(index.end[op]), index.tid[op])
    names = index.names(inside)
    found = inside[np.isin(names, ["aten::bmm"])]
    if len(found) < 2:
        found = inside[np.isin(names, list(PRODUCTS))]
    return (int(found[0]), int(found[-1])) if len(found) >= 2 else None  # in start order


def _sdpa_mask(cpu, index: "_Index", sdpa: np.ndarray, op: int) -> bool | None:
    """Whether the SDPA call around `op` got an explicit attn_mask (its fourth input has a shape); None
    without recorded shapes. `sdpa`: the rows of the SDPA ops."""
    ts, end, tid = index.ts, index.end, index.tid
    around = sdpa[(tid[sdpa] == tid[op]) & (ts[sdpa] <= ts[op] + TOUCH_US) & (end[sdpa] >= end[op] - TOUCH_US)]
    around = around[index.names(around) == SDPA]
    for r in around[::-1]:
        dims = _dims(cpu, int(r))
        if len(dims) >= 4:
            return isinstance(dims[3], list) and len(dims[3]) > 0
    return None


def _cpu_time(cpu, index: "_Index", inside: np.ndarray, backward: list[int]) -> tuple[float, float]:
    """A CPU-only trace: the forward span's and backward nodes' time, and the part spent outside the
    products (the scores' elementwise passes), from the outermost ops inside them."""
    total = scores = 0.0
    ts, end, tid = index.ts, index.end, index.tid
    parts = [inside] + [index.within(float(ts[r]), float(end[r]), tid[r]) for r in backward]
    products = list(PRODUCTS | {"aten::mm", "aten::addmm"})
    for part in parts:
        if not len(part):
            continue
        top = part[outermost(ts[part], end[part], tid[part])]
        total += float((end[top] - ts[top]).sum())
        # the leaves' time outside the products: what a fused kernel does not spend on the scores
        product = np.isin(index.names(part), products)
        keep = _leaves(part, ts, end) & ~product & ~_under(part, product, ts, end)
        scores += float((end[part][keep] - ts[part][keep]).sum())
    return total, scores


def _leaves(part: np.ndarray, ts, end) -> np.ndarray:
    """Which ops of `part` (one thread) hold no other op of it."""
    order = np.lexsort((-end[part], ts[part]))  # a holder comes right before the first op it holds
    s, e = ts[part][order], end[part][order]
    holds = np.zeros(len(part), dtype=bool)
    holds[order[:-1]] = (s[1:] >= s[:-1]) & (e[1:] <= e[:-1] + TOUCH_US)
    return ~holds


def _under(part: np.ndarray, product: np.ndarray, ts, end) -> np.ndarray:
    """Which ops of `part` lie inside one of its products (`product` picks them)."""
    out = np.zeros(len(part), dtype=bool)
    for p in part[product]:
        out |= (ts[part] >= ts[p]) & (end[part] <= end[p]) & (part != p)
    return out


class _Frames:
    """The user's line of a call and the library around it, from the Python frames (`with_stack`) or the
    legacy call stack; each distinct stack judged once."""

    def __init__(self, model: TraceModel):
        py = model.python
        self.empty = py.empty
        if not self.empty:
            self.ts, self.end, self.tid = (py[c].to_numpy() for c in ("ts", "end", "tid"))
            self.names = py["name"]
        self.judged: dict[tuple, dict] = {}

    def of(self, lo: float, hi: float, tid: int, stack) -> dict:
        texts: tuple = ()
        if not self.empty:
            around = np.flatnonzero((self.ts <= lo) & (self.end >= hi) & (self.tid == tid))
            around = around[np.argsort(self.ts[around], kind="stable")]
            texts = tuple(str(self.names.iat[j]) for j in around[::-1])  # innermost first
        elif isinstance(stack, str) and stack and stack != "nan":
            texts = tuple(stack.split(";"))
        if texts not in self.judged:
            pick = code_frames.pick(texts) if texts else code_frames.Pick(None)
            source = pick.user.text if pick.user is not None and pick.user.text else (pick.site or "")
            library = ("torch.nn.MultiheadAttention" if any(_MHA.search(x) for x in texts) else
                       "transformers" if any(_HF.search(x) for x in texts) else "")
            self.judged[texts] = {"source": source, "library": library}
        return self.judged[texts]

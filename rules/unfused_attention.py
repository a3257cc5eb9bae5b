"""unfused-attention: attention runs as separate matmul, softmax and matmul kernels instead of one fused kernel.

## What it detects
Attention calls (analyzer/measure/efficiency/attention.py) that did not run a fused kernel: attention written by
hand (a batched matmul, a softmax, a batched matmul over the same batch × heads, with the scale, a mask
or dropout between them), and `scaled_dot_product_attention` fallen back to its math backend
(`aten::_scaled_dot_product_attention_math`). Calls on a fused backend (flash, memory-efficient, cuDNN,
the CPU's flash kernel, the flash-attn library) are never reported. Where the trace shows why the fused
kernel was not used, the finding says so: inputs in fp32 (the flash kernel takes fp16/bf16), an explicit
`attn_mask` (flash takes none; a causal mask is `is_causal=True`), a head dimension above the flash
kernel's 256, `nn.MultiheadAttention`'s `need_weights=True` (its weights must be made), or a Hugging
Face model on its eager attention. On a run without a GPU, attention with dropout on its scores (a
`scaled_dot_product_attention` call with `dropout_p` > 0 while training, or dropout between the
products of attention written by hand) is not reported: the CPU's flash kernel takes no dropout, so
math, the same passes over the scores, is the only backend a CPU has for it, whatever is set or written.

## Why it matters
Unfused attention writes the Tq × Tk scores to memory, reads them back for the softmax, writes the
probabilities and reads them again for the second product, and its backward does the same for their
gradients: memory traffic that grows with the square of the sequence, and memory to hold it. A fused
kernel (FlashAttention and its kin) keeps each tile of the scores on the chip: it moves only q, k, v and
the output, and for a causal mask skips the masked half of the work.

## Fix
```python
import torch.nn.functional as F
# attention written out by hand: one fused call (flash, memory-efficient or cuDNN)
y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # a causal mask; attn_mask=m for another, dropout_p=p
# nn.MultiheadAttention: do not ask for the weights
out, _ = attn(x, x, x, need_weights=False)
# a Hugging Face model
model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")
# fp32 inputs: the flash kernel takes bf16/fp16
with torch.autocast("cuda", dtype=torch.bfloat16):
    loss = model(x)
```

## Thresholds
Fires when the unfused attention's kernels (forward and backward) take at least 2 % of the median step
(its CPU time on a trace without a GPU) and the predicted saving is at least 0.5 %. The saving is the
replay of the steps with each call's kernels replaced by one fused forward and one fused backward
kernel, each at the larger of its compute time (its FLOPs, measure/efficiency/flops.py, over the device's dense
peak in the dtype the fused kernel runs in, at 35 % of it: what the cuDNN attention kernels of the open
H100 `healthy` run reached, 36 % forward and 33 % backward at 16 × 16 heads × 512 × 64 in bf16) and its
memory time (q, k, v and the output read or written once, their gradients in the backward, at 80 % of
the bandwidth), and never slower than the call was. The top of the range has the fused kernels at the
hardware's own bound (the whole peak and bandwidth) and, where the call masked its scores, the causal
half of the work. Without recorded shapes the kernels outside the two products (the scores' scale,
mask, softmax, dropout and their gradients) are removed and the products kept. On a trace without a GPU
the saving is the CPU time of those passes over the scores in the median step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuadvise.analyzer.measure.efficiency import attention, flops, roofline
from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.settings.switches_on import switches_on
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.transformer import training_loop

from .base import Rule

FUSED_EFFICIENCY = 0.35  # of the dense peak, the H100 healthy run's cuDNN attention (module docstring)
FLASH_HEAD_DIM = 256  # the flash kernel's largest head dimension
USER_STACK = "train.py(48): forward;train.py(97): train_step"


class UnfusedAttention(Rule):
    code = "GA113"
    name = "unfused-attention"
    title = "Attention runs unfused: the T × T scores go through memory"
    costly = True  # (rulequeue.py: taken first)
    thresholds = {"min_share_pct": 2.0, "min_saving_pct": 0.5, "fused_efficiency": FUSED_EFFICIENCY,
                  "flash_max_head_dim": FLASH_HEAD_DIM}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        if m.median_step_us <= 0:
            return []
        found = attention.find(a.model, m.launches if m.has_gpu else None)
        if found is None or found.unfused.empty:
            return []
        calls = found.unfused
        if not m.has_gpu:  # the CPU's flash kernel takes no dropout: with it, math is the CPU's only backend
            calls = calls[~calls["dropout"].astype(bool)]
            if calls.empty:
                return []
        k = found.kernels
        k = k[k["call"].isin(calls.index)] if len(k) else k
        on_gpu = bool(m.has_gpu and len(k))
        if on_gpu:
            scores = ~attention.matrix_kernels(k["gpu_name"])
            cost = perstep.issued(m, k["launch_ts"], k["gpu_us"])
            scores_cost = perstep.issued(m, k["launch_ts"], k["gpu_us"] * scores)
        else:
            cost = perstep.issued(m, calls["ts"], calls["cpu_us"])
            scores_cost = perstep.issued(m, calls["ts"], calls["cpu_scores_us"])
        cost_us, scores_us = perstep.median(cost), perstep.median(scores_cost)
        share = 100.0 * cost_us / m.median_step_us
        if share < t["min_share_pct"]:
            return []
        spec = a.device_spec
        target = _target_dtype(calls, spec) if on_gpu else None
        on = switches_on(a)
        if on_gpu:
            head, basis, top, bounded = self._replay(a, calls, k, spec, target)
        else:
            head = 100.0 * scores_us / m.median_step_us
            basis = ("CPU-only trace: the median step's passes over the scores outside the two products (scale, mask, "
                     "softmax, dropout and their gradients) removed, the products kept")
            top, bounded = None, False
        if head is None or head < t["min_saving_pct"]:
            return []
        per_step_calls = perstep.median(perstep.issued(m, calls["ts"]))
        lead = calls.iloc[0]
        sites = _sites(calls)
        reasons = _reasons(calls, on_gpu, spec)
        where = "GPU" if on_gpu else "CPU"
        message = (f"{perstep.a_median(m).capitalize()}{perstep.count_of(per_step_calls, 'attention call')} per step"
                   f"{_shape_words(lead)} {_path_words(calls)}: the scores are written to memory and read back. They "
                   f"take {cost_us / 1e3:.2f} ms of {where} time per step, {share:.1f} % of {perstep.the_median_step(m)} "
                   f"({scores_us / 1e3:.2f} ms of it outside the two products).")
        if reasons:
            message += " The fused kernel was not used: " + "; ".join(reasons) + "."
        advice = _advice(calls, on, runfacts.framework(a.facts), head, top, bounded, target)
        numbers = {"unfused_calls_per_step": per_step_calls, "attention_ms_per_step": round(cost_us / 1e3, 3),
                   "attention_share_pct_of_step": round(share, 1), "scores_ms_per_step": round(scores_us / 1e3, 3),
                   "batch_heads": _int(lead["batch_heads"]), "q_len": _int(lead["q_len"]), "k_len": _int(lead["k_len"]),
                   "head_dim": _int(lead["head_dim"]), "dtype": lead["dtype"], "fused_dtype": target,
                   "paths": {str(p): int(n) for p, n in calls["path"].value_counts().items()},
                   "fused_elsewhere": int(len(found.fused)),
                   "statistic": "median step"}
        items = [{"name": s["op"], "path": s["path"], "count": s["count"], "source": s["source"] or "–",
                  "shape": s["shape"]} for s in sites[:6]]
        evidence = Evidence(steps=[s.number for s in m.steps], items=items, numbers=numbers,
                            sources=[s["source"] for s in sites if s["source"]][:5],
                            time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in zip(calls["ts"].head(5), calls["end"].head(5))])
        return [self.finding(message=message, evidence=evidence, saving=head, basis=basis, advice=advice,
                             range_pct=(head, top) if top is not None and top - head > 0.05 else None,
                             fix=_fix(calls, on, target, on_gpu))]

    def _replay(self, a: Analysis, calls: pd.DataFrame, k: pd.DataFrame, spec, target: str):
        """(headline %, basis, top of the range %, whether the roofline bounded any call)."""
        new_head, new_top, bounded = _fused_times(calls, k, spec, target, self.thresholds["fused_efficiency"])

        def scenario(new):
            # the kernels a fused one replaces are not launched at all
            dropped = set(k.loc[(new == 0.0).to_numpy(), "correlation"])
            times = pd.Series(new.to_numpy(), index=pd.MultiIndex.from_arrays(
                [k["correlation"].to_numpy(), k["gpu_ts"].to_numpy(dtype=float)]))
            times = times[~times.index.duplicated()]
            return Scenario(
                "each attention call's kernels as one fused kernel each way (forward, and backward where it ran)"
                + (", each bounded by its roofline" if bounded else ", the passes over the scores removed"),
                remove=lambda calls_: calls_["correlation"].isin(dropped).to_numpy(),
                gpu_time=lambda ops: times.reindex(pd.MultiIndex.from_arrays(
                    [ops["correlation"].to_numpy(), ops["ts"].to_numpy(dtype=float)])).to_numpy(dtype=float))

        head, basis = a.predicted_saving(scenario(new_head))
        top = a.predicted_saving(scenario(new_top))[0] if bounded else None
        if head is None:
            return None, "", None, bounded
        peak = spec.peak(target) if target else None
        if bounded and peak:
            basis += (f"; fused kernels at {100 * self.thresholds['fused_efficiency']:.0f} % of the {spec.describe()}'s "
                      f"dense {target} peak ({peak:g} TFLOP/s) or 80 % of its {spec.memory_gbps:g} GB/s, whichever is "
                      "slower; the top of the range at the whole peak and bandwidth"
                      + (", the masked half of the causal work skipped" if bool(calls["mask"].fillna(False).any()) else ""))
        elif not bounded:
            basis += "; no shapes recorded: the kernels outside the two products removed, the products kept"
        return head, basis, top, bounded

    # -- fixtures ----------------------------------------------------------------------------------------
    def positive(self):
        # a bf16 GPT on an H100 with its attention written out by hand
        return training_loop(attention="hand", stack=USER_STACK)

    def negative(self):
        # the same model on SDPA's flash kernels: right as it is
        return training_loop(attention="flash", stack=USER_STACK)


RULE = UnfusedAttention()


def _int(v):
    return int(v) if v is not None and not pd.isna(v) else None


def _target_dtype(calls: pd.DataFrame, spec) -> str:
    """The dtype the fused kernel would run in: the calls' own where 16-bit, else bf16 (autocast) where
    the GPU has it, fp16 where only that, fp32 (the memory-efficient kernel) without either."""
    dtypes = set(calls["dtype"].dropna())
    for d in ("bf16", "fp16"):
        if d in dtypes:
            return d
    if spec.bf16:
        return "bf16"
    if spec.fp16:
        return "fp16"
    return "fp32"


def _fused_times(calls: pd.DataFrame, k: pd.DataFrame, spec, target: str, efficiency: float):
    """Per kernel of `k`: its new duration (NaN: unchanged) with each call's forward and backward as one
    fused kernel each, at the headline efficiency and at the hardware bound; and whether shapes bounded
    any call."""
    head = pd.Series(np.nan, index=k.index)
    top = pd.Series(np.nan, index=k.index)
    bounded = False
    peak = spec.peak(target) if target else None
    bandwidth = spec.memory_gbps
    width = roofline.OPERAND_BYTES.get(target, 2)
    for i, call in calls.iterrows():
        mine = k[k["call"] == i]
        for backward in (False, True):
            part = mine[mine["backward"] == backward].sort_values("gpu_ts")
            if part.empty:
                continue
            now = float(part["gpu_us"].sum())
            q = _qkv(call)
            if q is not None and peak and bandwidth:
                bounded = True
                fn = flops.attention_backward_flops if backward else flops.attention_flops
                whole = fn(*q, causal=False).flops
                causal = fn(*q, causal=True).flops if call["mask"] else whole
                moved = _moved(call, backward) * width
                fused = max(whole / (peak * 1e6 * efficiency), moved / (bandwidth * 1e3 * roofline.MEMORY_EFFICIENCY),
                            roofline.LATENCY_FLOOR_US)
                bound = max(causal / (peak * 1e6), moved / (bandwidth * 1e3), roofline.LATENCY_FLOOR_US)
                for series, us in ((head, fused), (top, bound)):
                    if us < now:
                        series.loc[part.index] = 0.0
                        series.loc[part.index[0]] = us
            else:  # no shapes: the passes over the scores removed, the products kept
                scores = ~attention.matrix_kernels(part["gpu_name"])
                for series in (head, top):
                    series.loc[part.index[scores]] = 0.0
    return head, top, bounded


def _qkv(call) -> tuple[list, list, list] | None:
    """[B, H, S, D] shapes of q, k, v (batch × heads folded into B when the trace has no separate heads)."""
    vals = [call[c] for c in ("batch_heads", "q_len", "k_len", "head_dim", "v_dim")]
    if any(v is None or pd.isna(v) for v in vals):
        return None
    bh, tq, tk, d, dv = (int(v) for v in vals)
    return [bh, 1, tq, d], [bh, 1, tk, d], [bh, 1, tk, dv]


def _moved(call, backward: bool) -> float:
    """Elements a fused kernel reads and writes at least once: q, k, v and the output (and the output's
    gradient, q's, k's and v's in the backward)."""
    bh, tq, tk, d, dv = (int(call[c]) for c in ("batch_heads", "q_len", "k_len", "head_dim", "v_dim"))
    forward = bh * (tq * d + tk * d + tk * dv + tq * dv)
    return float(forward * 2 if backward else forward)


def _path_words(calls: pd.DataFrame) -> str:
    paths = set(calls["path"])
    if paths == {"math"}:
        return "run on `scaled_dot_product_attention`'s math fallback (bmm → softmax → bmm)"
    if paths == {"hand-written"}:
        lib = set(calls["library"]) - {""}
        if "torch.nn.MultiheadAttention" in lib:
            return "run `nn.MultiheadAttention`'s unfused path (bmm → softmax → bmm)"
        if "transformers" in lib:
            return "run the model's eager attention (matmul → softmax → matmul, in transformers)"
        return "are written out by hand (matmul → softmax → matmul)"
    return "run unfused (written out by hand, or on SDPA's math fallback)"


def _shape_words(call) -> str:
    if call["q_len"] is None or pd.isna(call["q_len"]):
        return ""
    return (f", {int(call['batch_heads'])} batch × heads of {int(call['q_len'])} × {int(call['k_len'])} scores "
            f"(head dim {int(call['head_dim'])}{', ' + call['dtype'] if call['dtype'] else ''}),")


def _reasons(calls: pd.DataFrame, on_gpu: bool, spec) -> list[str]:
    """Why no fused kernel ran, as far as the trace shows it."""
    out = []
    lib = set(calls["library"]) - {""}
    paths = set(calls["path"])
    if "hand-written" in paths:
        if "torch.nn.MultiheadAttention" in lib:
            out.append("`nn.MultiheadAttention` was asked for its attention weights (`need_weights=True`, its "
                       "default), which only the unfused path makes")
        elif "transformers" in lib:
            out.append("the model runs its eager attention implementation (`attn_implementation=\"eager\"`, or a "
                       "version that had no other)")
        else:
            out.append("the attention is written out by hand, so no fused kernel is ever asked for")
    if on_gpu and "fp32" in set(calls["dtype"].dropna()):
        out.append("its inputs are fp32, and the flash kernel takes fp16/bf16 only")
    if bool(calls["mask"].fillna(False).any()) and "math" in paths:
        out.append("an explicit `attn_mask` was passed, which the flash kernel does not take (`is_causal=True` "
                   "instead of a causal mask)")
    big = calls["head_dim"].dropna()
    if len(big) and int(big.max()) > FLASH_HEAD_DIM:
        out.append(f"its head dimension {int(big.max())} is above the flash kernel's {FLASH_HEAD_DIM}")
    if "math" in paths and len(out) == 0:
        out.append("nothing the trace shows rules the fused kernels out: the math backend was chosen for it "
                   "(`torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`, or the fused backends switched off with "
                   "`torch.backends.cuda.enable_flash_sdp(False)` and its kin)")
    return out


def _sites(calls: pd.DataFrame) -> list[dict]:
    out = []
    for (source, path, op), g in calls.groupby(["source", "path", "op"], sort=False):
        first = g.iloc[0]
        shape = (f"{int(first['batch_heads'])}×{int(first['q_len'])}×{int(first['k_len'])}×{int(first['head_dim'])}"
                 if first["q_len"] is not None and not pd.isna(first["q_len"]) else "–")
        out.append({"source": source, "path": path, "op": op, "count": int(len(g)), "shape": shape})
    return sorted(out, key=lambda s: -s["count"])


def _advice(calls, on, fw, head: float, top, bounded: bool, target) -> str:
    lib = set(calls["library"]) - {""}
    paths = set(calls["path"])
    if "torch.nn.MultiheadAttention" in lib:
        how = "Call the attention with `need_weights=False`: it then runs `scaled_dot_product_attention`'s fused kernels"
    elif "transformers" in lib:
        how = ('Load the model with `attn_implementation="sdpa"` ("flash_attention_2" where installed; a model '
               "with no SDPA implementation of its own needs its matmul → softmax → matmul replaced by "
               "`F.scaled_dot_product_attention`)")
    elif paths == {"math"}:
        how = "Let `scaled_dot_product_attention` choose its backend (no `sdpa_kernel(SDPBackend.MATH)`)"
    else:
        how = ("Replace the matmul → softmax → matmul with `F.scaled_dot_product_attention(q, k, v, is_causal=True)` "
               "(`attn_mask=` for a mask that is not causal" + (", `dropout_p=` for the dropout" if calls["dropout"].any() else "")
               + ")")
    out = f"{how}: predicted to save {head:.1f} % of the step"
    if top is not None and top - head > 0.05:
        out += f" (up to {top:.1f} % at the hardware's bound)"
    out += "."
    if target and "fp32" in set(calls["dtype"].dropna()) and "autocast" not in on and target in ("bf16", "fp16"):
        out += (f" The flash kernel needs 16-bit inputs: {switches.bf16(fw) if target == 'bf16' else 'run it under fp16 autocast'}"
                " (the prediction assumes it).")
    return out


def _fix(calls, on, target, on_gpu: bool) -> str:
    """The Fix block for what the trace shows: the one change that applies, autocast only where needed and off."""
    lib = set(calls["library"]) - {""}
    paths = set(calls["path"])
    lines = ["```python"]
    if "torch.nn.MultiheadAttention" in lib:
        lines += ["# nn.MultiheadAttention: do not ask for the weights", "out, _ = attn(x, x, x, need_weights=False)"]
    elif "transformers" in lib:
        lines += ["# a Hugging Face model: its SDPA attention",
                  'model = AutoModel.from_pretrained(name, attn_implementation="sdpa")']
    elif paths == {"math"}:
        lines += ["import torch.nn.functional as F", "# no sdpa_kernel(SDPBackend.MATH) around it: the fused backends",
                  "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"]
    else:
        lines += ["import torch.nn.functional as F", "# instead of softmax(q @ k.transpose(-2, -1) * scale + mask) @ v",
                  "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"
                  + ("  # dropout_p=p while training" if calls["dropout"].any() else "")]
    if on_gpu and "fp32" in set(calls["dtype"].dropna()) and "autocast" not in on and target in ("bf16", "fp16"):
        lines += [f"# fp32 inputs: the flash kernel takes {target}",
                  f"with torch.autocast(\"cuda\", dtype=torch.{'bfloat16' if target == 'bf16' else 'float16'}):",
                  "    loss = model(x)"]
    lines.append("```")
    return "\n".join(lines)

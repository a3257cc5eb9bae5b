"""Model FLOPs utilization (MFU) and hardware FLOPs utilization (HFU) of a trace's steps, with the
arithmetic that gives them.

Definitions (Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways", 2022, section 4.1 and
appendix B): **model FLOPs** are the step's forward and backward FLOPs without any recompute; **hardware
FLOPs** are what the hardware ran, activation checkpointing's recomputed forward included; MFU is the model
FLOPs per step over the step time over the peak, HFU the same with the hardware FLOPs.

Here:
- **The FLOPs** are counted from the trace (measure/efficiency/flops.py: every op that recorded its shapes, each FLOP
  once) and placed in the steps their kernels ran in, so a step's FLOPs and its time come from the same
  steps. Recomputed forward ops are told apart by measure/efficiency/passes.py.
- **The step time** is the header's: the median step on the GPU timeline (measure/basics/metrics.py).
- **One process on several GPUs** (DataParallel, a model split by hand) counts the FLOPs of them all over
  their peaks together (`gpus` of them).
- **The peak** is the device's dense peak (model/devices.py, no 2:4 sparsity) **of the dtype each op ran
  in**: bf16/fp16/fp8 from the op's input dtype; an op on fp32 inputs against the TF32 peak where its
  kernels ran on the Tensor Cores (their names say so), else the fp32 one. With several dtypes in one
  step the peak is the one they make together: the model FLOPs over the time they would take, each at its
  own dtype's peak (`peak_tflops`), so MFU = Σ_dtype (FLOPs / peak) / step time.

The headline is the median step's: the median model FLOPs per step over the median step time and that
peak; each step's own figures are in `steps`. A CPU run has no peak (FLOPs and TFLOP/s only), and neither
does a GPU the device table does not know. Where matrix kernels ran without recorded shapes (Triton
templates, CUDA graph replays, ops the shapes probe could not annotate) their FLOPs are missing:
`coverage_pct` says how much of the matrix kernels' time in the steps is counted, and below 100 % the
MFU is a lower bound.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..basics import perstep
from .flops import FAMILIES, counted_ops, op_kernels
from ..basics.metrics import Metrics
from .passes import passes
from gpuadvise.analyzer.model import flopops, runfacts
from gpuadvise.analyzer.model.devices import Spec
from gpuadvise.analyzer.model.kernels import is_comm, is_matmul_like, uses_tensor_cores
from gpuadvise.analyzer.model.report import FlopClass, FlopFigures, PeakShare, StepFlops, flop_text, ms_text
from gpuadvise.analyzer.model.trace import TraceModel, distinct_names, name_mask

PHASES = ("forward", "backward", "recompute")
DTYPE_ORDER = ("fp8", "bf16", "fp16", "tf32", "fp32")


def utilization(model: TraceModel, m: Metrics, spec: Spec | None, facts: dict | None = None) -> FlopFigures | None:
    """The trace's FLOPs per step and MFU (module docstring); None where it holds no matrix work at all."""
    ops = counted_ops(model)
    matrix = _matrix_kernels(model, m)
    if ops.empty:
        shaped_ops = len(model.cpu) and name_mask(model.cpu["name"], lambda n: flopops.family(n) is not None).any()
        if matrix.empty and not shaped_ops:
            return None
        return FlopFigures(state="no shapes", note=missing_shapes(facts or {}, m.has_gpu))
    gpu = m.has_gpu
    spec = spec if gpu else None
    kernels = op_kernels(model, ops) if gpu else pd.DataFrame()
    if gpu and kernels.empty:
        return FlopFigures(state="no kernels", note=("No MFU: the ops that recorded their shapes launched no kernel "
                                                     "this trace holds (it has no runtime calls to link them by)."))
    peak_dtype = _peak_dtypes(ops, kernels, spec)
    placed = _placed(ops, kernels, peak_dtype, gpu)
    ts = placed["ts"]
    hardware = perstep.sums(m, ts, placed["flops"])
    model_step = perstep.sums(m, ts, placed["model"])
    whole_step = perstep.sums(m, ts, placed["model_whole"])
    step_us = m.per_step["dur_us"].to_numpy(dtype=float)
    med_us = m.median_step_us
    med_model, med_hw, med_whole = perstep.median(model_step), perstep.median(hardware), perstep.median(whole_step)
    peaks, stand_ins = _peaks(spec, placed["dtype"].unique()) if spec is not None else ({}, {})
    # each step's FLOPs at each dtype's peak: the time they would take (s)
    rate = placed["dtype"].map(peaks).to_numpy(dtype=float) * 1e12 if peaks else np.full(len(placed), np.nan)
    known = np.isfinite(rate)
    model_time = perstep.sums(m, ts[known], placed["model"].to_numpy()[known] / rate[known])
    hw_time = perstep.sums(m, ts[known], placed["flops"].to_numpy()[known] / rate[known])
    has_peak = bool(peaks) and known.all()
    # one process driving several GPUs (DataParallel, a model split by hand): the FLOPs of them all, over
    # their peaks together
    gpus = max(1, int(kernels["device"].nunique())) if gpu and len(kernels) else 1
    model_time, hw_time = model_time / gpus, hw_time / gpus
    peak_model = gpus * _combined_peak(placed["model"], rate) if has_peak else None
    peak_hw = gpus * _combined_peak(placed["flops"], rate) if has_peak else None
    mfu = _pct(med_model, med_us, peak_model)
    steps = [StepFlops(step=st.number, ms=round(float(us) / 1e3, 3), model_flops=float(f), hardware_flops=float(h),
                       mfu_pct=_r(100 * t / (us / 1e6)) if has_peak and us > 0 else None,
                       hfu_pct=_r(100 * th / (us / 1e6)) if has_peak and us > 0 else None)
             for st, us, f, h, t, th in zip(m.steps or [], step_us, model_step, hardware, model_time, hw_time)]
    coverage, uncounted = _coverage(m, matrix, kernels)
    whole_differs = med_whole > med_model * 1.0005
    figures = FlopFigures(
        state="counted",
        note=_no_peak(gpu, spec) if not has_peak else _create_graph(model),
        model_flops=float(med_model), hardware_flops=float(med_hw), step_ms=round(float(med_us) / 1e3, 3),
        achieved_tflops=float(med_model / (med_us / 1e6) / 1e12) if med_us > 0 else None,
        mfu_pct=mfu, hfu_pct=_pct(med_hw, med_us, peak_hw),
        peak_tflops=_r(peak_model, 1), device=spec.describe() if spec is not None and has_peak else None, gpus=gpus,
        peaks=_shares(placed, peaks, stand_ins) if has_peak else [],
        classes=_classes(m, placed, ops, gpu),
        steps=steps,
        whole_model_flops=float(med_whole) if whole_differs else None,
        whole_mfu_pct=_pct(med_whole, med_us, peak_model) if whole_differs else None,
        coverage_pct=coverage, uncounted=uncounted,
    )
    return _with_basis(figures)


def missing_shapes(facts: dict, gpu: bool) -> str:
    """What the trace lacks for a FLOP count and how to get it."""
    options, shapes = runfacts.shape_capture(facts)
    state = str(shapes.get("state") or "")
    if shapes.get("mode") == "probe" and state and state != "annotated":
        return (f"No FLOP count: the shapes probe could not annotate this window ({state}); rerun `gpuadvise "
                "profile` with --record-shapes to record them in the window itself.")
    if options:
        if not options.get("record_shapes") and not options.get("shapes_probe", True):
            return ("No FLOP count: this run recorded no op shapes (--no-record-shapes --no-shapes-probe); "
                    "`gpuadvise profile` records the shapes MFU needs by default.")
    what = "MFU" if gpu else "a FLOP count"
    return (f"No {what}: the trace recorded no op shapes. Record it with torch.profiler.profile(record_shapes=True), "
            "or with `gpuadvise profile`, which records them by default at no cost to the window.")


def _no_peak(gpu: bool, spec: Spec | None) -> str:
    if not gpu:
        return "A CPU run has no accelerator peak to measure against: FLOPs and TFLOP/s, no MFU."
    return (f"No MFU: the device table has no peak for {spec.describe() if spec is not None else 'this GPU'} "
            "(analyzer/model/devices.py).")


def _create_graph(model: TraceModel) -> str | None:
    if passes(model).create_graph:
        return ("The backward recorded a graph of its own (create_graph=True): recomputed forward ops are not "
                "told apart, so hardware FLOPs equal model FLOPs here.")
    return None


def _matrix_kernels(model: TraceModel, m: Metrics) -> pd.DataFrame:
    """The matrix kernels (GEMM, convolution, attention) that ran in the steps: correlation, name, ts, dur."""
    k = model.kernels
    if k.empty:
        return k
    names = {n for n in distinct_names(k["name"]) if is_matmul_like(n) and not is_comm(n)}
    k = k[name_mask(k["name"], names.__contains__)]
    lo, hi = perstep.windows(m)
    ts = k["ts"].to_numpy(dtype=float)
    i = np.searchsorted(lo, ts, side="right") - 1
    inside = (i >= 0) & (ts < hi[np.clip(i, 0, None)]) if len(lo) else np.zeros(len(k), dtype=bool)
    return k[inside][["correlation", "name", "ts", "dur"]]


def _peak_dtypes(ops: pd.DataFrame, kernels: pd.DataFrame, spec: Spec | None) -> np.ndarray:
    """The dtype whose peak each op is measured against (module docstring)."""
    dtype = ops["dtype"].to_numpy(dtype=object)
    tensor = np.zeros(len(ops), dtype=bool)
    if len(kernels):
        tc = np.fromiter((uses_tensor_cores(str(n)) for n in kernels["name"]), dtype=bool, count=len(kernels))
        tensor = pd.Series(tc).groupby(kernels["op"].to_numpy()).any().reindex(range(len(ops)), fill_value=False).to_numpy()
    out = np.where(pd.isna(dtype), np.where(tensor, "bf16", "fp32"), dtype).astype(object)
    tf32 = spec is not None and spec.tf32 is not None
    out[(out == "fp32") & tensor & tf32] = "tf32"
    return out


def _placed(ops: pd.DataFrame, kernels: pd.DataFrame, peak_dtype: np.ndarray, gpu: bool) -> pd.DataFrame:
    """The FLOPs where they ran: per kernel on a GPU (its share of its op's), per op on a CPU. `flops` are
    hardware FLOPs; `model` leaves out what was recomputed (a checkpointed forward op entirely, the scores a
    fused attention backward computes again), `model_whole` the same with causal attention counted whole."""
    cols = ["ts", "flops", "model", "model_whole", "dur", "op", "family", "phase", "dtype"]
    op_flops = ops["flops"].to_numpy(dtype=float)
    recompute = (ops["pass"] == "recompute").to_numpy()
    op_model = np.where(recompute, 0.0, op_flops - ops["recomputed"].to_numpy(dtype=float))
    whole_per_flop = np.where(op_flops > 0, ops["whole"].to_numpy(dtype=float) / np.where(op_flops > 0, op_flops, 1.0), 1.0)
    if gpu:
        i = kernels["op"].to_numpy()
        share = kernels["flops"].to_numpy(dtype=float) / np.where(op_flops[i] > 0, op_flops[i], 1.0)
        out = pd.DataFrame({"ts": kernels["ts"].to_numpy(dtype=float), "flops": kernels["flops"].to_numpy(dtype=float),
                            "model": op_model[i] * share, "dur": kernels["dur"].to_numpy(dtype=float), "op": i})
    else:
        i = np.arange(len(ops))
        out = pd.DataFrame({"ts": ops["ts"].to_numpy(dtype=float), "flops": op_flops, "model": op_model,
                            "dur": np.zeros(len(ops)), "op": i})
    out["model_whole"] = out["model"].to_numpy() * whole_per_flop[i]
    out["family"] = ops["family"].to_numpy()[i]
    out["phase"] = ops["pass"].to_numpy()[i]
    out["dtype"] = peak_dtype[i]
    return out[cols]


def _peaks(spec: Spec, dtypes) -> tuple[dict, dict]:
    """Each dtype's dense peak (TFLOP/s) and the dtype standing in for one the device has no units for."""
    peaks, stand_ins = {}, {}
    for d in dtypes:
        peak, whose = spec.dense_peak(str(d))
        if peak:
            peaks[d] = peak
            if whose != d:
                stand_ins[d] = whose
    return peaks, stand_ins


def _combined_peak(flops: pd.Series, rate: np.ndarray) -> float | None:
    """The one peak several dtypes make: the FLOPs over the time they take, each at its own peak (TFLOP/s)."""
    f = flops.to_numpy(dtype=float)
    seconds = float((f / rate).sum())
    return float(f.sum() / seconds / 1e12) if seconds > 0 else None


def _pct(flops: float, step_us: float, peak_tflops: float | None) -> float | None:
    if not peak_tflops or step_us <= 0:
        return None
    return _r(100 * flops / (step_us / 1e6) / (peak_tflops * 1e12))


def _shares(placed: pd.DataFrame, peaks: dict, stand_ins: dict) -> list[PeakShare]:
    by = placed.groupby("dtype")["model"].sum()
    total = float(by.sum()) or 1.0
    order = sorted(by.index, key=lambda d: (DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 99, str(d)))
    return [PeakShare(dtype=str(d), tflops=float(peaks[d]), share_pct=_r(100 * by[d] / total, 1) or 0.0,
                      stand_in=stand_ins.get(d)) for d in order if by[d] > 0]


def _classes(m: Metrics, placed: pd.DataFrame, ops: pd.DataFrame, gpu: bool) -> list[FlopClass]:
    out = []
    for (family, phase, dtype), part in placed.groupby(["family", "phase", "dtype"], sort=False):
        flops = perstep.median(perstep.sums(m, part["ts"], part["flops"]))
        if flops <= 0:
            continue
        mine = ops.iloc[np.unique(part["op"].to_numpy())]
        n = perstep.median(perstep.issued(m, mine["ts"]))
        kernel_us = perstep.median(perstep.sums(m, part["ts"], part["dur"])) if gpu else None
        out.append(FlopClass(family=str(family), phase=str(phase), dtype=str(dtype), flops=flops,
                             model_flops=perstep.median(perstep.sums(m, part["ts"], part["model"])), ops=n,
                             kernel_ms=round(kernel_us / 1e3, 3) if kernel_us is not None else None,
                             tflops=float(flops / (kernel_us / 1e6) / 1e12) if kernel_us else None))
    rank = {f: i for i, f in enumerate(FAMILIES)}
    return sorted(out, key=lambda c: (PHASES.index(c.phase), rank.get(c.family, 9), -c.flops))


def _coverage(m: Metrics, matrix: pd.DataFrame, kernels: pd.DataFrame) -> tuple[float | None, list[str]]:
    if matrix.empty:
        return None, []
    counted = matrix["correlation"].isin(kernels["correlation"]) if len(kernels) else pd.Series(False, index=matrix.index)
    total = float(matrix["dur"].sum())
    left = matrix[~counted.to_numpy()]
    names = left.groupby("name", observed=True)["dur"].sum().sort_values(ascending=False)
    return (_r(100 * (total - float(left["dur"].sum())) / total, 1) if total > 0 else None,
            [str(n) for n in names.index[:3]])


def _with_basis(f: FlopFigures) -> FlopFigures:
    """The headline's arithmetic in one line, every output's words."""
    from dataclasses import replace

    per_step = f"{flop_text(f.model_flops)} model FLOPs per step"
    if f.mfu_pct is None:
        rate = flop_text(f.achieved_tflops * 1e12, "FLOP/s") if f.achieved_tflops is not None else "–"
        return replace(f, basis=f"{per_step} in {ms_text(f.step_ms)} ms: {rate}")
    peaks = "; ".join(f"{p.dtype} {p.tflops:g}" + (f" (its {p.stand_in} peak)" if p.stand_in else "")
                      + (f" for {p.share_pct:g} %" if len(f.peaks) > 1 else "") for p in f.peaks)
    gpus = f", {f.gpus} GPUs" if f.gpus > 1 else ""
    at_least = "≥ " if f.coverage_pct is not None and f.coverage_pct < 99.5 else ""  # uncounted matrix kernels
    basis = (f"MFU {at_least}{f.mfu_pct:.1f} % = {per_step} / {ms_text(f.step_ms)} ms / {f.peak_tflops:g} TFLOP/s "
             f"({f.device} dense peak{gpus}: {peaks})")
    return replace(f, basis=basis)


def _r(v, nd: int = 2):
    return None if v is None else round(float(v), nd)

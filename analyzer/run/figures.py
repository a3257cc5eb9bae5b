"""A trace's summary figures (`model.report.TraceFigures`), computed once from its model, metrics and
calibration while the events are still there; the renderers and a compact report read them as data."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuadvise.analyzer.measure.replay.calibration import Calibration
from gpuadvise.analyzer.measure.basics import perstep, phases
from gpuadvise.analyzer.measure.basics.idle import idle_split
from gpuadvise.analyzer.measure.basics.metrics import Metrics
from gpuadvise.analyzer.measure.longrun.slowsteps import slow_steps
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.measure.basics import intervals as iv
from gpuadvise.analyzer.measure.job.ranktime import thread_time
from gpuadvise.analyzer.measure.basics.tables import device_table
from gpuadvise.analyzer.model.report import CpuStep, FlopFigures, GpuFigures, LeftOutStep, StepTime, TraceFigures
from gpuadvise.analyzer.model.trace import TraceModel

BREAKDOWN_COLUMNS = ("dur_us", "kernel_us", "comm_us", "memcpy_us", "memset_us", "dataloader_us", "sync_us", "idle_us")


def trace_figures(model: TraceModel, m: Metrics, calibration: Calibration | None, facts: dict | None = None,
                  flops: FlopFigures | None = None) -> TraceFigures:
    meta, dev, ps = model.meta, model.device, m.per_step
    cal = calibration
    unprofiled_ms = _r(cal.unprofiled_step_us / 1e3, 3) if cal is not None and cal.unprofiled_step_us else None
    return TraceFigures(
        device=dev.name if dev else None,
        # the one device description every format prints: run.json first, then the trace
        device_description=runfacts.describe_device(facts, model, m.has_gpu),
        compute_capability=f"{dev.compute_major}.{dev.compute_minor}" if dev and dev.compute_major is not None else None,
        platform=meta.platform,
        events=meta.events_total,
        steps=len(m.steps),
        step_numbers=[st.number for st in m.steps],
        median_step_ms=round(m.median_step_us / 1e3, 3),
        median_step_cpu_ms=round(m.median_cpu_step_us / 1e3, 3),
        median_step_gpu_ms=round(m.median_gpu_step_us / 1e3, 3),
        step_time_basis=_step_basis(m),
        unprofiled_median_step_ms=unprofiled_ms,
        profiler_overhead_x=_r(cal.overhead_x) if cal is not None else None,
        profiler_calibration=cal.describe() if cal is not None else None,
        # the step table's times: one-time costs cut out of a step that could not be left out stay out here too
        step_times_ms=[StepTime(step=st.number, ms=round(dur / 1e3, 3), cpu_ms=round(cpu / 1e3, 3),
                                gpu_ms=round(st.gpu_dur / 1e3, 3), bound="gpu" if st.gpu_bound else "cpu")
                       for st, dur, cpu in zip(m.steps, ps["dur_us"], ps["cpu_dur_us"])],
        window_ms=round(m.window_us / 1e3, 3),
        gpu_busy_pct=_r(m.gpu_busy_pct),
        gpu_busy_in_steps_pct=_r(m.busy_in_steps_pct),
        temporal_breakdown={k: _r(v) for k, v in m.temporal.items()},
        step_breakdown_ms={col.replace("_us", ""): round(float(np.median(ps[col])) / 1e3, 3)
                           for col in BREAKDOWN_COLUMNS if col in ps},
        # per step, the median over the steps, as step_breakdown_ms and the header's median step
        idle_breakdown_ms={k: round(perstep.median(v) / 1e3, 3) for k, v in idle_split(model, m).items()}
        if len(m.idle_breakdown) else {},
        kernels=int(len(model.kernels)),
        events_skipped=meta.events_skipped,
        truncated=meta.truncated,
        steps_left_out=[LeftOutStep(step=st.number, ms=round(st.dur / 1e3, 3), reason=m.left_out.get(st.number, ""))
                        for st in m.left_out_steps],
        one_time_note=one_time_note(m),
        slow_steps=slow_steps(model, m),
        flops=_unprofiled(flops, unprofiled_ms),
        cpu_steps=cpu_steps(model, m),
        gpus=gpu_figures(model, m),
    )


def _unprofiled(flops: FlopFigures | None, unprofiled_ms: float | None) -> FlopFigures | None:
    """The MFU at run.json's unprofiled step: the same FLOPs, the step the profiler did not slow."""
    if flops is None or not unprofiled_ms or flops.mfu_pct is None or not flops.peak_tflops:
        return flops
    return replace(flops, unprofiled_step_ms=unprofiled_ms,
                   unprofiled_mfu_pct=_r(100 * flops.model_flops / (unprofiled_ms / 1e3) / (flops.peak_tflops * 1e12)))
def cpu_steps(model: TraceModel, m: Metrics) -> list[CpuStep]:
    """Each step's CPU time, for a trace without a GPU timeline (its step is all CPU time: a table of GPU
    busy and GPU idle would say nothing); [] for a trace with one. The loader's wait and the collectives'
    count only where no op runs: the parts add up to the step."""
    ps = m.per_step
    if m.has_gpu or ps.empty:
        return []
    dl = m.dataloader
    loader = (dl["ts"].to_numpy(dtype=float), dl["end"].to_numpy(dtype=float)) if len(dl) else None
    plain, waiting = thread_time(model, m), thread_time(model, m, waits=loader)
    out = []
    for step, dur, ops, untraced, python in zip(ps["step"], ps["cpu_dur_us"], plain.op_us, plain.untraced_us,
                                                 waiting.untraced_us):
        loader_wait = max(0.0, untraced - python)
        collectives = max(0.0, dur - ops - untraced)
        out.append(CpuStep(step=int(step), ms=round(dur / 1e3, 3), in_ops_ms=round(ops / 1e3, 3),
                           loader_wait_ms=round(loader_wait / 1e3, 3), collective_wait_ms=round(collectives / 1e3, 3),
                           outside_ops_ms=round(python / 1e3, 3)))
    return out


def gpu_figures(model: TraceModel, m: Metrics) -> list[GpuFigures]:
    """Each GPU's own figures when one process drove several (empty for one GPU)."""
    return [GpuFigures(device=int(row.device), ops=int(row.ops), busy_pct=round(float(row.busy_pct), 2),
                       busy_in_steps_pct=round(float(row.busy_in_steps_pct), 2) if m.steps else None,
                       idle_ms=round(perstep.median(row.idle_us) / 1e3, 3))
            for row in device_table(model, m.steps, m.window, m.one_time_cut).itertuples()]


def one_time_note(m: Metrics) -> str | None:
    """What was kept out of the figures for one-time costs or a framework's evaluation and checkpoints, in
    one sentence (None: nothing was)."""
    if m.left_out_steps:
        one_time = any(not phases.is_phase(m.left_out.get(st.number, "")) for st in m.left_out_steps)
        why = ("one-time costs; the capture findings say how to capture steady state" if one_time
               else "the framework's evaluation or checkpointing, not training")
        return (f"Left out of every figure ({why}): "
                + "; ".join(f"step #{st.number} ({st.dur / 1e3:.1f} ms): {m.left_out.get(st.number, '')}"
                            for st in m.left_out_steps)
                + f". The figures describe the other {len(m.steps)} step{'s' if len(m.steps) != 1 else ''}.")
    cut = m.one_time_cut
    if cut is not None and len(cut[0]):
        where = "its only step" if m.steps else "the window"
        gone = float(iv.covered(*cut, [m.window[0]], [m.window[1]])[0])
        if m.one_time is not None and not m.one_time.costs:  # only the framework's phases were cut
            return (f"Every step holds the framework's evaluation or checkpointing: its {gone / 1e3:.1f} ms are cut out "
                    f"of {where}'s figures, which describe the remaining {float(m.per_step['dur_us'].sum()) / 1e3:.1f} ms.")
        return (f"No step without one-time costs remains: {gone / 1e3:.1f} ms of one-time costs are cut out of "
                f"{where}'s figures, which describe the remaining {float(m.per_step['dur_us'].sum()) / 1e3:.1f} ms.")
    return None


def _step_basis(m: Metrics) -> str:
    if not m.steps:
        return "no ProfilerStep annotations: the whole trace is one step"
    gpu = sum(st.gpu_bound for st in m.steps)
    if not gpu:
        return "CPU span of each ProfilerStep (the GPU kept up with the CPU)"
    return (f"GPU timeline: {gpu} of {len(m.steps)} steps took longer on the GPU than their CPU span "
            "(the CPU ran ahead); such a step lasts from its first GPU activity to the next step's")


def _r(v, nd=2):
    if v is None:
        return None
    return round(float(v), nd)

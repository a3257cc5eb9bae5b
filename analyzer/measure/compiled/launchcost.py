"""Where the launching thread's CPU time per kernel goes: the launch call itself, op dispatch (time
inside PyTorch ops outside their launch calls) and the rest (Python between ops, and anything the trace
did not record as an op). This, not the launch call alone, is what compilation or CUDA graphs remove.
"""

from __future__ import annotations

from gpuadvise.analyzer.model.calls import LAUNCH_CALLS

from ..basics import intervals as iv
from ..basics.metrics import Metrics


def cpu_per_kernel(model, metrics: Metrics, kernels: int) -> dict | None:
    """{"total_us", "launch_us", "dispatch_us", "other_us", "other_is_python"} per kernel over the steps'
    CPU windows (the whole window without steps), on the thread that launches the GPU work."""
    if not kernels or metrics.launch_thread is None:
        return None
    pid, tid = metrics.launch_thread
    lo, hi = metrics.cpu_window
    window = iv.union([lo], [hi])
    if metrics.one_time_cut is not None:  # one-time costs are no kernel's launch cost
        window = iv.subtract(window, metrics.one_time_cut)
    rt, cpu = model.runtime, model.cpu
    on = (rt["pid"] == pid) & (rt["tid"] == tid)
    launch = rt[on & rt["name"].isin(LAUNCH_CALLS)]
    launches = iv.intersect(iv.union(launch["ts"], launch["end"]), window)
    ops = cpu[(cpu["pid"] == pid) & (cpu["tid"] == tid) & ~cpu["is_annotation"].astype(bool)] if len(cpu) else cpu
    op_time = iv.intersect(iv.union(ops["ts"], ops["end"]), window) if len(ops) else (launches[0][:0], launches[1][:0])
    total = iv.total(*window)
    launch_us = iv.total(*launches)
    dispatch_us = iv.total(*iv.subtract(op_time, launches))
    other = max(total - launch_us - dispatch_us, 0.0)
    py = model.python
    return {"total_us": total / kernels, "launch_us": launch_us / kernels, "dispatch_us": dispatch_us / kernels,
            "other_us": other / kernels, "other_is_python": bool(len(py))}


def describe(cost: dict) -> str:
    other = "Python between ops" if cost["other_is_python"] else "outside any recorded op (Python, mostly)"
    parts = sorted([(cost["dispatch_us"], "PyTorch op dispatch"), (cost["other_us"], other),
                    (cost["launch_us"], "the launch call itself")], key=lambda p: -p[0])
    return (f"the launching thread spends {cost['total_us']:.1f} µs of CPU time per kernel: "
            + ", ".join(f"{us:.1f} µs {what}" for us, what in parts))

"""The tables every rule reads: the per-step table, HTA's temporal and idle breakdowns, launches (runtime
call ↔ GPU op), kernels and CPU ops by name, and copies. Definitions follow Holistic Trace Analysis (HTA)
where HTA has one (metrics.py says which); docs/rule-api.md lists every column with its unit."""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import intervals as iv
from .steps import Step, cpu_windows, launch_steps, step_of, step_windows
from gpuadvise.analyzer.model import collectives as coll
from gpuadvise.analyzer.model.calls import COPY_CALLS, COPY_NAME, LAUNCH_CALLS
from gpuadvise.analyzer.model.kernels import is_comm, is_matmul_like, precision_class
from gpuadvise.analyzer.model.trace import TraceModel, names_in

KERNEL_WAIT_US = 30.0  # HTA's consecutive_kernel_delay: a shorter gap between ops is the GPU's own


def temporal_breakdown(model: TraceModel, excluded=None) -> dict:
    """HTA's temporal breakdown; time in `excluded` (one-time costs, merged ranges) is left out of it."""
    gpu = model.gpu
    if gpu.empty:
        return {}
    region = iv.union([float(gpu["ts"].min())], [float(gpu["end"].max())])

    def inside(u):  # every GPU op lies in the region unless time was excluded from it
        return iv.total(*(iv.intersect(u, region) if excluded is not None else u))

    if excluded is not None:
        region = iv.subtract(region, excluded)
    span = max(iv.total(*region), 1e-9)
    busy = compute_us = 0.0
    devices = per_device(gpu)
    for ops in devices:  # one process on several GPUs: each device's time, averaged over them
        busy += inside(iv.union(ops["ts"], ops["end"])) / len(devices)
        kernels = ops[ops["kind"] == "kernel"]
        comm = kernels["name"].map(lambda n: is_comm(str(n))).astype(bool) if len(kernels) else pd.Series([], dtype=bool)
        compute = kernels[~comm.to_numpy()] if len(kernels) else kernels
        compute_us += inside(iv.union(compute["ts"], compute["end"])) / len(devices)
    idle = span - busy
    return {
        "kernel_time_us": span,
        "idle_us": idle,
        "compute_us": compute_us,
        "non_compute_us": span - compute_us - idle,
        "idle_pct": 100 * idle / span,
        "compute_pct": 100 * compute_us / span,
        "non_compute_pct": 100 * (span - compute_us - idle) / span,
        "busy_pct": 100 * busy / span,
    }


def per_step_table(model, steps, window, gpu_union, dataloader, syncs, cut=None) -> pd.DataFrame:
    """One row per step: its time on the GPU timeline (`start_us`, `dur_us`) and both figures it is
    made of (CPU span, GPU time); GPU work is measured in the step's window, CPU waits in its CPU span.
    Time in `cut` (one-time costs no step could be left out for) counts in none of the figures."""
    lo, hi = step_windows(steps, window)
    clo, chi = cpu_windows(steps, window)

    def covered(u, a, b):
        return iv.covered(*(iv.subtract(u, cut) if cut is not None else u), a, b)

    gone = iv.covered(*cut, lo, hi) if cut is not None else 0.0
    dur = hi - lo - gone
    gpu = model.gpu
    out = pd.DataFrame({
        "step": [s.number for s in steps] if steps else [-1],
        "start_us": lo,
        "dur_us": dur,
        "cpu_start_us": clo,
        "cpu_dur_us": chi - clo - (iv.covered(*cut, clo, chi) if cut is not None else 0.0),
        "gpu_start_us": [s.gpu_start for s in steps] if steps else [np.nan],
        "gpu_dur_us": [s.gpu_dur for s in steps] if steps else [dur[0]],
        "gpu_bound": [s.gpu_bound for s in steps] if steps else [False],
    })
    devices = per_device(gpu)
    # one process on several GPUs: each GPU column is the time of the average device (metrics.py)
    out["gpu_busy_us"] = covered(gpu_union, lo, hi) if len(devices) == 1 else \
        sum(covered(iv.union(ops["ts"], ops["end"]), lo, hi) for ops in devices) / len(devices)
    # time inside collectives: their kernels on the GPU and a CPU backend's (gloo's) spans from the call that
    # issued each, the one figure of the rank's communication per step (the job's view reads it too)
    host_ts, host_end = coll.host_spans(model.comms)
    for kind in ("kernel", "memcpy", "memset"):
        if kind == "kernel":
            out["comm_us"] = 0.0
        out[f"{kind}_us"] = 0.0
        for ops in devices:
            part = ops[ops["kind"] == kind]
            if kind == "kernel":
                comm = (part["name"].map(lambda n: is_comm(str(n))).astype(bool).to_numpy() if len(part)
                        else np.zeros(0, dtype=bool))
                out["comm_us"] += covered(iv.union(np.concatenate([part["ts"].to_numpy(dtype=float)[comm], host_ts]),
                                                   np.concatenate([part["end"].to_numpy(dtype=float)[comm], host_end])),
                                          lo, hi) / len(devices)
                part = part[~comm]
            out[f"{kind}_us"] += covered(iv.union(part["ts"], part["end"]), lo, hi) / len(devices)
    out["dataloader_us"] = covered(iv.union(dataloader["ts"], dataloader["end"]), clo, chi) if len(dataloader) else 0.0
    blocking = syncs[~syncs["profiler_sync"]] if len(syncs) else syncs
    out["sync_us"] = covered(iv.union(blocking["ts"], blocking["end"]), clo, chi) if len(blocking) else 0.0
    out["gpu_busy_pct"] = 100 * out["gpu_busy_us"] / np.maximum(dur, 1e-9)
    out["idle_us"] = dur - out["gpu_busy_us"]
    return out


def per_device(gpu: pd.DataFrame) -> list[pd.DataFrame]:
    """The GPU ops by the device they ran on, devices ascending: one frame (all of `gpu`) for a trace of
    one GPU."""
    dev = gpu["device"].to_numpy()
    ids = np.unique(dev)
    return [gpu] if len(ids) < 2 else [gpu[dev == d] for d in ids.tolist()]


def device_table(model: TraceModel, steps: list[Step], window, cut=None) -> pd.DataFrame:
    """One row per GPU of a process that drove several (empty for one): `device`, `ops` (kernels, copies
    and memsets), `busy_pct` (its busy time over the GPU span of the whole trace, every device's, time in
    `cut` left out: the temporal breakdown's figure), `busy_in_steps_pct` (over the steps' windows) and
    `idle_us` (its idle time in each step, a list in step order)."""
    cols = ["device", "ops", "busy_pct", "busy_in_steps_pct", "idle_us"]
    gpu = model.gpu
    devices = per_device(gpu) if len(gpu) else []
    if len(devices) < 2:
        return pd.DataFrame(columns=cols)
    lo, hi = step_windows(steps, window)
    region = iv.union([float(gpu["ts"].min())], [float(gpu["end"].max())])
    if cut is not None:
        region = iv.subtract(region, cut)
    span = max(iv.total(*region), 1e-9)
    dur = hi - lo - (iv.covered(*cut, lo, hi) if cut is not None else 0.0)
    rows = []
    for ops in devices:
        busy = iv.union(ops["ts"], ops["end"])
        if cut is not None:
            busy = iv.subtract(busy, cut)
        in_steps = iv.covered(*busy, lo, hi)
        rows.append((int(ops["device"].iloc[0]), len(ops), 100 * iv.total(*iv.intersect(busy, region)) / span,
                     100 * float(in_steps.sum()) / max(float(dur.sum()), 1e-9), [float(x) for x in dur - in_steps]))
    return pd.DataFrame(rows, columns=cols)


GAP_KINDS = ("host_wait", "kernel_wait", "other")  # stream_gaps' `kind`, by code


def idle_breakdown(model: TraceModel, launches: pd.DataFrame, excluded=None) -> pd.DataFrame:
    """Per stream, its gaps split as HTA does; gap time inside `excluded` (one-time costs) is left out."""
    cols = ["stream", "idle_us", "host_wait_us", "kernel_wait_us", "other_us"]
    rows = []
    for stream, _, _, dur, code in _gaps_by_stream(model, launches, excluded):
        if not len(dur):
            continue
        # the sums pandas makes of the stream's rows of stream_gaps, grouped by kind, with the kinds as codes
        d = pd.Series(dur)
        by = d.groupby(code).sum()
        rows.append((stream, float(d.sum()), *(float(by.get(i, 0.0)) for i in range(len(GAP_KINDS)))))
    return pd.DataFrame(rows, columns=cols)


def stream_gaps(model: TraceModel, launches: pd.DataFrame, excluded=None) -> pd.DataFrame:
    """Every gap between consecutive ops of a stream (streams with at least two ops), split as HTA does:
    `stream`, `ts`, `end`, `dur` (µs) and `kind`: "host_wait" (the launch came after the previous op
    ended), "kernel_wait" (other gaps shorter than KERNEL_WAIT_US) or "other". Gap time inside `excluded`
    (one-time costs cut out of the figures, warmup.py) is left out of `dur`."""
    cols = ["stream", "ts", "end", "dur", "kind"]
    kinds = np.array(GAP_KINDS)
    parts = [pd.DataFrame({"stream": stream, "ts": ts, "end": end, "dur": dur, "kind": kinds[code]})
             for stream, ts, end, dur, code in _gaps_by_stream(model, launches, excluded)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def _gaps_by_stream(model: TraceModel, launches: pd.DataFrame, excluded=None):
    """Per stream with at least two ops, streams ascending: `(stream, starts, ends, durations, kind codes
    into GAP_KINDS)` of its gaps longer than zero, in start order."""
    gpu = model.gpu
    if gpu.empty:
        return
    launch_ts = launches.set_index("correlation")["launch_ts"] if len(launches) else pd.Series(dtype=float)
    # the ops in start order (the order sort_values("ts") gives, ties included), then per stream in that
    # order, streams ascending: columns picked out as arrays, not the frame copied and grouped
    all_ts = gpu["ts"].to_numpy()
    order = np.argsort(all_ts, kind="quicksort")
    all_end, all_corr, by_stream = gpu["end"].to_numpy(), gpu["correlation"].to_numpy(), gpu["stream"].to_numpy()[order]
    for stream in np.unique(by_stream).tolist():
        rows = order[by_stream == stream]
        if len(rows) < 2:
            continue
        ts, end = all_ts[rows], all_end[rows]
        prev_end = np.maximum.accumulate(end)[:-1]
        gap = ts[1:] - prev_end
        if excluded is not None:
            gap = gap - iv.covered(*excluded, prev_end, ts[1:])
        pos = gap > 0
        corr = all_corr[rows][1:]
        rt = launch_ts.reindex(corr).to_numpy() if len(launch_ts) else np.full(corr.shape, np.nan)
        host = rt > prev_end
        code = np.where(host, 0, np.where(gap < KERNEL_WAIT_US, 1, 2))
        yield int(stream), prev_end[pos], ts[1:][pos], gap[pos], code[pos]


def launch_stats(model: TraceModel) -> pd.DataFrame:
    rt, gpu = model.runtime, model.gpu
    cols = ["correlation", "call", "launch_ts", "launch_end", "cpu_us", "gpu_name", "gpu_ts", "gpu_us", "delay_us", "stream", "tid"]
    if rt.empty or gpu.empty:
        return pd.DataFrame(columns=cols)
    calls = rt[rt["correlation"] >= 0]
    calls = calls.drop_duplicates("correlation")
    ops = gpu[gpu["correlation"] >= 0].drop_duplicates("correlation")
    j = calls[["correlation", "name", "ts", "end", "dur", "tid"]].merge(
        ops[["correlation", "name", "ts", "dur", "stream"]], on="correlation", suffixes=("_rt", "_gpu"))
    out = pd.DataFrame({
        "correlation": j["correlation"],
        "call": j["name_rt"],
        "launch_ts": j["ts_rt"],
        "launch_end": j["end"],
        "cpu_us": j["dur_rt"],
        "gpu_name": j["name_gpu"],
        "gpu_ts": j["ts_gpu"],
        "gpu_us": j["dur_gpu"],
        "delay_us": np.clip(j["ts_gpu"] - j["end"], 0, None),
        "stream": j["stream"],
        "tid": j["tid"],
    })
    return out


def launch_thread(model: TraceModel) -> tuple[int, int] | None:
    """(pid, tid) of the thread that issues most GPU work: the training loop's thread."""
    rt = model.runtime
    if rt.empty:
        return None
    work = rt[names_in(rt["name"], LAUNCH_CALLS | COPY_CALLS)]
    if work.empty:
        work = rt
    pid, tid = work.groupby(["pid", "tid"]).size().idxmax()
    return int(pid), int(tid)


def kernel_table(model: TraceModel, leave_out=None) -> pd.DataFrame:
    """Per kernel name; `leave_out`: correlation ids of launches that are not the loop's (the compiler's)."""
    k = model.kernels
    if leave_out is not None and len(leave_out):
        k = k[~k["correlation"].isin(leave_out)]
    cols = ["name", "count", "total_us", "mean_us", "median_us", "share_pct", "matmul", "precision", "comm"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    g = k.groupby("name", observed=True)["dur"].agg(["count", "sum", "mean", "median"]).reset_index()
    g.columns = ["name", "count", "total_us", "mean_us", "median_us"]
    g["name"] = g["name"].astype(str)
    g["share_pct"] = 100 * g["total_us"] / max(g["total_us"].sum(), 1e-9)
    g["comm"] = g["name"].map(is_comm)
    g["matmul"] = g["name"].map(is_matmul_like)
    g["precision"] = [precision_class(n) if m else "" for n, m in zip(g["name"], g["matmul"])]
    return g.sort_values("total_us", ascending=False, ignore_index=True)


def op_table(model: TraceModel) -> pd.DataFrame:
    cpu = model.cpu
    cols = ["name", "count", "total_us", "mean_us"]
    if cpu.empty:
        return pd.DataFrame(columns=cols)
    ops = cpu[~cpu["is_annotation"]]
    g = ops.groupby("name", observed=True)["dur"].agg(["count", "sum", "mean"]).reset_index()
    g.columns = cols
    g["name"] = g["name"].astype(str)
    return g.sort_values("total_us", ascending=False, ignore_index=True)


def copy_table(model: TraceModel, steps: list[Step]) -> pd.DataFrame:
    gpu = model.gpu
    g = gpu[gpu["kind"] != "kernel"].copy()
    cols = ["name", "kind", "ts", "end", "dur", "bytes", "direction", "src", "dst", "step", "correlation", "call"]
    if g.empty:
        return pd.DataFrame(columns=cols)
    # parse each distinct name once, then spread by category code
    cats = g["name"].astype(str).astype("category") if g["name"].dtype != "category" else g["name"].cat.remove_unused_categories()
    parsed = pd.Series(cats.cat.categories.astype(str)).str.extract(COPY_NAME).fillna("")
    codes = cats.cat.codes.to_numpy()
    names = cats.astype(str)
    for col, part in (("direction", 0), ("src", 1), ("dst", 2)):
        g[col] = parsed[part].to_numpy(dtype=object)[codes]
    g["kind"] = g["kind"].astype(str)
    g["name"] = names
    calls = model.runtime[["correlation", "name", "ts"]].drop_duplicates("correlation")
    g = g.merge(calls.rename(columns={"name": "call", "ts": "call_ts"}), on="correlation", how="left")
    g["call"] = g["call"].astype(object).fillna("").astype(str)
    # a copy belongs to the step that issued it, wherever the GPU got to it; without a call, by its own time
    call_ts = g["call_ts"].to_numpy(dtype=float)
    by_call = launch_steps(steps, np.nan_to_num(call_ts, nan=-np.inf))
    g["step"] = np.where(np.isfinite(call_ts), by_call, step_of(g["ts"].to_numpy(), steps))
    return g[cols]


def copy_summary(copies: pd.DataFrame) -> pd.DataFrame:
    cols = ["kind", "direction", "src", "dst", "count", "bytes", "total_us", "gbps"]
    if copies.empty:
        return pd.DataFrame(columns=cols)
    g = copies.groupby(["kind", "direction", "src", "dst"], dropna=False).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), total_us=("dur", "sum")).reset_index()
    g["gbps"] = g["bytes"] / np.maximum(g["total_us"], 1e-9) / 1e3
    return g.sort_values("total_us", ascending=False, ignore_index=True)

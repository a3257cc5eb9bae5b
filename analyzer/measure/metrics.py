"""Metrics computed once per trace from the model; the rules and every renderer read these.

Every table's columns, with types and units, are listed in docs/rule-api.md (a test holds the two
together: a column added here without a line there fails tests/test_rule_api.py). The call-name lists
the tables are built from live in analyzer/model/calls.py.

Definitions follow Holistic Trace Analysis (HTA) where HTA has one:
- temporal breakdown: `kernel_time` = first GPU op start → last GPU op end (all streams); idle =
  kernel_time − |∪ GPU ops|; compute = |∪ non-communication kernels|; non-compute = the rest.
  `gpu_busy_pct` = 100 − idle %. (Unlike HTA, Kineto `cuda_sync` events never count as busy.)
- idle breakdown per stream: a gap before a GPU op is *host wait* when the runtime call that launched
  the op started after the previous op on the stream ended; else *kernel wait* when the gap is shorter
  than 30 µs (HTA's `consecutive_kernel_delay`, which HTA documents as ns but applies in µs); else *other*.
- launch stats: runtime call ↔ GPU op by correlation; launch delay = op start − runtime call end.

Steps are measured on the GPU timeline, not only on the CPU one (HTA, and the TensorBoard plugin, use
the CPU `ProfilerStep#N` spans). When the training thread runs ahead of the GPU, as it does in a loop
without syncs, the CPU span of a step says nothing about its cost: the GPU is still busy with earlier
steps. So each GPU op belongs to the step whose CPU span launched it (runtime call ↔ op correlation), a
step's GPU time runs from its first GPU activity to the next step's first GPU activity, or to the end of
its own GPU work when that comes first (the GPU then waited for the CPU, whose span counts that wait),
and a step takes the longer of its CPU span and its GPU time.
Both figures are kept (`Step.cpu_dur`, `Step.gpu_dur`); every per-step figure and every share of step
time uses `Step.dur`. CPU-side quantities (DataLoader waits, syncs) are measured in the CPU span.

One-time costs (first-call module loading, autotuning, allocator warm-up, a slow first step: warmup.py)
are kept out of every figure here, so no rule or renderer reads the job's start as its steady state: the
steps they make up a tenth of are left out (`steps` holds the others, `left_out_steps` these), as long
as one step remains; otherwise their time ranges (`one_time_cut`) are cut out of the window's figures
(per-step table, temporal and idle breakdowns) and of the replay. `one_time` says what was found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import intervals as iv
from .warmup import SteadyPlan, plan
from gpuadvise.analyzer.model.calls import ASYNC_COPIES, COPY_CALLS, COPY_NAME, DATALOADER, DEVICE_SYNCS, LAUNCH_CALLS, STEP, SYNC_CALLS
from gpuadvise.analyzer.model.kernels import is_comm, is_matmul_like, precision_class
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in

KERNEL_WAIT_US = 30.0
IMPLICIT_WAIT_US = 50.0  # a pageable copy call this much longer than its copy waited for earlier GPU work


@dataclass
class Step:
    number: int
    start: float  # the CPU span: the ProfilerStep annotation on the training thread
    end: float
    gpu_start: float = float("nan")  # first GPU activity of the work launched in the CPU span
    gpu_end: float = float("nan")  # the next step's first GPU activity, or its own work's end if sooner

    @property
    def cpu_dur(self) -> float:
        return self.end - self.start

    @property
    def gpu_dur(self) -> float:
        return self.gpu_end - self.gpu_start if np.isfinite(self.gpu_start) and np.isfinite(self.gpu_end) else 0.0

    @property
    def gpu_bound(self) -> bool:
        """The GPU, not the CPU, set this step's pace."""
        return self.gpu_dur > self.cpu_dur

    @property
    def dur(self) -> float:
        """What the step costs: the slower of the CPU span and the GPU time."""
        return max(self.cpu_dur, self.gpu_dur)

    @property
    def window(self) -> tuple[float, float]:
        """Where on the timeline the step's time is spent: its GPU time when that is longer, else its CPU span."""
        return (self.gpu_start, self.gpu_end) if self.gpu_bound else (self.start, self.end)


@dataclass
class Metrics:
    window: tuple[float, float]
    steps: list[Step]
    has_gpu: bool
    per_step: pd.DataFrame  # one row per step (or one for the whole window when there are no steps)
    temporal: dict  # HTA temporal breakdown over the whole trace
    idle_breakdown: pd.DataFrame  # per stream
    kernels: pd.DataFrame  # per kernel name
    ops: pd.DataFrame  # per CPU op name (top level time)
    copies: pd.DataFrame  # every memcpy/memset with parsed direction and memory kinds
    copy_summary: pd.DataFrame  # grouped by kind, direction, src, dst
    syncs: pd.DataFrame  # blocking calls with where they came from
    launches: pd.DataFrame  # runtime launch ↔ GPU op joins
    dataloader: pd.DataFrame  # DataLoader __next__ spans
    gpu_union: tuple[np.ndarray, np.ndarray]
    launch_thread: tuple[int, int] | None
    notes: list[str] = field(default_factory=list)
    one_time: SteadyPlan | None = None  # one-time costs found, and how they are kept out (warmup.plan)
    left_out_steps: list[Step] = field(default_factory=list)  # steps left out of every figure for them

    @property
    def left_out(self) -> dict[int, str]:
        """Step number → why it was left out of the figures (one-time costs)."""
        return dict(self.one_time.left_out) if self.one_time is not None else {}

    @property
    def one_time_cut(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Time ranges cut out of the window's figures when no step without a one-time cost remains."""
        return self.one_time.cut if self.one_time is not None else None

    @property
    def median_step_us(self) -> float:
        """The median step time on the GPU timeline (see the module docstring)."""
        return float(self.per_step["dur_us"].median()) if len(self.per_step) else 0.0

    @property
    def median_cpu_step_us(self) -> float:
        """The median CPU span (ProfilerStep) of the steps: what HTA and TensorBoard call the step time."""
        return float(self.per_step["cpu_dur_us"].median()) if len(self.per_step) else 0.0

    @property
    def median_gpu_step_us(self) -> float:
        return float(self.per_step["gpu_dur_us"].median()) if len(self.per_step) else 0.0

    @property
    def cpu_window(self) -> tuple[float, float]:
        """From the first step's CPU start to the last step's CPU end (the window without steps)."""
        return (self.steps[0].start, self.steps[-1].end) if self.steps else self.window

    @property
    def window_us(self) -> float:
        return self.window[1] - self.window[0]

    @property
    def gpu_busy_pct(self) -> float | None:
        return self.temporal.get("busy_pct")

    @property
    def busy_in_steps_pct(self) -> float | None:
        if not self.has_gpu or self.per_step.empty:
            return None
        return float(100 * self.per_step["gpu_busy_us"].sum() / max(self.per_step["dur_us"].sum(), 1e-9))


def compute(model: TraceModel, steady: bool = True) -> Metrics:
    """The trace's metrics, with one-time costs kept out of them (module docstring); `steady=False`
    measures everything as recorded."""
    full = _compute(model)
    if not steady:
        return full
    p = plan(model, full) if full.has_gpu else None  # without a GPU timeline nothing is a GPU job's start
    if p is None or not p.costs:
        return full
    m = _compute(model, set(p.left_out), p.cut) if p.left_out or p.cut is not None else full
    m.one_time = p
    return m


def _compute(model: TraceModel, leave_out: set[int] | None = None, cut=None) -> Metrics:
    launches = launch_stats(model)
    every = gpu_timeline(find_steps(model), launches)  # GPU times from every step: a left-out one still ends the one before
    steps = [s for s in every if s.number not in (leave_out or ())]
    dropped = [s for s in every if s.number in (leave_out or ())]
    window = _window(model, steps)
    gpu = model.gpu
    has_gpu = len(gpu) > 0
    gpu_union = iv.union(gpu["ts"].to_numpy(), gpu["end"].to_numpy())
    dl = dataloader_spans(model, steps)
    copies = copy_table(model, steps)
    syncs = sync_table(model, steps)
    # what whole-trace figures leave out: the cut ranges, or the left-out steps' time
    excluded = cut if cut is not None else (iv.union([min(s.start, s.window[0]) for s in dropped],
                                                     [max(s.end, s.window[1]) for s in dropped]) if dropped else None)
    metrics = Metrics(
        window=window,
        steps=steps,
        has_gpu=has_gpu,
        per_step=per_step_table(model, steps, window, gpu_union, dl, syncs, cut),
        temporal=temporal_breakdown(model, excluded),
        idle_breakdown=idle_breakdown(model, launches, excluded),
        kernels=kernel_table(model),
        ops=op_table(model),
        copies=copies,
        copy_summary=copy_summary(copies),
        syncs=syncs,
        launches=launches,
        dataloader=dl,
        gpu_union=gpu_union,
        launch_thread=launch_thread(model),
        left_out_steps=dropped,
    )
    return metrics


# ----------------------------------------------------------------------------------------------------
# Steps and windows


def find_steps(model: TraceModel) -> list[Step]:
    cpu = model.cpu
    if cpu.empty:
        return []
    mask = name_mask(cpu["name"], lambda n: n.startswith("ProfilerStep#"))
    if not mask.any():
        return []
    rows = cpu[mask]
    seen: dict[int, Step] = {}
    for name, ts, end in zip(rows["name"].astype(str), rows["ts"], rows["end"]):
        m = STEP.match(name)
        if not m:
            continue
        n = int(m.group(1))
        if n not in seen or end - ts > seen[n].cpu_dur:  # duplicated annotations: keep the CPU-side span
            seen[n] = Step(n, float(ts), float(end))
    return sorted(seen.values(), key=lambda s: s.start)


def launch_steps(steps: list[Step], launch_ts: np.ndarray) -> np.ndarray:
    """Index of the step whose CPU span launched each call (−1: before the first step or after the last).

    A call between two steps' spans belongs to the earlier step: it is part of that iteration."""
    if not steps:
        return np.full(len(launch_ts), -1, dtype=np.int64)
    starts = np.array([s.start for s in steps])
    k = np.searchsorted(starts, launch_ts, side="right") - 1
    after_last = (k == len(steps) - 1) & (launch_ts >= steps[-1].end)
    return np.where((k >= 0) & ~after_last, k, -1)


def gpu_timeline(steps: list[Step], launches: pd.DataFrame) -> list[Step]:
    """Give each step its GPU time: from the first GPU activity it launched to the next step's first
    GPU activity, or to the end of its own GPU work when that comes first (always for the last step)."""
    if not steps or launches.empty:
        return steps
    k = launch_steps(steps, launches["launch_ts"].to_numpy(dtype=float))
    mine = k >= 0
    k = k[mine]
    ts = launches["gpu_ts"].to_numpy(dtype=float)[mine]
    end = ts + launches["gpu_us"].to_numpy(dtype=float)[mine]
    first = np.full(len(steps), np.inf)
    last = np.full(len(steps), -np.inf)
    np.minimum.at(first, k, ts)
    np.maximum.at(last, k, end)
    has = np.isfinite(first)
    # the next step (with GPU work) of each step, scanning from the end
    nxt = np.full(len(steps), np.nan)
    upcoming = np.nan
    for i in range(len(steps) - 1, -1, -1):
        nxt[i] = upcoming
        if has[i]:
            upcoming = first[i]
    out = []
    for i, s in enumerate(steps):
        if not has[i]:
            out.append(s)
            continue
        # to the next step's first GPU activity (the GPU moved straight on: its time is this step's), but
        # no further than the end of this step's own work: a GPU that then waited for the CPU to launch
        # the next step spent CPU time, which the CPU spans already count
        gpu_end = min(max(nxt[i], first[i]), last[i]) if np.isfinite(nxt[i]) else last[i]
        out.append(Step(s.number, s.start, s.end, float(first[i]), float(gpu_end)))
    return out


def _window(model: TraceModel, steps: list[Step]) -> tuple[float, float]:
    if steps:
        wins = [s.window for s in steps]
        return min(w[0] for w in wins), max(w[1] for w in wins)
    lo, hi = np.inf, -np.inf
    for df in (model.gpu, model.runtime, model.cpu):
        if len(df):
            lo = min(lo, float(df["ts"].min()))
            hi = max(hi, float(df["end"].max()))
    if lo == np.inf:
        return 0.0, 0.0
    return lo, hi


def step_windows(metrics_steps: list[Step], window: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's window on the timeline (`Step.window`), or the whole window without steps."""
    if metrics_steps:
        return (np.array([s.window[0] for s in metrics_steps]), np.array([s.window[1] for s in metrics_steps]))
    return np.array([window[0]]), np.array([window[1]])


def cpu_windows(metrics_steps: list[Step], window: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's CPU span, or the whole window without steps."""
    if metrics_steps:
        return (np.array([s.start for s in metrics_steps]), np.array([s.end for s in metrics_steps]))
    return np.array([window[0]]), np.array([window[1]])


# ----------------------------------------------------------------------------------------------------
# GPU time


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
    busy = inside(iv.union(gpu["ts"], gpu["end"]))
    kernels = gpu[gpu["kind"] == "kernel"]
    comm = kernels["name"].map(lambda n: is_comm(str(n))).astype(bool) if len(kernels) else pd.Series([], dtype=bool)
    compute = kernels[~comm.to_numpy()] if len(kernels) else kernels
    compute_us = inside(iv.union(compute["ts"], compute["end"]))
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
    out["gpu_busy_us"] = covered(gpu_union, lo, hi)
    for kind in ("kernel", "memcpy", "memset"):
        part = gpu[gpu["kind"] == kind]
        if kind == "kernel" and len(part):
            comm = part["name"].map(lambda n: is_comm(str(n))).astype(bool).to_numpy()
            out["comm_us"] = covered(iv.union(part["ts"][comm], part["end"][comm]), lo, hi)
            part = part[~comm]
        elif kind == "kernel":
            out["comm_us"] = 0.0
        out[f"{kind}_us"] = covered(iv.union(part["ts"], part["end"]), lo, hi)
    out["dataloader_us"] = covered(iv.union(dataloader["ts"], dataloader["end"]), clo, chi) if len(dataloader) else 0.0
    blocking = syncs[~syncs["profiler_sync"]] if len(syncs) else syncs
    out["sync_us"] = covered(iv.union(blocking["ts"], blocking["end"]), clo, chi) if len(blocking) else 0.0
    out["gpu_busy_pct"] = 100 * out["gpu_busy_us"] / np.maximum(dur, 1e-9)
    out["idle_us"] = dur - out["gpu_busy_us"]
    return out


def idle_breakdown(model: TraceModel, launches: pd.DataFrame, excluded=None) -> pd.DataFrame:
    """Per stream, its gaps split as HTA does; gap time inside `excluded` (one-time costs) is left out."""
    cols = ["stream", "idle_us", "host_wait_us", "kernel_wait_us", "other_us"]
    rows = []
    for stream, g in stream_gaps(model, launches, excluded).groupby("stream", sort=True):
        by = g.groupby("kind")["dur"].sum()
        rows.append((int(stream), float(g["dur"].sum()), *(float(by.get(k, 0.0)) for k in ("host_wait", "kernel_wait", "other"))))
    return pd.DataFrame(rows, columns=cols)


def stream_gaps(model: TraceModel, launches: pd.DataFrame, excluded=None) -> pd.DataFrame:
    """Every gap between consecutive ops of a stream (streams with at least two ops), split as HTA does:
    `stream`, `ts`, `end`, `dur` (µs) and `kind`: "host_wait" (the launch came after the previous op
    ended), "kernel_wait" (other gaps shorter than KERNEL_WAIT_US) or "other". Gap time inside `excluded`
    (one-time costs cut out of the figures, warmup.py) is left out of `dur`."""
    gpu = model.gpu
    cols = ["stream", "ts", "end", "dur", "kind"]
    if gpu.empty:
        return pd.DataFrame(columns=cols)
    launch_ts = launches.set_index("correlation")["launch_ts"] if len(launches) else pd.Series(dtype=float)
    parts = []
    for stream, g in gpu.sort_values("ts").groupby("stream", sort=True):
        if len(g) < 2:
            continue
        ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
        prev_end = np.maximum.accumulate(end)[:-1]
        gap = ts[1:] - prev_end
        if excluded is not None:
            gap = gap - iv.covered(*excluded, prev_end, ts[1:])
        pos = gap > 0
        corr = g["correlation"].to_numpy()[1:]
        rt = launch_ts.reindex(corr).to_numpy() if len(launch_ts) else np.full(corr.shape, np.nan)
        host = rt > prev_end
        kind = np.where(host, "host_wait", np.where(gap < KERNEL_WAIT_US, "kernel_wait", "other"))
        parts.append(pd.DataFrame({"stream": int(stream), "ts": prev_end[pos], "end": ts[1:][pos], "dur": gap[pos],
                                   "kind": kind[pos]}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


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


# ----------------------------------------------------------------------------------------------------
# Aggregates


def kernel_table(model: TraceModel) -> pd.DataFrame:
    k = model.kernels
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


def _in_window(ts: np.ndarray, steps: list[Step]) -> np.ndarray:
    """Index of the step containing each timestamp, -1 outside every step (all 0 without steps)."""
    if not steps:
        return np.zeros(len(ts), dtype=np.int64)
    starts = np.array([s.start for s in steps])
    ends = np.array([s.end for s in steps])
    k = np.searchsorted(starts, ts, side="right") - 1
    ok = (k >= 0) & (ts < ends[np.clip(k, 0, None)])
    return np.where(ok, k, -1)


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
    g["step"] = np.where(np.isfinite(call_ts), by_call, _in_window(g["ts"].to_numpy(), steps))
    return g[cols]


def copy_summary(copies: pd.DataFrame) -> pd.DataFrame:
    cols = ["kind", "direction", "src", "dst", "count", "bytes", "total_us", "gbps"]
    if copies.empty:
        return pd.DataFrame(columns=cols)
    g = copies.groupby(["kind", "direction", "src", "dst"], dropna=False).agg(
        count=("dur", "size"), bytes=("bytes", "sum"), total_us=("dur", "sum")).reset_index()
    g["gbps"] = g["bytes"] / np.maximum(g["total_us"], 1e-9) / 1e3
    return g.sort_values("total_us", ascending=False, ignore_index=True)


def sync_table(model: TraceModel, steps: list[Step]) -> pd.DataFrame:
    """Every call that blocks the CPU on the GPU, with its op, source and step."""
    rt = model.runtime
    cols = ["name", "kind", "ts", "end", "dur", "tid", "external_id", "step", "profiler_sync", "op", "source"]
    if rt.empty:
        return pd.DataFrame(columns=cols)
    mask = names_in(rt["name"], SYNC_CALLS.keys())
    s = rt[mask].copy()
    s["name"] = s["name"].astype(str)
    s["kind"] = s["name"].astype(str).map(lambda n: SYNC_CALLS.get(n, "blocking copy"))
    implicit = _implicit_syncs(model)
    if len(implicit):
        s = pd.concat([s, implicit])
    if s.empty:
        return pd.DataFrame(columns=cols)
    s["name"] = s["name"].astype(str)
    s = s.sort_values("ts", ignore_index=True)
    s["step"] = _in_window(s["ts"].to_numpy(), steps)
    s["profiler_sync"] = _profiler_final_sync(model, s, steps)
    s["op"], s["source"] = attribute(model, s)
    return s[cols]


def _implicit_syncs(model: TraceModel) -> pd.DataFrame:
    """Async copies that are syncs in disguise. A device→pageable copy (`.cpu()`, `.tolist()`, printing a
    tensor) always returns only once the stream has drained; a pageable host→device copy does when the
    call waited for earlier GPU work rather than for its own staging (the call outlasting its own copy
    by IMPLICIT_WAIT_US and by the copy's own time)."""
    rt, gpu = model.runtime, model.gpu
    copies = gpu[(gpu["kind"] == "memcpy") & name_mask(gpu["name"], lambda n: "Pageable" in n)]
    if copies.empty:
        return rt.iloc[0:0]
    calls = rt[names_in(rt["name"], ASYNC_COPIES) & rt["correlation"].isin(copies["correlation"])].copy()
    if calls.empty:
        return calls
    by_corr = copies.groupby("correlation").agg(name=("name", "first"), dur=("dur", "sum"))
    copy_name = calls["correlation"].map(by_corr["name"]).astype(str)
    copy_dur = calls["correlation"].map(by_corr["dur"]).to_numpy(dtype=np.float64)
    to_pageable = copy_name.str.contains("-> Pageable", regex=False).to_numpy()
    waited = calls["dur"].to_numpy() > np.maximum(2 * copy_dur, copy_dur + IMPLICIT_WAIT_US)
    calls = calls[to_pageable | waited]
    calls["kind"] = np.where(copy_name[to_pageable | waited].str.contains("-> Pageable", regex=False),
                             "pageable device→host copy", "pageable host→device copy (waits for the stream)")
    return calls


def _profiler_final_sync(model: TraceModel, s: pd.DataFrame, steps: list[Step]) -> np.ndarray:
    """The device sync torch.profiler issues when it stops: the last device sync, with no launch after it."""
    flag = np.zeros(len(s), dtype=bool)
    dev = np.flatnonzero(s["name"].isin(DEVICE_SYNCS).to_numpy())
    if dev.size == 0:
        return flag
    last = dev[-1]
    ts = s["ts"].iloc[last]
    rt = model.runtime
    later = rt[(rt["ts"] > ts) & names_in(rt["name"], LAUNCH_CALLS | COPY_CALLS)]
    outside_steps = not steps or ts >= steps[-1].end
    if later.empty or outside_steps:
        flag[last] = True
    return flag


def attribute(model: TraceModel, calls: pd.DataFrame) -> tuple[list, list]:
    """For each call: the innermost CPU op around it, and the user source line when the trace has one."""
    cpu = model.cpu
    ops, sources = [], []
    if cpu.empty:
        return [""] * len(calls), [""] * len(calls)
    real = cpu[~cpu["is_annotation"]]
    by_tid = {tid: g for tid, g in real.groupby("tid")}
    for ts, end, tid in zip(calls["ts"].to_numpy(), calls["end"].to_numpy(), calls["tid"].to_numpy()):
        g = by_tid.get(tid)
        op, src = "", ""
        if g is not None:
            inside = g[(g["ts"] <= ts) & (g["end"] >= end)]
            if len(inside):
                # innermost = latest start; nested ops often share a start µs, then the shorter one is inner
                nest = inside.sort_values(["ts", "end"], ascending=[True, False])
                op = str(nest["name"].iloc[-1])
                stacks = [user_frame_from_stack(str(x)) for x in nest["call_stack"].iloc[::-1]]
                src = next((x for x in stacks if x), "")
        if not src:
            src = python_source(model, ts, end, tid)
        ops.append(op)
        sources.append(src)
    return ops, sources


_LIBRARY = re.compile(r"site-packages|dist-packages|/torch/|/lib/python\d|<built-in|^torch/|threading\.py|runpy\.py|/gpuadvise/")


def user_frame_from_stack(stack: str) -> str:
    """Innermost user frame of a legacy `Call stack` string ("file(line): func;…", innermost first)."""
    if not stack or stack == "nan":
        return ""
    for frame in stack.split(";"):
        frame = frame.strip()
        if frame and not _LIBRARY.search(frame):
            return frame
    return ""


def python_source(model: TraceModel, ts: float, end: float, tid: int) -> str:
    """Innermost user python_function frame (with_stack=True) enclosing [ts, end] on thread tid."""
    py = model.python
    if py.empty:
        return ""
    frames = py[(py["ts"] <= ts) & (py["end"] >= end)]
    if tid in set(frames["tid"]):
        frames = frames[frames["tid"] == tid]
    best = ""
    for name in frames.sort_values("ts")["name"].astype(str):
        if not _LIBRARY.search(name) and "(" in name:
            best = name  # keep going: later (inner) user frames are more precise
    return best


def dataloader_spans(model: TraceModel, steps: list[Step]) -> pd.DataFrame:
    cpu = model.cpu
    cols = ["name", "ts", "end", "dur", "tid", "step", "single_process", "source"]
    if cpu.empty:
        return pd.DataFrame(columns=cols)
    mask = name_mask(cpu["name"], DATALOADER.match)
    d = cpu[mask].copy()
    if d.empty:
        return pd.DataFrame(columns=cols)
    d["name"] = d["name"].astype(str)
    d["step"] = _in_window(d["ts"].to_numpy(), steps)
    d["single_process"] = d["name"].str.contains("SingleProcess")
    d["source"] = [user_frame_from_stack(str(s)) for s in d["call_stack"]]
    missing = d["source"] == ""
    if missing.any() and not model.python.empty:
        d.loc[missing, "source"] = [python_source(model, t, e, tid) for t, e, tid in
                                     zip(d["ts"][missing], d["end"][missing], d["tid"][missing])]
    return d.sort_values("ts", ignore_index=True)[cols]


def annotation_spans(model: TraceModel, prefix: str) -> pd.DataFrame:
    """CPU ops/annotations whose name starts with `prefix` (e.g. "Optimizer.step#")."""
    cpu = model.cpu
    if cpu.empty:
        return cpu
    out = cpu[name_mask(cpu["name"], lambda n: n.startswith(prefix))].copy()
    out["name"] = out["name"].astype(str)
    return out


def ops_inside(model: TraceModel, spans: pd.DataFrame, names: set[str] | None = None) -> pd.DataFrame:
    """CPU ops (optionally only these names) that lie inside any of the spans, on the span's thread."""
    cpu = model.cpu
    if cpu.empty or spans.empty:
        return cpu.iloc[0:0]
    ops = cpu[~cpu["is_annotation"]]
    if names is not None:
        ops = ops[names_in(ops["name"], names)]
    keep = _inside_any(ops["ts"].to_numpy(), ops["tid"].to_numpy(), spans, ends=ops["end"].to_numpy())
    return ops[keep]


def _inside_any(ts: np.ndarray, tid: np.ndarray, spans: pd.DataFrame, ends: np.ndarray | None = None) -> np.ndarray:
    """Which items [ts, ends] (or instants at ts when `ends` is None) lie inside some span on their thread.

    Per thread, spans sorted by start with a running maximum of their ends: an item is inside a span iff
    the largest end among spans starting at or before it reaches past it. Exact for nested or
    overlapping spans, and O((items + spans) log spans) instead of items × spans."""
    keep = np.zeros(len(ts), dtype=bool)
    s_ts, s_end, s_tid = spans["ts"].to_numpy(), spans["end"].to_numpy(), spans["tid"].to_numpy()
    for t in np.unique(s_tid):
        on = np.flatnonzero(tid == t)
        if not on.size:
            continue
        mine = s_tid == t
        order = np.argsort(s_ts[mine], kind="stable")
        starts, reach = s_ts[mine][order], np.maximum.accumulate(s_end[mine][order])
        idx = np.searchsorted(starts, ts[on], side="right") - 1
        ok = idx >= 0
        far = reach[np.maximum(idx, 0)]
        keep[on] = ok & (far >= ends[on] if ends is not None else far > ts[on])
    return keep


def gpu_ops_launched_in(model: TraceModel, launches: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """GPU ops whose launch call was made inside the spans (on the span's thread)."""
    if launches.empty or spans.empty:
        return launches.iloc[0:0]
    return launches[_inside_any(launches["launch_ts"].to_numpy(), launches["tid"].to_numpy(), spans)]

"""GPU memory metrics from what a run leaves behind, as one `MemorySummary`.

Three sources, each optional:
- a CUDA caching-allocator snapshot (`torch.cuda.memory._dump_snapshot`): the segments and blocks at
  the moment of the dump, and `device_traces`, the allocator's recent history;
- the trace: `[memory]` instant events (allocated/reserved totals over time) and the cudaMalloc/cudaFree
  runtime calls the allocator made;
- run.json: `torch.cuda.memory_stats()` counters and the device's capacity.

Everything here is a pure function of plain data; the rules read the summary, the renderers print it.
Sizes are bytes. The snapshot identity (what `torch.cuda._memory_viz.segsum` asserts) is
reserved = allocated + internal free (rounding inside live blocks) + external free (inactive blocks).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from .basics import intervals as iv
from gpuadvise.analyzer.model import frames as code_frames
from gpuadvise.analyzer.model.calls import ALLOC_CALLS, FREE_CALLS

GiB = 2**30
MiB = 2**20

GPU_DEVICE_TYPES = (1, 6)  # `[memory]` "Device Type" (c10::DeviceType): 0 CPU, 1 CUDA, 6 HIP (some ROCm builds)
TIMELINE_POINTS = 64
TOP_SITES = 5
NO_SITE = "(no Python frame)"

# History actions and what they do to the allocated / reserved totals.
_ALLOCATED = {"alloc": 1, "free_completed": -1}
_RESERVED = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


@dataclass
class SegmentState:
    """The allocator's segments when the snapshot was taken."""

    device: int | None
    reserved: int
    allocated: int  # requested bytes of live blocks
    internal_free: int  # block size − requested size of live blocks (rounding)
    external_free: int  # inactive blocks
    stranded: int  # inactive blocks inside segments that still hold a live block
    empty_segment_bytes: int  # segments with no live block: cache that empty_cache() would release
    segments: int
    partly_used_segments: int
    stranded_blocks: int
    largest_free_block: int
    largest_request: int  # the largest live block's requested size
    largest_segments: list[dict] = field(default_factory=list)  # by stranded bytes
    top_sites: list[dict] = field(default_factory=list)  # live blocks by allocation site

    @property
    def unallocated(self) -> int:
        return self.reserved - self.allocated

    @property
    def slack_pct(self) -> float:
        return 100.0 * self.unallocated / self.reserved if self.reserved else 0.0

    @property
    def stranded_pct(self) -> float:
        return 100.0 * self.stranded / self.reserved if self.reserved else 0.0


@dataclass
class History:
    """The snapshot's `device_traces`, replayed. It is a ring buffer: the final state is known from the
    segments, so the levels before the first recorded entry are worked out backwards from it."""

    entries: int
    timed: bool  # entries carry time_us (older snapshots do not: the x axis is then the entry index)
    span_s: float | None
    actions: dict
    peak_allocated: int  # the highest allocation the history recorded (block sizes)
    peak_reserved: int
    reserved_at_peak: int  # reserved when allocation peaked
    floor_allocated: int  # the lowest allocation after the peak: what outlives a step (weights, grads, optimizer state)
    segment_allocs: int  # segment_alloc + segment_map (cudaMalloc / mapped pages)
    segment_frees: int  # segment_free + segment_unmap (cudaFree / unmapped pages)
    release_cycles: int  # segments released and then allocated again (free → alloc transitions)
    reallocated_bytes: int  # bytes of segments allocated after the first release
    releases: list[dict] = field(default_factory=list)  # each burst of releases
    ooms: list[dict] = field(default_factory=list)
    top_sites: list[dict] = field(default_factory=list)
    timeline: list[list] = field(default_factory=list)  # [t, allocated, reserved]
    timeline_unit: str = "s"
    # the allocator's state at the first out-of-memory, replayed from the history: a snapshot is dumped
    # after the failure unwound, so its segments show the aftermath, this shows the cause
    at_oom: dict | None = None

    @property
    def unused_at_peak_pct(self) -> float:
        """Share of the reserved memory that held nothing even when allocation peaked."""
        if not self.reserved_at_peak:
            return 0.0
        return max(0.0, 100.0 * (self.reserved_at_peak - self.peak_allocated) / self.reserved_at_peak)


@dataclass
class TraceMemory:
    """`[memory]` events of one device, and the allocator's runtime calls inside the iterations."""

    device: int | None
    events: int
    peak_allocated: int | None
    peak_reserved: int | None
    reserved_at_peak: int | None  # reserved when allocated peaked
    max_gap: int | None  # largest reserved − allocated
    floor_allocated: int | None = None  # the lowest allocation after the peak (what outlives a step)
    timeline: list[list] = field(default_factory=list)  # [ms from trace start, allocated, reserved]
    iteration_kind: str | None = None  # "ProfilerStep", "Optimizer.step" or None
    iterations: int = 0
    mallocs: int = 0  # anywhere in the trace
    frees: int = 0
    mallocs_in_iterations: int = 0
    frees_in_iterations: int = 0
    iterations_with_frees: int = 0
    allocator_ms_in_iterations: float = 0.0  # wall time covered by those calls


@dataclass
class Counters:
    """`torch.cuda.memory_stats()` at the end of the profiled window (run.json)."""

    num_alloc_retries: int | None
    num_ooms: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    num_device_alloc: int | None
    num_device_free: int | None
    inactive_split: int | None


@dataclass
class MemorySummary:
    capacity: int | None  # device memory, bytes
    device_name: str | None
    snapshot: SegmentState | None = None
    history: History | None = None
    trace: TraceMemory | None = None
    counters: Counters | None = None
    allocator_settings: dict = field(default_factory=dict)
    # the snapshot's other devices (the summary describes the one that failed, else the fullest):
    # device, reserved, allocated (requested bytes), stranded, ooms
    other_devices: list[dict] = field(default_factory=list)

    @property
    def sources(self) -> list[str]:
        return [k for k in ("snapshot", "history", "trace", "counters") if getattr(self, k) is not None]

    @property
    def peak_allocated(self) -> int | None:
        """The highest allocation any source saw over time (a snapshot's segments are one moment: not a peak)."""
        return _max(self.counters and self.counters.peak_allocated, self.history and self.history.peak_allocated,
                    self.trace and self.trace.peak_allocated)

    @property
    def peak_reserved(self) -> int | None:
        return _max(self.counters and self.counters.peak_reserved, self.history and self.history.peak_reserved,
                    self.trace and self.trace.peak_reserved)

    @property
    def floor_allocated(self) -> int | None:
        """The lowest allocation after the peak (from the history, else the trace's [memory] events): the
        memory that outlives a step. None when no source recorded allocation over time."""
        for part in (self.history, self.trace):
            if part is not None and part.floor_allocated is not None:
                return part.floor_allocated
        return None

    @property
    def high_water(self) -> tuple[int | None, int | None]:
        """(allocated, reserved) at their highest known: the peaks, else the snapshot's moment (a lower bound)."""
        s = self.snapshot
        return (self.peak_allocated if self.peak_allocated is not None else (s.allocated if s else None),
                self.peak_reserved if self.peak_reserved is not None else (s.reserved if s else None))

    @property
    def ooms(self) -> int:
        return max(len(self.history.ooms) if self.history else 0, (self.counters and self.counters.num_ooms) or 0)

    def pct_of_capacity(self, nbytes: int | None) -> float | None:
        if not self.capacity or nbytes is None:
            return None
        return 100.0 * nbytes / self.capacity

    def to_dict(self) -> dict:
        d = {"sources": self.sources, "capacity_bytes": self.capacity, "device": self.device_name,
             "peak_allocated_bytes": self.peak_allocated, "peak_reserved_bytes": self.peak_reserved,
             "peak_allocated_pct_of_capacity": _round(self.pct_of_capacity(self.peak_allocated)),
             "peak_reserved_pct_of_capacity": _round(self.pct_of_capacity(self.peak_reserved)),
             "ooms": self.ooms, "allocator_settings": self.allocator_settings,
             "snapshot_device": self.snapshot.device if self.snapshot else None, "other_devices": self.other_devices}
        if self.snapshot:
            s = self.snapshot
            d["snapshot"] = dict(asdict(s), unallocated=s.unallocated, slack_pct=_round(s.slack_pct),
                                 stranded_pct=_round(s.stranded_pct))
        for name in ("history", "trace", "counters"):
            part = getattr(self, name)
            d[name] = asdict(part) if part is not None else None
        if self.history:
            d["history"]["unused_at_peak_pct"] = _round(self.history.unused_at_peak_pct)
        return d


# ---------------------------------------------------------------------------------------------------
# snapshot


def segment_state(snap: dict, device: int | None = None) -> SegmentState:
    segs = [s for s in _list(snap.get("segments")) if isinstance(s, dict)]
    if device is None:
        device = main_device(segs)
    if device is not None:
        segs = [s for s in segs if _int(s.get("device", device)) == device]
    reserved = allocated = internal = external = stranded = empty = 0
    partly = stranded_blocks = largest_free = largest_req = 0
    per_segment = []
    sites: dict[str, list[int]] = {}
    for s in segs:
        blocks = [b for b in _list(s.get("blocks")) if isinstance(b, dict)]
        live = [b for b in blocks if _is_active(b)]
        free = [b for b in blocks if not _is_active(b)]
        total = _int(s.get("total_size"))
        free_bytes = sum(_int(b.get("size")) for b in free)
        reserved += total
        external += free_bytes
        for b in live:
            size, req = _int(b.get("size")), _int(b.get("requested_size", b.get("size")))
            allocated += req
            internal += max(size - req, 0)
            largest_req = max(largest_req, req)
            site = allocation_site(b.get("frames"))
            if site:
                sites.setdefault(site, [0, 0])
                sites[site][0] += 1
                sites[site][1] += req
        largest_free = max([largest_free] + [_int(b.get("size")) for b in free])
        if live and free:
            partly += 1
            stranded += free_bytes
            stranded_blocks += len(free)
            per_segment.append({"segment": hex(_int(s.get("address"))), "stream": _int(s.get("stream")),
                                "size_mib": _mib(total), "allocated_mib": _mib(sum(_int(b.get("size")) for b in live)),
                                "stranded_mib": _mib(free_bytes), "free_blocks": len(free), "live_blocks": len(live)})
        elif not live:
            empty += total
    per_segment.sort(key=lambda r: -r["stranded_mib"])
    top = sorted(sites.items(), key=lambda kv: -kv[1][1])[:TOP_SITES]
    return SegmentState(
        device=device, reserved=reserved, allocated=allocated, internal_free=internal, external_free=external,
        stranded=stranded, empty_segment_bytes=empty, segments=len(segs), partly_used_segments=partly,
        stranded_blocks=stranded_blocks, largest_free_block=largest_free, largest_request=largest_req,
        largest_segments=per_segment[:5],
        top_sites=[{"name": k, "live_blocks": v[0], "live_mib": _mib(v[1])} for k, v in top])


def failed_device(snap: dict) -> int | None:
    """The first device whose allocator history records an out-of-memory: the one a report leads with."""
    for dev, entries in enumerate(_list(snap.get("device_traces"))):
        if any(isinstance(e, dict) and e.get("action") == "oom" for e in _list(entries)):
            return dev
    return None


def devices(snap: dict) -> list[int]:
    """Every device the snapshot's segments are on."""
    return sorted({_int(s.get("device")) for s in _list(snap.get("segments")) if isinstance(s, dict) and "device" in s})


def other_devices(snap: dict, shown: int | None) -> list[dict]:
    """The devices the summary does not describe, each with its own figures (none silently dropped)."""
    out = []
    traces = _list(snap.get("device_traces"))
    for dev in devices(snap):
        if dev == shown:
            continue
        st = segment_state(snap, dev)
        entries = _list(traces[dev]) if dev < len(traces) else []
        ooms = sum(1 for e in entries if isinstance(e, dict) and e.get("action") == "oom")
        out.append({"device": dev, "reserved": st.reserved, "allocated": st.allocated, "stranded": st.stranded,
                    "ooms": ooms})
    return out


def main_device(segs: list[dict]) -> int | None:
    """The device holding the most reserved memory (a process usually has one)."""
    per: Counter = Counter()
    for s in segs:
        if "device" in s:
            per[_int(s.get("device"))] += _int(s.get("total_size"))
    return per.most_common(1)[0][0] if per else None


def replay_history(snap: dict, state: SegmentState) -> History | None:
    traces = _list(snap.get("device_traces"))
    dev = state.device or 0
    entries = traces[dev] if dev < len(traces) else []
    entries = [e for e in _list(entries) if isinstance(e, dict) and isinstance(e.get("action"), str)]
    if not entries:
        return None
    n = len(entries)
    actions = [e["action"] for e in entries]
    sizes = np.array([_int(e.get("size")) for e in entries], dtype=np.int64)
    d_alloc = sizes * np.array([_ALLOCATED.get(a, 0) for a in actions], dtype=np.int64)
    d_res = sizes * np.array([_RESERVED.get(a, 0) for a in actions], dtype=np.int64)
    # work backwards from the final state: the buffer may have dropped the oldest entries
    live_block_bytes = state.allocated + state.internal_free
    alloc_curve = live_block_bytes - d_alloc.sum() + np.cumsum(d_alloc)
    res_curve = state.reserved - d_res.sum() + np.cumsum(d_res)
    times = [e.get("time_us") for e in entries]
    timed = all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in times)
    x = (np.array(times, dtype=np.float64) - float(times[0])) / 1e6 if timed else np.arange(n, dtype=np.float64)

    seg_allocs = seg_frees = cycles = realloc = 0
    releases: list[dict] = []
    released = False
    for i, a in enumerate(actions):
        if a in ("segment_free", "segment_unmap"):
            seg_frees += 1
            if not releases or releases[-1]["closed"]:
                releases.append({"at": _round(float(x[i]), 3), "segments": 0, "bytes": 0, "closed": False})
            releases[-1]["segments"] += 1
            releases[-1]["bytes"] += int(sizes[i])
            released = True
        elif a in ("segment_alloc", "segment_map"):
            seg_allocs += 1
            if released:
                realloc += int(sizes[i])
            if releases and not releases[-1]["closed"]:
                releases[-1]["closed"] = True
                cycles += 1
    ooms = [{"requested_bytes": _int(e.get("size")), "device_free_bytes": _int(e.get("device_free")) or None,
             "at": _round(float(x[i]), 3), "site": allocation_site(e.get("frames"))}
            for i, e in enumerate(entries) if e["action"] == "oom"]
    peak_i = int(np.argmax(alloc_curve))
    at_oom = None
    oom_i = next((i for i, e in enumerate(entries) if e["action"] == "oom"), None)
    if oom_i is not None:
        at_oom = {"allocated": int(max(alloc_curve[oom_i], 0)), "reserved": int(max(res_curve[oom_i], 0)),
                  "requested": _int(entries[oom_i].get("size")), "device_free": _int(entries[oom_i].get("device_free")) or None,
                  "top_sites": _sites_at_peak(entries, oom_i)}
    return History(
        entries=n, timed=timed, span_s=_round(float(x[-1]), 3) if timed else None, actions=dict(Counter(actions)),
        peak_allocated=int(max(alloc_curve[peak_i], 0)), peak_reserved=int(max(res_curve.max(), 0)),
        reserved_at_peak=int(max(res_curve[peak_i], 0)), floor_allocated=int(max(alloc_curve[peak_i:].min(), 0)),
        segment_allocs=seg_allocs, segment_frees=seg_frees, release_cycles=cycles, reallocated_bytes=realloc,
        releases=[{k: v for k, v in r.items() if k != "closed"} for r in releases[:10]],
        ooms=ooms[:10], top_sites=_sites_at_peak(entries, peak_i),
        timeline=_downsample(x, alloc_curve, res_curve), timeline_unit="s" if timed else "entry", at_oom=at_oom)


def _sites_at_peak(entries: list[dict], peak_i: int) -> list[dict]:
    """Allocation sites by the bytes they held when allocation peaked (allocations made in the history),
    with their allocation counts over the whole history."""
    live: dict[int, tuple[int, str]] = {}
    count: Counter = Counter()
    total: Counter = Counter()
    for i, e in enumerate(entries):
        a = e["action"]
        if a == "alloc":
            site = allocation_site(e.get("frames")) or NO_SITE
            size = _int(e.get("size"))
            count[site] += 1
            total[site] += size
            if i <= peak_i:
                live[_int(e.get("addr"))] = (size, site)
        elif a == "free_completed" and i <= peak_i:
            live.pop(_int(e.get("addr")), None)
    at_peak: Counter = Counter()
    for size, site in live.values():
        at_peak[site] += size
    names = sorted(total, key=lambda s: (-at_peak[s], -total[s]))[:TOP_SITES]
    return [{"name": s, "allocs": count[s], "allocated_mib": _mib(total[s]), "live_at_peak_mib": _mib(at_peak[s])}
            for s in names]


def allocation_site(frames) -> str | None:
    """Where user code asked for the memory: the innermost Python frame in the user's code
    (model/frames.py judges), "file:line (function)". With only library frames, the library function in
    parentheses, never its file (a pointer the user cannot follow); None without Python frames. C++
    frames (stacks="all") are skipped."""
    py = [f for f in _list(frames) if isinstance(f, dict) and str(f.get("filename", "")).endswith(".py")]
    if not py:
        return None
    stack = [code_frames.Frame(str(f.get("filename")), _int(f.get("line")), str(f.get("name", "?"))) for f in py]
    chosen = code_frames.pick(stack)
    if chosen.user is None:
        return f"(no frame in your code: {chosen.library_call})"
    path = chosen.user.file.replace("\\", "/").rsplit("/", 3)
    return f"{'/'.join(path[-3:])}:{chosen.user.line} ({chosen.user.function})"


def user_sites(sites: list[dict], n: int = 3) -> list[str]:
    """The allocation sites of `top_sites` that point into the user's code (not NO_SITE, not a library
    function), at most n: a finding's `sources`."""
    return [x["name"] for x in sites if not str(x["name"]).startswith("(")][:n]


def allocator_settings(snap: dict) -> dict:
    """The settings a user would change (PYTORCH_CUDA_ALLOC_CONF and what it resolved to)."""
    s = snap.get("allocator_settings")
    if not isinstance(s, dict):
        return {}
    keep = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "max_split_size", "garbage_collection_threshold")
    out = {k: s[k] for k in keep if k in s and isinstance(s[k], (str, int, float, bool))}
    rounding = s.get("roundup_power2_divisions")
    if isinstance(rounding, dict) and any(_int(v) for v in rounding.values()):
        out["roundup_power2_divisions"] = {str(k): _int(v) for k, v in rounding.items() if _int(v)}
    return out


# ---------------------------------------------------------------------------------------------------
# trace


def iterations(model, metrics) -> tuple[list[tuple[float, float]], str | None]:
    """The training iterations: ProfilerSteps, else the spans between `Optimizer.step#` annotations
    (the optimizer hook marks one per iteration even when the profiler was not stepped)."""
    if metrics is not None and metrics.steps:
        return [(s.start, s.end) for s in metrics.steps], "ProfilerStep"
    cpu = model.cpu
    if len(cpu) and hasattr(cpu["name"], "cat"):
        names = [c for c in cpu["name"].cat.categories if str(c).startswith("Optimizer.step#")]
        ends = np.sort(cpu.loc[cpu["name"].isin(names), "end"].to_numpy()) if names else np.array([])
        if len(ends) >= 2:
            return list(zip(ends[:-1].tolist(), ends[1:].tolist())), "Optimizer.step"
    return [], None


def allocator_calls(model, windows: list[tuple[float, float]] | None = None):
    """cudaMalloc/cudaFree (hip*) runtime calls, with the iteration each starts in (−1: none)."""
    rt = model.runtime
    if not len(rt):
        return rt.assign(window=np.array([], dtype=np.int64))
    calls = rt[rt["name"].isin(ALLOC_CALLS + FREE_CALLS)].sort_values("ts")
    win = np.full(len(calls), -1, dtype=np.int64)
    ts = calls["ts"].to_numpy()
    for i, (a, b) in enumerate(windows or []):
        win[(ts >= a) & (ts < b)] = i
    return calls.assign(window=win)


def trace_memory(model, metrics=None) -> TraceMemory | None:
    mem = model.memory
    gpu = mem[mem["device_type"].isin(GPU_DEVICE_TYPES) & np.isfinite(mem["total_allocated"])] if len(mem) else mem
    windows, kind = iterations(model, metrics)
    calls = allocator_calls(model, windows)
    if not len(gpu) and not len(calls):
        return None
    tm = TraceMemory(device=None, events=int(len(gpu)), peak_allocated=None, peak_reserved=None,
                     reserved_at_peak=None, max_gap=None, iteration_kind=kind, iterations=len(windows))
    if len(gpu):
        dev = int(gpu.groupby("device")["total_allocated"].max().idxmax())
        g = gpu[gpu["device"] == dev].sort_values("ts")
        alloc = g["total_allocated"].to_numpy()
        res = np.nan_to_num(g["total_reserved"].to_numpy(), nan=0.0)
        i = int(np.argmax(alloc))
        tm.device, tm.events = dev, int(len(g))
        tm.peak_allocated, tm.peak_reserved = int(alloc[i]), int(res.max())
        tm.reserved_at_peak = int(res[i])
        tm.floor_allocated = int(max(alloc[i:].min(), 0))
        tm.max_gap = int(max((res - alloc).max(), 0))
        tm.timeline = _downsample(g["ts"].to_numpy() / 1e3, alloc, res)
    is_free = calls["name"].isin(FREE_CALLS).to_numpy()
    inside = calls["window"].to_numpy() >= 0
    tm.mallocs, tm.frees = int((~is_free).sum()), int(is_free.sum())
    tm.mallocs_in_iterations = int((~is_free & inside).sum())
    tm.frees_in_iterations = int((is_free & inside).sum())
    tm.iterations_with_frees = int(len(np.unique(calls["window"].to_numpy()[is_free & inside])))
    # a union: calls on several threads at once are counted once
    lo, hi = calls["ts"].to_numpy()[inside], calls["end"].to_numpy()[inside]
    tm.allocator_ms_in_iterations = round(iv.total(*iv.union(lo, hi)) / 1e3, 3)
    return tm


# ---------------------------------------------------------------------------------------------------
# run.json


def counters(facts: dict | None) -> Counters | None:
    stats = ((facts or {}).get("capture") or {}).get("memory_stats")
    if not isinstance(stats, dict) or not stats:
        return None

    def get(key):
        v = stats.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return Counters(num_alloc_retries=get("num_alloc_retries"), num_ooms=get("num_ooms"),
                    peak_allocated=get("allocated_bytes.all.peak"), peak_reserved=get("reserved_bytes.all.peak"),
                    num_device_alloc=get("num_device_alloc"), num_device_free=get("num_device_free"),
                    inactive_split=get("inactive_split_bytes.all.current"))


def capacity(model=None, facts: dict | None = None, device: int | None = None) -> tuple[int | None, str | None]:
    """Device memory and name: the trace's deviceProperties (the device the memory events are on, else
    the busiest), else run.json's environment."""
    if model is not None and model.meta.devices:
        dev = next((d for d in model.meta.devices if d.id == device), None) if device is not None else None
        dev = dev or model.device
        if dev is not None and dev.total_memory:
            return int(dev.total_memory), dev.name or None
    env_dev = ((facts or {}).get("environment") or {}).get("device")
    if isinstance(env_dev, dict) and isinstance(env_dev.get("total_memory"), (int, float)) and env_dev["total_memory"] > 0:
        return int(env_dev["total_memory"]), env_dev.get("name")
    return None, None


# ---------------------------------------------------------------------------------------------------


def summarize(snapshot: dict | None = None, model=None, metrics=None, facts: dict | None = None) -> MemorySummary | None:
    """Everything known about the run's GPU memory; None when no source has any."""
    state = segment_state(snapshot, failed_device(snapshot)) if snapshot is not None else None
    history = replay_history(snapshot, state) if snapshot is not None else None
    tm = trace_memory(model, metrics) if model is not None else None
    ctr = counters(facts)
    if state is None and tm is None and ctr is None:
        return None
    cap, name = capacity(model, facts, tm.device if tm else None)
    return MemorySummary(capacity=cap, device_name=name, snapshot=state, history=history, trace=tm, counters=ctr,
                         allocator_settings=allocator_settings(snapshot) if snapshot is not None else {},
                         other_devices=other_devices(snapshot, state.device) if snapshot is not None else [])


def devices_sentence(mem: MemorySummary) -> str:
    """One sentence naming the snapshot's other devices and their figures; "" for a one-device snapshot."""
    if mem.snapshot is None or not mem.other_devices:
        return ""
    lead = mem.snapshot.device
    why = "the one that ran out of memory" if mem.history is not None and mem.history.ooms else "the one holding the most"
    rest = "; ".join(f"device {d['device']}: {d['reserved'] / GiB:.2f} GiB reserved, {d['allocated'] / GiB:.2f} GiB allocated"
                     + (f", {d['stranded'] / GiB:.2f} GiB stranded" if d["stranded"] else "")
                     + (f", {d['ooms']} out-of-memory" if d["ooms"] else "") for d in mem.other_devices)
    return f"The snapshot covers {len(mem.other_devices) + 1} devices; these figures are device {lead}'s ({why}). Others: {rest}."


# ---------------------------------------------------------------------------------------------------
# helpers: a snapshot is untrusted data, so every field is read defensively


_LIMIT = 2**62  # far above any real size; keeps a crafted number inside int64 arithmetic


def _int(v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0
    if isinstance(v, float) and not np.isfinite(v):
        return 0
    return max(-_LIMIT, min(int(v), _LIMIT))


def _list(v) -> list:
    return v if isinstance(v, (list, tuple)) else []


def _is_active(block: dict) -> bool:
    return str(block.get("state", "")).startswith("active")


def _max(*values):
    vals = [int(v) for v in values if isinstance(v, (int, float, np.integer)) and not isinstance(v, bool)]
    return max(vals) if vals else None


def _mib(n: int) -> float:
    return round(n / MiB, 1)


def _round(v, nd: int = 2):
    return None if v is None else round(float(v), nd)


def _downsample(x: np.ndarray, alloc: np.ndarray, res: np.ndarray, points: int = TIMELINE_POINTS) -> list[list]:
    """At most `points` [x, allocated, reserved] rows; each keeps the highest values of its slice so
    that no peak is lost."""
    n = len(x)
    if n == 0:
        return []
    edges = np.linspace(0, n, min(points, n) + 1).astype(int)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            out.append([_round(float(x[a]), 3), int(max(alloc[a:b].max(), 0)), int(max(res[a:b].max(), 0))])
    return out

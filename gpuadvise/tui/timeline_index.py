"""The timeline's index: every event of a trace sorted into lanes (CPU threads, GPU streams), with
numpy arrays that answer "what is in screen column [a, b)?" in O(columns · log events).

The widget never walks events. For each visible column it asks each visible lane for the event that
covers the column (`hit`) and how much of the column is busy (`busy`), both by `searchsorted`, so
drawing costs the same for 1 000 events as for 5 000 000. This module has no Textual code; it is built
in a worker thread and tested on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpuadvise.analyzer.measure.basics import intervals as iv
from gpuadvise.analyzer.model.kernels import is_comm
from gpuadvise.analyzer.model.calls import COPY_CALLS, LAUNCH_CALLS, SYNC_CALLS

# Style codes: what an event is, which decides its colour and how details describe it.
OP, ANNOTATION, DATALOADER, LAUNCH, COPY_CALL, SYNC_CALL, RUNTIME, KERNEL, COMM, MEMCPY, MEMSET, GPU_SYNC, EVIDENCE = range(13)
STYLE_NAMES = {
    OP: "CPU op", ANNOTATION: "annotation", DATALOADER: "DataLoader wait", LAUNCH: "kernel launch",
    COPY_CALL: "copy call", SYNC_CALL: "blocking call", RUNTIME: "runtime call", KERNEL: "kernel",
    COMM: "communication kernel", MEMCPY: "memcpy", MEMSET: "memset", GPU_SYNC: "GPU sync", EVIDENCE: "evidence",
}
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass
class Lane:
    """One row of the timeline: events sorted by start, with prefix maxima so overlapping (nested)
    events are found too."""

    label: str
    kind: str  # "ops", "nested", "annotations", "dataloader", "runtime", "gpu", "gpu-sync", "evidence"
    frame: str  # where details come from: "cpu", "runtime", "gpu", "syncs", "dataloader", ""
    rows: np.ndarray  # positional rows in that frame, in start order
    starts: np.ndarray
    ends: np.ndarray
    styles: np.ndarray  # uint8 style code per event
    codes: np.ndarray  # name code per event (into `names`)
    names: pd.Index  # the frame's distinct names
    thread: tuple[int, int] | None = None
    stream: tuple[int, int] | None = None
    reach: np.ndarray = field(init=False)  # max end among events 0..i
    reach_at: np.ndarray = field(init=False)  # which event that max belongs to
    cover: tuple[np.ndarray, np.ndarray, np.ndarray] = field(init=False)  # union starts, ends, prefix length

    def __post_init__(self):
        n = len(self.starts)
        if n:
            self.reach = np.maximum.accumulate(self.ends)
            # index of the running max: where a new max is set, carry it forward
            new_max = np.empty(n, dtype=bool)
            new_max[0] = True
            new_max[1:] = self.ends[1:] > self.reach[:-1]
            self.reach_at = np.maximum.accumulate(np.where(new_max, np.arange(n), 0))
        else:
            self.reach = np.empty(0)
            self.reach_at = np.empty(0, dtype=np.int64)
        s, e = iv.union(self.starts, self.ends)
        self.cover = (s, e, np.concatenate([[0.0], np.cumsum(e - s)]))

    def __len__(self) -> int:
        return len(self.starts)

    def hit(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """For each window [a[i], b[i]): the index of an event overlapping it, or -1.

        The event shown is the last one to start before b (the innermost, for nested ops); when that
        one ended before a, the longest-reaching earlier event that still overlaps."""
        if not len(self.starts):
            return np.full(len(a), -1, dtype=np.int64)
        j = np.searchsorted(self.starts, b, side="left") - 1
        ok = j >= 0
        jj = np.clip(j, 0, None)
        direct = ok & ((self.ends[jj] > a) | (self.starts[jj] >= a))
        carried = ok & ~direct & (self.reach[jj] > a)
        return np.where(direct, jj, np.where(carried, self.reach_at[jj], -1))

    def busy(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Share of each window [a, b) covered by the lane's events (0..1)."""
        return (self._covered_before(b) - self._covered_before(a)) / np.maximum(b - a, 1e-12)

    def _covered_before(self, t: np.ndarray) -> np.ndarray:
        """Busy time in (-inf, t), from the union's prefix sums (iv.covered would redo them per call)."""
        s, e, prefix = self.cover
        if not len(s):
            return np.zeros(len(t))
        k = np.searchsorted(s, t, side="right")
        last = np.clip(k - 1, 0, None)
        overshoot = np.where(k > 0, np.clip(e[last] - t, 0, None), 0.0)
        return prefix[k] - overshoot

    def count(self, a: float, b: float) -> int:
        """How many events overlap [a, b) (exact for lanes whose events do not nest)."""
        if not len(self.starts):
            return 0
        started = int(np.searchsorted(self.starts, b, side="left"))
        ended = int(np.searchsorted(self.reach, a, side="right"))  # events wholly before a (reach is sorted)
        return max(started - ended, 0)

    def name(self, i: int) -> str:
        return str(self.names[self.codes[i]])

    def matching(self, names_match: np.ndarray) -> "Lane":
        """The sub-lane of events whose name code is True in `names_match` (for highlighting)."""
        mask = names_match[self.codes] if len(self.codes) else np.zeros(0, dtype=bool)
        return Lane(self.label, self.kind, self.frame, self.rows[mask], self.starts[mask], self.ends[mask],
                    self.styles[mask], self.codes[mask], self.names, self.thread, self.stream)

    def next_start(self, t: float, forward: bool = True) -> int:
        """Index of the first event starting after t (or the last starting before t), -1 if none."""
        if forward:
            k = int(np.searchsorted(self.starts, t, side="right"))
            return k if k < len(self.starts) else -1
        k = int(np.searchsorted(self.starts, t, side="left")) - 1
        return k


def _lane(label, kind, frame, df: pd.DataFrame, rows: np.ndarray, styles: np.ndarray, codes: np.ndarray, names,
          thread=None, stream=None, order_by_end: bool = False) -> Lane:
    ts = df["ts"].to_numpy(dtype=np.float64)[rows]
    end = df["end"].to_numpy(dtype=np.float64)[rows]
    # start order; among equal starts the longer (enclosing) event first, so nesting reads outside-in
    order = np.lexsort((-end, ts)) if order_by_end else np.argsort(ts, kind="stable")
    return Lane(label, kind, frame, rows[order], ts[order], end[order], styles[order], codes[order], names, thread, stream)


def _codes(df: pd.DataFrame) -> tuple[np.ndarray, pd.Index]:
    col = df["name"]
    if not isinstance(col.dtype, pd.CategoricalDtype):
        col = col.astype(str).astype("category")
    return col.cat.codes.to_numpy().astype(np.int32), pd.Index(col.cat.categories.astype(str))


def _name_flags(names: pd.Index, pattern) -> np.ndarray:
    if pattern is None:
        return np.zeros(len(names), dtype=bool)
    if isinstance(pattern, (set, frozenset)):
        return np.asarray(names.isin(list(pattern)), dtype=bool)
    return np.asarray(names.str.match(pattern), dtype=bool)


@dataclass
class TimelineIndex:
    lanes: list[Lane]
    steps: list[tuple[int, float, float]]  # (number, start, end); one (-1, …) window when none
    window: tuple[float, float]

    def step_at(self, t: float) -> int:
        """Position in `steps` of the step containing t (the nearest one when t is between steps)."""
        starts = np.array([s[1] for s in self.steps])
        k = int(np.searchsorted(starts, t, side="right")) - 1
        return min(max(k, 0), len(self.steps) - 1)

    def lane_of_kind(self, kind: str) -> int | None:
        for i, lane in enumerate(self.lanes):
            if lane.kind == kind and len(lane):
                return i
        return None


def build(model, metrics) -> TimelineIndex:
    """Sort a trace's events into lanes: per CPU thread (ops, nested ops, annotations, DataLoader,
    runtime calls) with the training thread first, then per GPU stream."""
    lanes: list[Lane] = []
    cpu, rt, gpu = model.cpu, model.runtime, model.gpu
    threads = _thread_order(model, metrics)
    cpu_by_thread = cpu.groupby(["pid", "tid"], sort=False).indices if len(cpu) else {}
    rt_by_thread = rt.groupby(["pid", "tid"], sort=False).indices if len(rt) else {}
    cpu_codes, cpu_names = _codes(cpu) if len(cpu) else (np.empty(0, np.int32), pd.Index([]))
    rt_codes, rt_names = _codes(rt) if len(rt) else (np.empty(0, np.int32), pd.Index([]))
    step_name = _name_flags(cpu_names, _PROFILER_STEP)
    loader_name = _name_flags(cpu_names, re.compile(r"^enumerate\((DataLoader|DataPipe)\)#"))
    is_annot = cpu["is_annotation"].to_numpy(dtype=bool) if len(cpu) else np.empty(0, bool)
    dl = metrics.dataloader
    dl_codes, dl_names = _codes(dl) if len(dl) else (np.empty(0, np.int32), pd.Index([]))
    sync_names = _name_flags(rt_names, set(SYNC_CALLS))
    launch_names = _name_flags(rt_names, set(LAUNCH_CALLS))
    copy_names = _name_flags(rt_names, set(COPY_CALLS))

    for pid, tid in threads:
        who = f"thread {tid}"
        rows = np.asarray(cpu_by_thread.get((pid, tid), []), dtype=np.int64)
        if rows.size:
            codes = cpu_codes[rows]
            skip = step_name[codes] | loader_name[codes]
            annot = is_annot[rows] & ~skip
            ops = rows[~is_annot[rows] & ~skip]
            if ops.size:
                lane = _lane(who, "ops", "cpu", cpu, ops, np.full(ops.size, OP, np.uint8), cpu_codes[ops], cpu_names,
                             thread=(pid, tid), order_by_end=True)
                top, nested = _split_nesting(lane)
                lanes.append(top)
                if len(nested):
                    lanes.append(nested)
            ann = rows[annot]
            if ann.size:
                lanes.append(_lane(f"{who} annotations", "annotations", "cpu", cpu, ann,
                                   np.full(ann.size, ANNOTATION, np.uint8), cpu_codes[ann], cpu_names,
                                   thread=(pid, tid), order_by_end=True))
        if len(dl):
            drows = np.flatnonzero(dl["tid"].to_numpy() == tid)
            if drows.size:
                lanes.append(_lane(f"{who} DataLoader", "dataloader", "dataloader", dl, drows,
                                   np.full(drows.size, DATALOADER, np.uint8), dl_codes[drows], dl_names, thread=(pid, tid)))
        rrows = np.asarray(rt_by_thread.get((pid, tid), []), dtype=np.int64)
        if rrows.size:
            codes = rt_codes[rrows]
            styles = np.full(rrows.size, RUNTIME, np.uint8)
            styles[launch_names[codes]] = LAUNCH
            styles[copy_names[codes]] = COPY_CALL
            styles[sync_names[codes]] = SYNC_CALL
            lanes.append(_lane(f"{who} CUDA runtime", "runtime", "runtime", rt, rrows, styles, codes, rt_names,
                               thread=(pid, tid)))

    if len(gpu):
        g_codes, g_names = _codes(gpu)
        comm = np.fromiter((is_comm(n) for n in g_names), dtype=bool, count=len(g_names))
        kind = gpu["kind"].astype(str).to_numpy()
        styles = np.where(kind == "memcpy", MEMCPY, np.where(kind == "memset", MEMSET, KERNEL)).astype(np.uint8)
        styles[(styles == KERNEL) & comm[g_codes]] = COMM
        for (dev, stream), rows in sorted(gpu.groupby(["device", "stream"], sort=False).indices.items()):
            rows = np.asarray(rows, dtype=np.int64)
            lanes.append(_lane(f"GPU {dev} stream {stream}", "gpu", "gpu", gpu, rows, styles[rows], g_codes[rows], g_names,
                               stream=(int(dev), int(stream))))
    syncs = model.syncs
    if len(syncs):
        s_codes, s_names = _codes(syncs)
        for dev, rows in sorted(syncs.groupby("device", sort=False).indices.items()):
            rows = np.asarray(rows, dtype=np.int64)
            lanes.append(_lane(f"GPU {dev} syncs", "gpu-sync", "syncs", syncs, rows, np.full(rows.size, GPU_SYNC, np.uint8),
                               s_codes[rows], s_names, stream=(int(dev), -1)))

    steps = [(s.number, s.start, s.end) for s in metrics.steps] or [(-1, *metrics.window)]
    return TimelineIndex(lanes=lanes, steps=steps, window=metrics.window)


def _split_nesting(lane: Lane) -> tuple[Lane, Lane]:
    """Top-level ops (not inside an earlier op) and the nested rest, as two lanes."""
    n = len(lane)
    top = np.ones(n, dtype=bool)
    if n > 1:
        top[1:] = lane.starts[1:] >= lane.reach[:-1]

    def sub(mask, label, kind):
        return Lane(label, kind, lane.frame, lane.rows[mask], lane.starts[mask], lane.ends[mask], lane.styles[mask],
                    lane.codes[mask], lane.names, lane.thread)

    return sub(top, f"{lane.label} ops", "ops"), sub(~top, f"{lane.label} nested", "nested")


def _thread_order(model, metrics) -> list[tuple[int, int]]:
    """Threads with the training (launching) thread first, then the busiest."""
    counts: dict[tuple[int, int], int] = {}
    for df in (model.cpu, model.runtime):
        if len(df):
            for key, n in df.groupby(["pid", "tid"], sort=False).size().items():
                counts[(int(key[0]), int(key[1]))] = counts.get((int(key[0]), int(key[1])), 0) + int(n)
    main = metrics.launch_thread
    return sorted(counts, key=lambda k: (k != main, -counts[k], k))


def evidence_lane(ranges_us: list[tuple[float, float]], label: str) -> Lane:
    """A lane of highlighted time ranges (a finding's evidence)."""
    if ranges_us:
        arr = np.array(sorted(ranges_us), dtype=np.float64)
        starts, ends = arr[:, 0], arr[:, 1]
    else:
        starts = ends = np.empty(0)
    n = len(starts)
    return Lane(label, "evidence", "", np.arange(n), starts, ends, np.full(n, EVIDENCE, np.uint8),
                np.zeros(n, np.int32), pd.Index(["evidence"]))


def event_details(model, metrics, lane: Lane, i: int) -> list[tuple[str, str]]:
    """(label, value) pairs describing event i of a lane, for the detail panel. Values are raw trace
    strings: the caller makes them safe to display."""
    from .text import duration, nbytes

    start, end = float(lane.starts[i]), float(lane.ends[i])
    out = [("name", lane.name(i)), ("what", STYLE_NAMES.get(int(lane.styles[i]), "event")),
           ("start", f"{start / 1e3:.3f} ms from trace start"), ("duration", duration(end - start))]
    row = int(lane.rows[i])
    if lane.frame == "gpu":
        g = model.gpu.iloc[row]
        out.append(("stream", f"GPU {g['device']} stream {g['stream']}"))
        if g["kind"] == "memcpy" and g["bytes"] == g["bytes"]:
            out.append(("bytes", f"{nbytes(g['bytes'])} at {g['bytes'] / max(g['dur'], 1e-9) / 1e3:.2f} GB/s"))
        launch = _by_correlation(model.runtime, int(g["correlation"]))
        if launch is not None:
            out.append(("launched by", f"{launch['name']} on thread {launch['tid']}, "
                                        f"{(g['ts'] - launch['ts']):.0f} µs before it ran"))
    elif lane.frame == "runtime":
        r = model.runtime.iloc[row]
        op = _by_correlation(model.gpu, int(r["correlation"]))
        if op is not None:
            out.append(("GPU work", f"{op['name']} ({duration(op['dur'])})"))
    elif lane.frame == "cpu":
        c = model.cpu.iloc[row]
        dims = c.get("input_dims")
        if isinstance(dims, str) and dims and dims != "nan":
            out.append(("inputs", dims))
    elif lane.frame == "dataloader":
        d = metrics.dataloader.iloc[row]
        if d.get("source"):
            out.append(("source", str(d["source"])))
    return out


def _by_correlation(df: pd.DataFrame, corr: int):
    if corr < 0 or df.empty:
        return None
    hit = np.flatnonzero(df["correlation"].to_numpy() == corr)
    return df.iloc[hit[0]] if hit.size else None

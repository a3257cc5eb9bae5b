"""CPU spans and what lies inside them: DataLoader `__next__` spans, annotations such as
`Optimizer.step#…`, the CPU ops inside a set of spans and the GPU ops launched from them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .source_lines import python_source, user_frame_from_stack
from .steps import Step, step_of
from gpuadvise.analyzer.model.calls import DATALOADER
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in

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
    d["step"] = step_of(d["ts"].to_numpy(), steps)
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
    keep = inside_any(ops["ts"].to_numpy(), ops["tid"].to_numpy(), spans, ends=ops["end"].to_numpy())
    return ops[keep]


def inside_any(ts: np.ndarray, tid: np.ndarray, spans: pd.DataFrame, ends: np.ndarray | None = None) -> np.ndarray:
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
    return launches[inside_any(launches["launch_ts"].to_numpy(), launches["tid"].to_numpy(), spans)]


TOUCH_US = 1e-6  # an op that starts where the previous one ended (to float rounding) is not inside it


def outermost(ts: np.ndarray, end: np.ndarray, tid: np.ndarray, holders: np.ndarray | None = None) -> np.ndarray:
    """Per item: whether no holder (`holders` picks them; every item when None) on its thread holds it.
    Per thread, by start with the longer first on a tie, against the running maximum of the holders' ends
    before it: ops nest on a thread, so that finds them without walking the tree."""
    out = np.ones(len(ts), dtype=bool)
    holders = np.ones(len(ts), dtype=bool) if holders is None else holders
    for t in np.unique(tid):
        rows = np.flatnonzero(tid == t)
        order = rows[np.lexsort((-end[rows], ts[rows]))]
        reach = np.where(holders[order], end[order], -np.inf)
        before = np.concatenate([[-np.inf], np.maximum.accumulate(reach)[:-1]])
        out[order] = ts[order] >= before - TOUCH_US
    return out

"""Sync points: every call that blocks the training thread on the GPU, explicit (stream, event and device
syncs, blocking copies, `.item()`) or implicit (pageable copies that wait for the stream), with the step
it fell in and where it came from."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .source_lines import attribute
from .steps import Step, step_of
from gpuadvise.analyzer.model.calls import ASYNC_COPIES, COPY_CALLS, DEVICE_SYNCS, LAUNCH_CALLS, SYNC_CALLS
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in

IMPLICIT_WAIT_US = 50.0  # a pageable copy call this much longer than its copy waited for earlier GPU work


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
    s["step"] = step_of(s["ts"].to_numpy(), steps)
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
    calls = rt[names_in(rt["name"], ASYNC_COPIES)]
    calls = calls[calls["correlation"].isin(copies["correlation"])].copy()  # (isin on the copy calls only)
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

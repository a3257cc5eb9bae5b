"""A file that holds several ranks of one job → one `TraceModel` per rank.

Tools that merge a job's per-rank traces into one file for a timeline viewer write every rank's events
side by side. AMD's TraceLens (`TraceFuse`) is the common one: it drops each file's header
(`deviceProperties`, `distributedInfo`), adds `rank` to every event's args, moves each rank's process
ids (and its correlation ids) by `rank × 10^k` so that no two ranks share one, drops the ranks' own
`process_name` events and labels every process instead: `RANK r - CPU` for the rank's process,
`RANK r - GPU` for its device. Read as one trace, such a file is four GPUs' kernels on one timeline: the
union of their busy time, no job, no straggler.

Which rank an event belongs to, from what the model keeps:
- **processes**: a process whose name says its rank (`RANK 2 - CPU`, `rank 2`) is that rank's; where no
  name says, every process that launches GPU work is taken as one rank, numbered in process-id order
  (TraceLens's id scheme keeps that order; a note says the numbering is the file's order, not a record);
- **CPU events** (ops, annotations, runtime calls, CPU-side collectives) by their process id;
- **GPU events** (kernels, copies, syncs, collective kernels) by the runtime call that launched them
  (their correlation id, which the merge keeps apart per rank); one that no call launched (a graph's
  node, a trace without its CPU side) by its device and stream, when those ran only that rank's work;
- **[memory] events** by their device, when only one rank used it; **python frames** by their thread.

An event that cannot be told to a rank is left out, and counted in a note. A file of one process, or
whose processes are not ranks of a job (nothing says so and no more than one launches GPU work), is not
split: `split_ranks` returns None and the file is read as one trace, exactly as before.

Each rank's model is what its own file would have given: its tables (rows in the file's order, names
without the other ranks' unused ones), its time rebased to its own first event (`meta.base_ts_us` keeps
the absolute clock the job view lines the ranks up on), its rank, and a world size: the surviving
`distributedInfo`'s when there is one, else at least the ranks the file holds (the highest rank + 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.trace import TraceModel

TABLES = ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations", "comms")
# a process named for its rank: TraceLens's "RANK 3 - GPU", "rank3", "Rank 3 (trainer)"
RANK_NAME = re.compile(r"\brank\s*[-_:#]?\s*(\d+)\b", re.I)
NONE = -1  # no rank


@dataclass
class RankPart:
    rank: int
    model: TraceModel
    processes: list[int] = field(default_factory=list)  # the rank's process ids in the file


@dataclass
class RankSplit:
    parts: list[RankPart]
    how: str  # what said which events are whose, in words
    left_out: dict[str, int] = field(default_factory=dict)  # table → events no rank could be given

    @property
    def ranks(self) -> list[int]:
        return [p.rank for p in self.parts]

    def notes(self) -> list[str]:
        out = [f"the file holds {len(self.parts)} ranks of one job ({self.how}): each is analysed as its own trace, "
               "then the ranks as a job"]
        lost = {k: v for k, v in self.left_out.items() if v}
        if lost:
            out.append("left out, as no rank could be told for them: "
                       + ", ".join(f"{n} {_TABLE_WORDS.get(k, k)}" for k, n in lost.items()))
        return out


_TABLE_WORDS = {"gpu": "GPU events", "runtime": "runtime calls", "cpu": "CPU ops", "python": "Python frames",
                "memory": "[memory] events", "syncs": "sync events", "gpu_annotations": "GPU annotations",
                "comms": "collective events"}


def process_ranks(model: TraceModel) -> tuple[dict[int, int], str] | None:
    """Process id → rank for a file of several ranks, and what said so; None for one process, or for
    processes that are not several ranks."""
    cpu_pids = _pids(model.cpu) | _pids(model.runtime)
    if len(cpu_pids) < 2:
        return None
    named = {}
    for pid, name in model.meta.process_names.items():
        m = RANK_NAME.search(name)
        if m:
            named[pid] = int(m.group(1))
    if all(p in named for p in cpu_pids) and len({named[p] for p in cpu_pids}) >= 2:
        tracelens = any(re.fullmatch(r"RANK \d+ - (CPU|GPU)", model.meta.process_names[p]) for p in named)
        how = ("its processes are named RANK r - CPU / GPU, as TraceLens merges a job" if tracelens
               else "its processes are named for their ranks")
        return named, how
    # nothing names them: the processes that each launch GPU work, numbered in process-id order
    launching = sorted(p for p in cpu_pids if _launches(model, p))
    if len(launching) < 2:
        return None
    return ({pid: r for r, pid in enumerate(launching)},
            f"{len(launching)} processes each launch GPU work and no name says their ranks: numbered 0–"
            f"{len(launching) - 1} in process-id order")


def split_ranks(model: TraceModel) -> RankSplit | None:
    """The file's ranks, one model each (module docstring); None when it holds one rank."""
    found = process_ranks(model)
    if found is None:
        return None
    pid_rank, how = found
    owner = _owners(model, pid_rank)
    ranks = sorted(set(int(r) for r in np.concatenate([o[o >= 0] for o in owner.values()]).tolist()))
    if len(ranks) < 2:
        return None
    world = model.meta.world_size if model.meta.world_size and model.meta.world_size > max(ranks) else max(ranks) + 1
    parts = [RankPart(r, _part(model, owner, r, world, pid_rank), sorted(p for p, q in pid_rank.items() if q == r))
             for r in ranks]
    left_out = {t: int((o == NONE).sum()) for t, o in owner.items()}
    return RankSplit(parts, how, left_out)


def _pids(df: pd.DataFrame) -> set[int]:
    return set(df["pid"].unique().tolist()) if len(df) else set()


def _launches(model: TraceModel, pid: int) -> bool:
    """Whether the process's runtime calls launched any recorded GPU work."""
    rt = model.runtime
    corr = rt["correlation"].to_numpy()[rt["pid"].to_numpy() == pid]
    return bool(np.isin(model.gpu["correlation"].to_numpy(), corr[corr >= 0]).any()) if len(corr) else False


def _owners(model: TraceModel, pid_rank: dict[int, int]) -> dict[str, np.ndarray]:
    """Per table, each row's rank (NONE where none can be told)."""

    def by_pid(pids: np.ndarray) -> np.ndarray:
        return pd.Series(pids).map(pid_rank).fillna(NONE).to_numpy(dtype=np.int64)

    rt = model.runtime
    rt_rank = by_pid(rt["pid"].to_numpy())
    # correlation → the rank of the call that made it; one that two ranks share tells nothing
    corr = pd.DataFrame({"c": rt["correlation"].to_numpy(), "r": rt_rank})
    corr = corr[(corr["c"] >= 0) & (corr["r"] >= 0)].drop_duplicates()
    shared = corr["c"].duplicated(keep=False)
    by_corr = corr[~shared].set_index("c")["r"]

    def launched(df: pd.DataFrame) -> np.ndarray:
        return df["correlation"].map(by_corr).fillna(NONE).to_numpy(dtype=np.int64) if len(df) \
            else np.zeros(0, dtype=np.int64)

    gpu_rank = launched(model.gpu)
    # where a device and stream ran one rank's launched work only, its other rows are that rank's too
    g = model.gpu
    where = pd.DataFrame({"d": g["device"].to_numpy(), "s": g["stream"].to_numpy(), "r": gpu_rank})
    seen = where[where["r"] >= 0].drop_duplicates()
    lane = seen.groupby(["d", "s"])["r"].agg(lambda r: r.iloc[0] if len(r) == 1 else NONE)
    device = seen[["d", "r"]].drop_duplicates().groupby("d")["r"].agg(lambda r: r.iloc[0] if len(r) == 1 else NONE)

    def by_lane(df: pd.DataFrame, first: np.ndarray) -> np.ndarray:
        if not len(df) or (first >= 0).all():
            return first
        keys = pd.MultiIndex.from_arrays([df["device"].to_numpy(), df["stream"].to_numpy()])
        other = pd.Series(lane.reindex(keys).to_numpy()).fillna(NONE).to_numpy(dtype=np.int64) if len(lane) \
            else np.full(len(df), NONE)
        return np.where(first >= 0, first, other)

    comms = model.comms
    comm_rank = np.full(len(comms), NONE, dtype=np.int64)
    if len(comms):
        kernel = (comms["role"] == "kernel").to_numpy()
        comm_rank = np.where(kernel, launched(comms), by_pid(comms["pid"].to_numpy()))
        lanes = comms.rename(columns={"pid": "device", "tid": "stream"})  # a collective kernel's pid/tid: device/stream
        comm_rank = np.where(kernel, by_lane(lanes, comm_rank), comm_rank)
    cpu = model.cpu
    cpu_rank = by_pid(cpu["pid"].to_numpy())
    # a python frame by its thread: the thread of one rank's CPU ops
    tids = pd.DataFrame({"t": cpu["tid"].to_numpy(), "r": cpu_rank})
    tids = tids[tids["r"] >= 0].drop_duplicates()
    by_tid = tids[~tids["t"].duplicated(keep=False)].set_index("t")["r"]
    py = model.python
    mem = model.memory
    return {
        "gpu": by_lane(g, gpu_rank),
        "runtime": rt_rank,
        "cpu": cpu_rank,
        "python": py["tid"].map(by_tid).fillna(NONE).to_numpy(dtype=np.int64) if len(py) else np.zeros(0, np.int64),
        "memory": mem["device"].map(device).fillna(NONE).to_numpy(dtype=np.int64) if len(mem) and len(device)
        else np.full(len(mem), NONE, dtype=np.int64),
        "syncs": by_lane(model.syncs, launched(model.syncs)),
        "gpu_annotations": by_lane(model.gpu_annotations, np.full(len(model.gpu_annotations), NONE, dtype=np.int64)),
        "comms": comm_rank,
    }


def _part(model: TraceModel, owner: dict[str, np.ndarray], rank: int, world: int, pid_rank: dict[int, int]) -> TraceModel:
    """Rank `rank`'s model: its rows of every table, rebased to its own first event."""
    frames = {}
    for t in TABLES:
        df = getattr(model, t)
        keep = owner[t] == rank
        part = df[keep].reset_index(drop=True)
        if "name" in part and isinstance(part["name"].dtype, pd.CategoricalDtype):
            part["name"] = part["name"].cat.remove_unused_categories()
        frames[t] = part
    starts = [float(f["ts"].min()) for f in frames.values() if len(f)]
    shift = min(starts) if starts else 0.0
    if shift:
        for f in frames.values():
            if len(f):
                f["ts"] = f["ts"] - shift
                if "end" in f:
                    f["end"] = f["ts"] + f["dur"]
    pids = {p for p, r in pid_rank.items() if r == rank}
    meta = model.meta
    rows = sum(len(f) for f in frames.values())
    share = rows / max(sum(len(getattr(model, t)) for t in TABLES), 1)
    part_meta = replace(
        meta, rank=rank, world_size=world, base_ts_us=meta.base_ts_us + shift,
        events_total=int(round(meta.events_total * share)), events_skipped=0,
        process_names={p: n for p, n in meta.process_names.items() if p in pids},
        thread_names={k: n for k, n in meta.thread_names.items() if k[0] in pids},
        devices=list(meta.devices), versions=dict(meta.versions), flags=dict(meta.flags),
        unknown_categories={})
    return TraceModel(meta=part_meta, **frames)

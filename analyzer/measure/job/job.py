"""The job-level view of a multi-rank run: the reduce step after each rank was analysed on its own.

Each rank contributes a small `RankStats` (computed where its trace was analysed, in a worker process
or on a Dask worker); `build_view` lines the ranks up by ProfilerStep number and their collectives one
by one (measure/job/waits.py).

Definitions:
- wait: in a synchronous job a collective ends only when the last rank joins it. Each collective is
  matched across the ranks, their clocks aligned by the collectives' ends, and a rank's wait in it is
  (last rank's arrival) − (its own arrival); its *exposed* wait is the part of that it did no other work
  (measure/job/waits.py). A rank's wait in a step is the exposed wait of the collectives its step issued,
  on every backend: NCCL/RCCL kernels and CPU backends (gloo) alike. A trace whose collectives cannot be
  matched (different counts on different ranks) falls back to the communication kernels: per step, the
  rank with the least exposed communication waited least, the others' wait is their exposed
  communication minus that minimum (the TensorBoard plugin's "synchronizing time").
- caused: the wait a rank made the others spend: per collective, the median exposed wait of the other
  ranks, counted on the rank that arrived last. The rank the others wait for is the straggler.
- work of a rank in a step: its step time minus its wait, i.e. how long the step would take if no other
  rank held it back.
- comm/compute overlap (HTA's `get_comm_comp_overlap`): |∪comm ∩ ∪compute| / |∪comm| over the whole
  trace, where comm kernels are NCCL/RCCL collectives (`kernels.is_comm`) and compute kernels are all
  other kernels (memcpy/memset are neither).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import commgroups, grouptime, waits
from ..basics import intervals as iv
from .collectives import RankCollectives, own_work, rank_collectives
from .gradients import reduction_room_per_step
from .ranktime import thread_time
from ..basics.perstep import count_of
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.kernels import is_comm
from gpuadvise.analyzer.model.trace import name_mask


@dataclass
class RankStats:
    """What the reduce needs from one rank: per-step figures and communication totals (µs)."""

    rank: int | None
    source: str
    world_size: int | None
    steps: list[int]
    start_us: list[float]  # where each step starts in this rank's own trace (its clock, from its start)
    dur_us: list[float]
    busy_pct: list[float]
    compute_us: list[float]
    comm_us: list[float]
    exposed_comm_us: list[float]
    dataloader_us: list[float]
    comm_total_us: float = 0.0
    comm_overlap_us: float = 0.0
    busy_in_steps_pct: float | None = None
    median_step_us: float = 0.0
    has_gpu: bool = True
    base_us: float = 0.0  # the trace's own clock at its rebased 0 (absolute µs): step starts + this compare across ranks
    cpu_start_us: list[float] = field(default_factory=list)  # each step's CPU span start (rebased, like start_us)
    backend: str | None = None  # distributedInfo's backend ("nccl", "gloo", …)
    collectives: RankCollectives | None = None  # every collective it ran, for the matching
    # the training thread, per step (measure/job/ranktime.py): inside ops, outside every op, and where
    sync_us: list[float] = field(default_factory=list)
    op_us: list[float] = field(default_factory=list)
    untraced_us: list[float] = field(default_factory=list)
    gap_before: list[str] = field(default_factory=list)
    # per step: the rank's own work after its first gradient is ready (measure/job/gradients.py), what a reduction
    # can hide behind; [] when the trace records no gradient accumulation (unknown)
    reduction_room_us: list[float] = field(default_factory=list)
    # the process groups this rank is in, as its trace header and run.json list them ({"name", "desc",
    # "ranks", "source"}), and the device meshes run.json recorded (measure/job/commgroups.py, grouptime.py)
    groups: list[dict] = field(default_factory=list)
    meshes: list[dict] = field(default_factory=list)

    @property
    def overlap_pct(self) -> float | None:
        """HTA's comm/compute overlap, in %; None without communication kernels."""
        return 100.0 * self.comm_overlap_us / self.comm_total_us if self.comm_total_us > 0 else None


def rank_stats(report, facts: dict | None = None) -> RankStats | None:
    """From one analysed trace (a TraceReport with its full model and metrics) and its run.json `facts`."""
    model, m = report.model, report.metrics
    if model is None or m is None:
        return None
    k = model.kernels
    comm_mask = name_mask(k["name"], is_comm) if len(k) else np.zeros(0, dtype=bool)
    ts, end = k["ts"].to_numpy(), k["end"].to_numpy()
    comm = iv.union(ts[comm_mask], end[comm_mask])
    comp = iv.union(ts[~comm_mask], end[~comm_mask])
    both = iv.union(np.concatenate([comm[0], comp[0]]), np.concatenate([comm[1], comp[1]]))
    comm_total = iv.total(*comm)
    overlap_total = comm_total + iv.total(*comp) - iv.total(*both)

    ps = m.per_step  # one row per step, or one for the whole trace (step -1) when it has no steps
    lo = ps["start_us"].to_numpy(dtype=float)
    hi = lo + ps["dur_us"].to_numpy(dtype=float)
    comm_in = iv.covered(*comm, lo, hi)
    overlap_in = comm_in + iv.covered(*comp, lo, hi) - iv.covered(*both, lo, hi)

    def col(name):
        return [float(x) for x in ps[name]] if name in ps else [0.0] * len(ps)

    thread = thread_time(model, m)
    return RankStats(
        rank=report.rank,
        source=report.source,
        world_size=model.meta.world_size,
        steps=[int(s) for s in ps["step"]],
        start_us=col("start_us"),
        dur_us=col("dur_us"),
        busy_pct=col("gpu_busy_pct"),
        compute_us=col("kernel_us"),
        comm_us=col("comm_us"),  # the per-step table's time inside collectives: the Steps table's figure
        exposed_comm_us=[float(x) for x in np.clip(comm_in - overlap_in, 0, None)],
        dataloader_us=col("dataloader_us"),
        comm_total_us=float(comm_total),
        comm_overlap_us=float(max(overlap_total, 0.0)),
        busy_in_steps_pct=m.busy_in_steps_pct if m.steps else m.gpu_busy_pct,
        median_step_us=float(m.median_step_us),
        has_gpu=bool(m.has_gpu),
        base_us=float(model.meta.base_ts_us),
        cpu_start_us=col("cpu_start_us"),
        backend=model.meta.backend,
        collectives=rank_collectives(model, m),
        sync_us=col("sync_us"),
        op_us=thread.op_us,
        untraced_us=thread.untraced_us,
        gap_before=thread.gap_before,
        reduction_room_us=_reduction_room(model, m),
        groups=commgroups.groups_of_rank(model.meta.process_groups, runfacts.process_groups(facts or {})),
        meshes=runfacts.meshes(facts or {}),
    )


def _reduction_room(model, m) -> list[float]:
    base = float(model.meta.base_ts_us)
    work_lo, work_hi = own_work(model)
    room = reduction_room_per_step(model, m, (work_lo - base, work_hi - base))
    return [] if room is None else room


@dataclass
class StepStraggler:
    step: int
    rank: int
    work_us: float  # the slowest rank's work in this step
    others_median_us: float  # median work of the other ranks
    slower_pct: float
    job_step_us: float  # the step as the job saw it: the longest rank's step time
    caused_us: float = 0.0  # the wait it made the other ranks spend in this step (median over them)


@dataclass
class JobView:
    """All ranks side by side. `grid` holds per-step arrays shaped (ranks, matched steps)."""

    ranks: list[RankStats]
    steps: list[int]  # ProfilerStep numbers every rank recorded
    grid: dict[str, np.ndarray]
    stragglers: list[StepStraggler]
    world_size: int | None = None
    notes: list[str] = field(default_factory=list)
    matched: waits.Matched | None = None  # the collectives lined up across ranks (None: none could be)
    collectives: list[dict] = field(default_factory=list)  # waits per collective and rank (waits.by_collective)
    groups: list[dict] = field(default_factory=list)  # per process group and phase (grouptime.by_group)
    mesh: dict | None = None  # the device mesh, where the groups or run.json say it (grouptime.mesh)
    resolved: commgroups.Resolved | None = None  # each collective's process group

    @property
    def whole_trace(self) -> bool:
        """No rank recorded ProfilerStep: each rank's whole trace is the one step compared."""
        return self.steps == [WHOLE_TRACE]

    def step_label(self, step: int) -> str:
        """A compared step in words: "#3", or "the trace" for a job without ProfilerStep."""
        return "the trace" if step == WHOLE_TRACE else f"#{step}"

    @property
    def shows_groups(self) -> bool:
        """The job's communication is worth showing by group and phase: two or more kinds of process group
        (a device mesh), or one whose collectives come from two or more phases (FSDP's)."""
        return len(self.groups) >= 2 or any(len(g["phases"]) >= 2 for g in self.groups)

    def mesh_words(self) -> str:
        """The mesh in words: "dp × tp = 2 × 2: dp [0, 2] [1, 3]; tp [0, 1] [2, 3]" ("" without one)."""
        m = self.mesh
        if not m:
            return ""
        dims = " × ".join(m["dims"])
        shape = " × ".join(str(x) for x in m["shape"])
        groups = "; ".join(f"{d} " + " ".join(str(g) for g in m["groups"].get(d, [])) for d in m["dims"]
                           if m["groups"].get(d))
        return f"{dims} = {shape}" + (f": {groups}" if groups else "")

    @property
    def rank_ids(self) -> list[int]:
        return [int(r.rank) for r in self.ranks]

    def per_rank(self) -> list[dict]:
        """One row per rank: the job table of the reports. With collectives lined up across the ranks,
        communication is the time inside them (kernels or a CPU backend's), else the NCCL/RCCL kernels'."""
        rows = []
        g = self.grid
        for i, r in enumerate(self.ranks):
            row = {"rank": r.rank, "trace": r.source, "steps": len(r.steps),
                   "median_step_ms": _ms(np.median(r.dur_us)) if r.dur_us else _ms(r.median_step_us),
                   "gpu_busy_pct": _round(r.busy_in_steps_pct),
                   "comm_ms": _ms(np.median(r.comm_us)) if r.comm_us else 0.0,
                   "exposed_comm_ms": _ms(np.median(r.exposed_comm_us)) if r.exposed_comm_us else 0.0,
                   "comm_overlap_pct": _round(r.overlap_pct)}
            if self.steps and self.matched is not None:
                row["exposed_comm_ms"] = _ms(np.median(g["wait_us"][i] + g["exposed_transfer_us"][i]))
            if self.steps:
                row["wait_ms"] = _ms(np.median(g["wait_us"][i]))
                row["work_ms"] = _ms(np.median(g["work_us"][i]))
                row["caused_wait_ms"] = _ms(np.median(g["caused_us"][i]))
            if self.matched is not None:
                row["clock_offset_ms"] = _ms(self.matched.offsets_us[i])
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return {
            "ranks": self.rank_ids,
            "world_size": self.world_size,
            "steps": self.steps,
            "per_rank": self.per_rank(),
            "straggler_per_step": [
                {"step": s.step, "rank": s.rank, "work_ms": _ms(s.work_us), "others_median_ms": _ms(s.others_median_us),
                 "slower_pct": round(s.slower_pct, 1), "job_step_ms": _ms(s.job_step_us),
                 "others_waited_ms": _ms(s.caused_us)} for s in self.stragglers],
            "collectives": self.collectives,
            "groups": self.groups,
            "mesh": self.mesh,
            "matched_collectives": len(self.matched) if self.matched is not None else 0,
            "notes": list(self.notes),
        }


def build_view(stats: list[RankStats]) -> JobView | None:
    """The job view of ≥2 traces with distinct known ranks of the same world size; None otherwise
    (separate traces, or ranks of different jobs)."""
    stats = [s for s in stats if s is not None]
    ids = [s.rank for s in stats]
    if len(stats) < 2 or any(r is None for r in ids) or len(set(ids)) != len(ids):
        return None
    sizes = {s.world_size for s in stats if s.world_size}
    if len(sizes) > 1:
        return None
    stats = sorted(stats, key=lambda s: s.rank)
    notes = []
    common = {n for n in stats[0].steps if n >= 0}
    for s in stats[1:]:
        common &= set(s.steps)
    steps = sorted(common)
    if not steps and all(s.steps == [WHOLE_TRACE] for s in stats):
        steps = [WHOLE_TRACE]
        notes.append("no rank recorded ProfilerStep: each rank's trace is compared as one step")
    elif not steps:
        notes.append("no ProfilerStep number is common to all ranks: steps cannot be compared across ranks")
    elif any(len([n for n in s.steps if n >= 0]) != len(steps) for s in stats):
        notes.append(f"compared the {len(steps)} steps every rank recorded")
    world = max(sizes) if sizes else None
    ids = [int(s.rank) for s in stats]
    resolved = commgroups.resolve([s.collectives for s in stats], ids, [s.groups for s in stats])
    matched = waits.match([s.collectives for s in stats], resolved) if steps else None
    if world and world > len(stats):
        notes.append(f"{len(stats)} of the job's {world} ranks were traced"
                     + (": waits are for the last of the traced ranks to arrive" if matched is not None else ""))
    if matched is not None:
        notes.append(f"{count_of(len(matched), 'collective')} lined up across the ranks (by {matched.by})"
                     + (f"; {matched.unmatched} ran on some ranks only and {'was' if matched.unmatched == 1 else 'were'} "
                        "left out" if matched.unmatched else ""))
    grid = _grid(stats, steps, matched)
    groups = grouptime.by_group(matched, resolved, ids, steps) if matched is not None else []
    if len(groups) > 1:
        notes.extend(resolved.notes)
    return JobView(ranks=stats, steps=steps, grid=grid, stragglers=_stragglers(grid, stats, steps), world_size=world,
                   notes=notes, matched=matched,
                   collectives=waits.by_collective(matched, ids, steps, grid["dur_us"]) if matched is not None else [],
                   groups=groups, mesh=grouptime.mesh(resolved, [mesh for s in stats for mesh in s.meshes]),
                   resolved=resolved)


WHOLE_TRACE = -1  # the step number of a trace without ProfilerStep (its whole trace, measure/basics/perstep.py)

GRID_COLUMNS = ("dur_us", "busy_pct", "compute_us", "comm_us", "exposed_comm_us", "dataloader_us", "sync_us", "op_us",
                "untraced_us")


def _grid(stats: list[RankStats], steps: list[int], matched: waits.Matched | None) -> dict[str, np.ndarray]:
    grid = {}
    for col in GRID_COLUMNS:
        rows = []
        for s in stats:
            values = getattr(s, col) or [0.0] * len(s.steps)
            by_step = dict(zip(s.steps, values))
            rows.append([by_step[n] for n in steps])
        grid[col] = np.array(rows, dtype=float).reshape(len(stats), len(steps))
    if matched is not None:
        grid["wait_us"] = np.minimum(waits.exposed_per_step(matched, steps, "wait"), grid["dur_us"])
        grid["transfer_us"] = waits.exposed_per_step(matched, steps, "transfer", less_own_work=False)
        grid["exposed_transfer_us"] = waits.exposed_per_step(matched, steps, "transfer")
        grid["caused_us"] = waits.caused(matched, steps)
    else:  # communication kernels that cannot be matched one by one: the least exposed comm is the transfer
        exposed = grid["exposed_comm_us"]
        least = exposed.min(axis=0, keepdims=True) if steps else np.zeros((1, 0))
        grid["wait_us"] = exposed - least
        grid["transfer_us"] = np.broadcast_to(least, exposed.shape).copy()
        grid["exposed_transfer_us"] = grid["transfer_us"].copy()
        caused = np.zeros_like(exposed)
        if steps and len(stats) > 1:
            slowest = np.argmin(exposed, axis=0)  # the rank that waited least was the last to arrive
            for j, r in enumerate(slowest.tolist()):
                caused[r, j] = float(np.median(np.delete(grid["wait_us"][:, j], r)))
        grid["caused_us"] = caused
    grid["work_us"] = grid["dur_us"] - grid["wait_us"]
    grid["late_us"] = _late_starts(stats, steps, matched)
    # what a reduction can hide behind, per rank and step (inf: unknown, a trace without autograd's ops)
    grid["reduction_room_us"] = np.array(
        [[dict(zip(s.steps, s.reduction_room_us)).get(n, 0.0) if s.reduction_room_us else np.inf for n in steps]
         for s in stats], dtype=float).reshape(len(stats), len(steps))
    return grid


def _late_starts(stats: list[RankStats], steps: list[int], matched: waits.Matched | None) -> np.ndarray:
    """(ranks, steps): how much later than the earliest rank each rank began the step (its CPU span), on
    the clock the collectives align; zeros when the clocks cannot be aligned (no collective matched)."""
    late = np.zeros((len(stats), len(steps)))
    if matched is None or not steps:
        return late
    for i, s in enumerate(stats):
        by_step = dict(zip(s.steps, s.cpu_start_us or [np.nan] * len(s.steps)))
        late[i] = [by_step[n] + s.base_us - matched.offsets_us[i] for n in steps]
    late = late - np.nanmin(late, axis=0, keepdims=True)
    return np.nan_to_num(late)


def _stragglers(grid, stats, steps) -> list[StepStraggler]:
    """Per step, the rank the others waited for (the most wait caused), else the one with the most work."""
    out = []
    work, dur, caused = grid["work_us"], grid["dur_us"], grid["caused_us"]
    for j, n in enumerate(steps):
        i = int(np.argmax(caused[:, j])) if caused[:, j].max() > 0 else int(np.argmax(work[:, j]))
        others = np.delete(work[:, j], i)
        ref = float(np.median(others))
        slower = float(100.0 * (work[i, j] / ref - 1.0)) if ref > 0 else 0.0
        out.append(StepStraggler(step=n, rank=int(stats[i].rank), work_us=float(work[i, j]), others_median_us=ref,
                                 slower_pct=slower, job_step_us=float(dur[:, j].max()), caused_us=float(caused[i, j])))
    return out


def _ms(us) -> float:
    return round(float(us) / 1e3, 3)


def _round(v, nd: int = 1):
    return None if v is None else round(float(v), nd)


class JobAnalysis:
    """What a job-level rule sees (`requires = ("ranks",)`): the job view, and each rank's own findings."""

    def __init__(self, view: JobView, rank_findings: dict | None = None, facts: dict | None = None):
        self.job = view
        self.rank_findings = rank_findings or {}  # rank → its per-rank findings
        self.facts = facts or {}  # the first rank's run.json (read through runfacts): how the job was set up

    def has(self, need: str) -> bool:
        return need == "ranks" and self.job is not None and len(self.job.ranks) >= 2

    def ms(self, us: float) -> float:
        return round(float(us) / 1e3, 3)


@dataclass
class JobReport:
    """The reduce step's result: the view, the job-level findings and notes."""

    view: JobView
    findings: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = self.view.to_dict()
        d["notes"] = list(self.notes)
        return d

"""What an analysis produces, as plain typed data: one `TraceReport` per trace or snapshot, gathered in
`Reports` (with the job-level report when several ranks were analysed). Every output reads their summary
(`model/summary.py`); the per-step and kernel tables, the timeline and the memory screens read the reports."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .findings import Finding, order
from .trace import TraceModel

if TYPE_CHECKING:  # the measurements are computed upstream; the report only carries them
    from gpuadvise.analyzer.measure.replay.calibration import Calibration
    from gpuadvise.analyzer.measure.job.job import RankStats
    from gpuadvise.analyzer.measure.memory import MemorySummary
    from gpuadvise.analyzer.measure.basics.metrics import Metrics


@dataclass(frozen=True)
class StepTime:
    """One ProfilerStep: its time, the CPU span and GPU span it is made of, and which one set it."""

    step: int
    ms: float
    cpu_ms: float
    gpu_ms: float
    bound: str  # "gpu" when the GPU span was the longer (the CPU ran ahead), else "cpu"


@dataclass(frozen=True)
class CpuStep:
    """One step of a run without a GPU timeline, as its training thread spent it (ms, measure/job/ranktime.py),
    four parts that add up to the step: inside recorded ops; waiting for the DataLoader's next batch outside
    them; waiting in a CPU backend's collectives outside both; outside all three (Python between ops)."""

    step: int
    ms: float
    in_ops_ms: float
    loader_wait_ms: float
    collective_wait_ms: float
    outside_ops_ms: float


@dataclass(frozen=True)
class LeftOutStep:
    """A ProfilerStep left out of every figure: it holds one-time costs (measure/basics/warmup.py)."""

    step: int
    ms: float
    reason: str


@dataclass(frozen=True)
class FlopClass:
    """One row of a step's FLOP arithmetic: an op family in one pass, measured against one dtype's peak."""

    family: str  # "matmul", "conv", "attention"
    phase: str  # "forward", "backward", "recompute" (a forward op run again in the backward)
    dtype: str  # the peak it is measured against: "bf16", "fp16", "tf32", "fp32", "fp8"
    flops: float  # hardware FLOPs per step (the median over the steps): what its kernels computed
    model_flops: float  # the model FLOPs among them (less what was recomputed: all of a recomputed forward op,
    # the scores a fused attention backward computes again)
    ops: float  # ops per step
    kernel_ms: float | None  # its kernels' time per step; None on a CPU run
    tflops: float | None  # what its kernels reached (flops / kernel time), TFLOP/s


@dataclass(frozen=True)
class PeakShare:
    """A dtype's dense peak and the share of the model FLOPs measured against it."""

    dtype: str
    tflops: float  # dense peak, TFLOP/s (the device table, model/devices.py)
    share_pct: float
    stand_in: str | None = None  # the dtype whose peak stands in where the device has none for this one


@dataclass(frozen=True)
class StepFlops:
    step: int
    ms: float
    model_flops: float
    hardware_flops: float
    mfu_pct: float | None
    hfu_pct: float | None


@dataclass(frozen=True)
class FlopFigures:
    """A trace's FLOPs per step and its model FLOPs utilization (measure/efficiency/utilization.py says how), as plain
    data: every output's header line and its arithmetic."""

    state: str  # "counted"; "no shapes" (matrix work ran, its shapes were not recorded); "no kernels" (shaped
    # ops, but none of their kernels can be linked to them)
    note: str | None = None  # what is missing and how to get it, or why there is no MFU (a CPU run, an unknown GPU)
    model_flops: float | None = None  # per step, forward + backward, no recompute (PaLM's model FLOPs)
    hardware_flops: float | None = None  # per step, what ran: recompute included
    step_ms: float | None = None  # the step time they are divided by (the header's median step)
    achieved_tflops: float | None = None  # model FLOPs / step time
    mfu_pct: float | None = None  # model FLOPs / step time / the peak of the dtypes they ran in
    hfu_pct: float | None = None  # hardware FLOPs the same way
    peak_tflops: float | None = None  # the one peak those make: the model FLOPs over their time at each dtype's peak
    device: str | None = None  # whose peaks: "H100 SXM" (devices.Spec.describe)
    gpus: int = 1  # the GPUs whose FLOPs and peaks these are (one process may drive several)
    peaks: list[PeakShare] = field(default_factory=list)  # one GPU's
    classes: list[FlopClass] = field(default_factory=list)
    steps: list[StepFlops] = field(default_factory=list)
    # causal attention as the kernels run it skips the masked half; counted whole (FlopCounterMode, and
    # nanoGPT's 6·N + 12·L·H·Q·T) the model FLOPs and MFU would be these
    whole_model_flops: float | None = None
    whole_mfu_pct: float | None = None
    # the same model FLOPs over run.json's unprofiled median step (the profiler slows the recorded steps)
    unprofiled_step_ms: float | None = None
    unprofiled_mfu_pct: float | None = None
    coverage_pct: float | None = None  # share of the matrix kernels' time in the steps whose FLOPs are counted
    uncounted: list[str] = field(default_factory=list)  # the busiest matrix kernels without a count
    basis: str = ""  # the headline's arithmetic in one line


@dataclass(frozen=True)
class GpuFigures:
    """One GPU of a process that drove several (DataParallel, model parallel by hand): its own figures,
    where the trace's are the average device's (measure/basics/metrics.py)."""

    device: int
    ops: int  # kernels, copies and memsets it ran
    busy_pct: float  # of the trace's GPU span
    busy_in_steps_pct: float | None  # of the steps' time (None without ProfilerStep)
    idle_ms: float  # its idle time in a step, the median over the steps


@dataclass(frozen=True)
class TraceFigures:
    """The summary figures of one trace, as plain data (computed once, by run/figures.py, while the
    events are there; a compact report keeps them). Times in ms, shares in % of the window or step."""

    device: str | None
    device_description: str | None  # runfacts.describe_device: the same words in every format and the TUI
    compute_capability: str | None
    platform: str | None
    events: int
    steps: int
    step_numbers: list[int]
    median_step_ms: float
    # both figures a step time is made of (metrics' module docstring): the CPU span alone is what HTA
    # and TensorBoard report; it understates the step when the CPU runs ahead
    median_step_cpu_ms: float
    median_step_gpu_ms: float
    step_time_basis: str
    # the profiler's own cost: run.json's unprofiled step time (None for traces from elsewhere)
    unprofiled_median_step_ms: float | None
    profiler_overhead_x: float | None
    profiler_calibration: str | None
    step_times_ms: list[StepTime]
    window_ms: float
    gpu_busy_pct: float | None
    gpu_busy_in_steps_pct: float | None
    temporal_breakdown: dict[str, float | None]
    step_breakdown_ms: dict[str, float]
    idle_breakdown_ms: dict[str, float]
    kernels: int
    events_skipped: int
    truncated: bool
    # one-time costs kept out of the figures above: the steps left out for them, and one sentence every
    # format prints (None when the trace has none)
    steps_left_out: list[LeftOutStep] = field(default_factory=list)
    one_time_note: str | None = None
    # steps far slower than the others and what their extra time went to (measure/longrun/slowsteps.py): how a
    # long run's window names the periodic stall it recorded
    slow_steps: list[dict] = field(default_factory=list)
    # FLOPs per step and MFU (measure/efficiency/utilization.py); None where the trace holds no matrix work
    flops: FlopFigures | None = None
    # a run without a GPU timeline (a CPU run): each step's CPU time, what its steps table shows; [] otherwise
    cpu_steps: list[CpuStep] = field(default_factory=list)
    # one process on several GPUs: each one's figures, devices ascending (empty for one GPU; the busy and
    # idle figures above are then the average device's)
    gpus: list[GpuFigures] = field(default_factory=list)


@dataclass
class TraceReport:
    source: str
    rank: int | None
    model: TraceModel | None
    metrics: Metrics | None
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    kind: str = "trace"  # "trace" or "snapshot" (a memory snapshot on its own)
    memory: MemorySummary | None = None
    snapshot: str | None = None  # the allocator snapshot read with a trace (run folder)
    rank_stats: RankStats | None = None  # when the trace is one rank of several
    calibration: Calibration | None = None  # the profiler's own cost
    figures: TraceFigures | None = None  # the summary figures (None without a trace's model and metrics)
    window: int | None = None  # a long run's window (run folder: 1, 2, …); None for any other trace

    def compact(self) -> "TraceReport":
        """A copy without the parsed events (what a worker sends back): the figures, findings, notes,
        memory and the per-step and kernel tables stay; the model keeps only its metadata."""
        if self.model is None or self.metrics is None:
            return replace(self)
        m = self.metrics
        empty = {name: getattr(self.model, name).iloc[0:0] for name in
                 ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations", "comms")}
        return replace(self, model=replace(self.model, **empty),
                       metrics=replace(m, ops=m.ops.iloc[0:0], copies=m.copies.iloc[0:0], syncs=m.syncs.iloc[0:0],
                                       launches=m.launches.iloc[0:0], dataloader=m.dataloader.iloc[0:0],
                                       gpu_union=(m.gpu_union[0][:0], m.gpu_union[1][:0])),
                       findings=list(self.findings), notes=list(self.notes))


@dataclass
class LongRunReport:
    """What changed over one process's run (a `gpuadvise profile` run folder with a step record): the
    run-level section's figures as plain data (`summary`: the keys are in run/longrun.py), the run-level
    findings and notes."""

    folder: str
    rank: int | None
    record: str  # the step record it was read from
    summary: dict
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"folder": self.folder, "rank": self.rank, "record": self.record, **self.summary,
                "notes": list(self.notes)}


class Reports(list):
    """The reports of `analyze_paths`, one per source (a list), the job-level report when two or more
    ranks were analysed together (`.job`, else None), the run-level reports of long runs (`.long_runs`, one per
    process with a step record), and the run.json facts read with the sources (`.facts`: trace path →
    facts; empty for traces from elsewhere)."""

    def __init__(self, reports=(), job=None, facts: dict | None = None, long_runs: list[LongRunReport] | None = None):
        super().__init__(reports)
        self.job = job
        self.facts = dict(facts or {})
        self.long_runs = list(long_runs or [])


def all_findings(reports: list[TraceReport]) -> list[Finding]:
    job = getattr(reports, "job", None)
    runs = getattr(reports, "long_runs", None) or []
    return order([f for r in reports for f in r.findings] + (job.findings if job is not None else [])
                 + [f for run in runs for f in run.findings], job=job is not None)


def overhead_words(x: float | None) -> str:
    """The profiler's overhead in words, one way for every format: a recorded step that ran as fast as an
    unprofiled one, or faster (run-to-run noise), shows no measurable overhead, never "0.68× slower"."""
    if x is None:
        return ""
    if x <= 1.05:
        return "no measurable profiler overhead"
    return f"the profiler made the traced steps {x:.2f}× slower"


def ms_text(ms: float) -> str:
    """A step time in ms, three significant digits without an exponent: "0.421", "28.9", "1984"."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def flop_text(flops: float | None, unit: str = "FLOP") -> str:
    """A FLOP count (or rate, `unit`="FLOP/s") with its SI prefix, three significant digits: "1.23 PFLOP",
    "45.6 GFLOP/s"."""
    if flops is None:
        return "–"
    for prefix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(flops) >= scale:
            v = flops / scale
            return f"{v:.3g} {prefix}{unit}" if v < 1000 else f"{v:.0f} {prefix}{unit}"
    return f"{flops:.0f} {unit}"


def per_gpu_words(figures: TraceFigures) -> str:
    """Each GPU of a process that drove several, in one line every format prints: "GPU 0 busy 96.9 %, idle
    0.30 ms per step · GPU 1 …" (the share inside the steps where the trace has them)."""
    where = "per step" if figures.steps else "in the window"
    parts = []
    for g in figures.gpus:
        busy = g.busy_in_steps_pct if g.busy_in_steps_pct is not None else g.busy_pct
        parts.append(f"GPU {g.device} busy {busy:.1f} %, idle {g.idle_ms:.2f} ms {where}")
    return " · ".join(parts)

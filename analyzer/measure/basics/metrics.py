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
- one process on several GPUs (DataParallel, model parallel by hand): every GPU time of the temporal
  breakdown and of the per-step table (busy, kernel, comm, memcpy, memset, idle) is the average device's:
  each device's own union, averaged over the devices. The union over devices would call four GPUs busy
  whenever any one of them is (tables.device_table has each device's figures). `gpu_union` stays the
  union: the time some GPU of the process was busy.

Steps are measured on the GPU timeline as well as the CPU one (steps.py says how); every per-step figure
and every share of step time uses `Step.dur`.

The pieces live by what they find: steps.py (steps and windows), tables.py (per-step table, breakdowns,
launches, kernels, ops, copies), syncs.py (sync points, implicit ones too), source_lines.py (the user's
line behind a call) and spans.py (DataLoader and annotation spans, what runs inside them). This module
puts them together once per trace.

One-time costs (first-call module loading, autotuning, allocator warm-up, a slow first step: warmup.py)
are kept out of every figure here, so no rule or renderer reads the job's start as its steady state: the
steps they make up a tenth of are left out (`steps` holds the others, `left_out_steps` these), as long
as one step remains; otherwise their time ranges (`one_time_cut`) are cut out of the window's figures
(per-step table, temporal and idle breakdowns) and of the replay. `one_time` says what was found.
Steps that hold a framework's evaluation or checkpoint (phases.py) are left out the same way.

torch.compile's own work (compilework.py: the `dynamo_timed` compile and autotuning spans) is a one-time
cost too: besides leaving its steps out, the syncs, copies and launches its calls made (the autotuner's
device syncs, pageable copies and benchmark kernels) are kept out of `syncs`, `copies`, `launches` and
`kernels`,
so no sync, copy or launch finding is built from them; `compile_work` holds the spans.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import intervals as iv
from . import phases
from .compilework import CompileWork, compile_work
from .spans import dataloader_spans
from .steps import Step, find_steps, gpu_timeline, trace_window
from .syncs import sync_table
from .tables import (copy_summary, copy_table, idle_breakdown, kernel_table, launch_stats, launch_thread, op_table,
                     per_step_table, temporal_breakdown)
from .warmup import SteadyPlan, plan
from gpuadvise.analyzer.model.trace import TraceModel

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
    compile_work: CompileWork | None = None  # torch.compile's compile spans, kept out of syncs/copies/launches

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
    work = compile_work(model)
    full = _compute(model, work=work)
    if not steady:
        return full
    # without a GPU timeline nothing is a GPU job's start, but compiling is a one-time cost on any device
    p = plan(model, full) if full.has_gpu else plan(model, full, compile_only=True)
    phases.apply(p, model, full.steps)  # a framework's evaluation or checkpoint step is no training step either
    if not p.left_out and p.cut is None and not p.costs:
        return full
    m = _compute(model, set(p.left_out), p.cut, work) if p.left_out or p.cut is not None else full
    m.one_time = p
    return m


def _compute(model: TraceModel, leave_out: set[int] | None = None, cut=None, work: CompileWork | None = None) -> Metrics:
    launches = launch_stats(model)
    compiler_calls = _compiler_correlations(model, work)
    if compiler_calls is not None:
        launches = launches[~launches["correlation"].isin(compiler_calls)]
    every = gpu_timeline(find_steps(model), launches)  # GPU times from every step: a left-out one still ends the one before
    steps = [s for s in every if s.number not in (leave_out or ())]
    dropped = [s for s in every if s.number in (leave_out or ())]
    window = trace_window(model, steps)
    gpu = model.gpu
    has_gpu = len(gpu) > 0
    gpu_union = iv.union(gpu["ts"].to_numpy(), gpu["end"].to_numpy())
    dl = dataloader_spans(model, steps)
    copies = copy_table(model, steps)
    syncs = sync_table(model, steps)
    if compiler_calls is not None:  # the compiler's own copies and syncs (module docstring)
        copies = copies[~copies["correlation"].isin(compiler_calls)].reset_index(drop=True)
        syncs = syncs[~work.inside(syncs["ts"].to_numpy(dtype=float))].reset_index(drop=True)
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
        kernels=kernel_table(model, leave_out=compiler_calls),
        ops=op_table(model),
        copies=copies,
        copy_summary=copy_summary(copies),
        syncs=syncs,
        launches=launches,
        dataloader=dl,
        gpu_union=gpu_union,
        launch_thread=launch_thread(model),
        left_out_steps=dropped,
        compile_work=work,
    )
    return metrics


def _compiler_correlations(model: TraceModel, work: CompileWork | None):
    """Correlation ids of the runtime calls made inside compile spans; None without compile spans."""
    return work.calls if work else None

"""What a rule sees: the model, its metrics, run facts, memory, and the replay that predicts savings.

A snapshot-only analysis has no model or metrics; a rule says what it needs in `Rule.requires`.
docs/rule-api.md documents every field here and the tables behind them.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import numpy as np
import pandas as pd

from .replay import replay_graph, whatif
from .job.collectives import RankCollectives, own_work, rank_collectives
from .compiled.compiledtrace import CompiledTrace, compiled_trace, trace_compile_facts, trace_steps
from .replay.calibration import NOISE, Calibration, calibrate, recorded_starts, scenario_on, unprofiled_step_ms
from gpuadvise.analyzer.model.calls import TRAINING
from gpuadvise.analyzer.model import devices, runfacts
from gpuadvise.analyzer.model.kernels import is_comm
from .memory import MemorySummary
from .basics.metrics import Metrics
from .efficiency.utilization import utilization
from gpuadvise.analyzer.model.trace import TraceModel, name_mask


class Analysis:
    def __init__(self, model: TraceModel | None, metrics: Metrics | None, facts: dict | None = None,
                 memory: MemorySummary | None = None):
        self.model = model
        self.metrics = metrics
        self.facts = facts or {}  # run.json facts from `gpuadvise profile` (DataLoader settings, ...)
        self.memory = memory  # snapshot, [memory] events and memory_stats, when any exist

    def has(self, need: str) -> bool:
        """Whether an input a rule requires is here: "trace" (model and metrics) or "memory"."""
        if need == "trace":
            return self.model is not None and self.metrics is not None
        if need == "memory":
            return self.memory is not None
        return False

    @property
    def device(self):
        return self.model.device if self.model is not None else None

    @cached_property
    def device_spec(self) -> devices.Spec:
        """The GPU's row of the device table (model/devices.py): its peaks and bandwidth, and how it was matched."""
        names = self.metrics.kernels["name"].head(200) if self.metrics is not None and len(self.metrics.kernels) else []
        platform = self.model.meta.platform if self.model is not None else "unknown"
        return devices.spec(self.device, platform, names)

    @cached_property
    def utilization(self):
        """The trace's FLOPs per step and MFU (utilization.py: `model.report.FlopFigures`); None without a
        trace or without matrix work."""
        if self.model is None or self.metrics is None:
            return None
        return utilization(self.model, self.metrics, self.device_spec, self.facts)

    @property
    def vendor(self) -> str:
        """The GPU's vendor ("nvidia", "amd", "unknown"): the traced device's name, else the platform's
        runtime calls or the libraries its kernels come from (devices.spec)."""
        dev = self.device
        if dev is not None and dev.name:
            return dev.vendor
        return self.device_spec.vendor

    @property
    def matrix_units(self) -> bool | None:
        return self.device_spec.has_matrix_units

    @cached_property
    def compiled(self) -> CompiledTrace | None:
        """torch.compile's share of each step in the trace (compiledtrace.py); None without compiled work."""
        if self.model is None or self.metrics is None:
            return None
        return compiled_trace(self.model, self.metrics)

    @cached_property
    def compile_facts(self) -> dict:
        """The facts the compile rules read: run.json's, with its `compiled` section; when run.json has
        none (a trace recorded with plain torch.profiler), the section the trace alone shows
        (compiled.trace_compile_facts), and the trace's steps when run.json has no step times. One set of
        facts, read the same way (model/runfacts.py), whichever source it came from."""
        if runfacts.compiled(self.facts) or self.model is None or self.metrics is None:
            return self.facts
        section = trace_compile_facts(self.model, self.metrics)
        if not section:
            return self.facts
        facts = dict(self.facts, compiled=section)
        if not runfacts.step_times_ms(facts):
            facts["steps"] = trace_steps(self.metrics)
        return facts

    @property
    def compile_facts_from_trace(self) -> bool:
        return runfacts.compiled(self.compile_facts).get("surface") == "trace"

    @cached_property
    def collectives(self) -> RankCollectives | None:
        """The collectives this rank ran, on any backend (measure/job/collectives.py); None without any."""
        return rank_collectives(self.model, self.metrics)

    @cached_property
    def own_work(self) -> tuple:
        """The rank's own work beside its collectives (measure/job/collectives.own_work), absolute µs."""
        return own_work(self.model)

    @cached_property
    def replay(self) -> whatif.Replay | None:
        if not self.metrics.has_gpu:
            return None
        return replay_graph.build(self.model, self.metrics)

    @cached_property
    def calibration(self) -> Calibration | None:
        """The profiler's own cost: fitted to run.json's unprofiled step time, else the typical per-event cost
        (calibration.py)."""
        return self._calibration(whatif.baseline_of(whatif.Scenario(name="")))

    def _calibration(self, mode: whatif.Scenario) -> Calibration | None:
        """The calibration of the replay in `mode` (whatif.baseline_of: its switches), cached per mode."""
        if self.metrics is None:
            return None
        cache = self.__dict__.setdefault("_calibrations", {})
        key = repr(mode)
        if key not in cache:
            measured, _ = unprofiled_step_ms(self.facts)
            replay = self.replay
            traced = float(self.metrics.median_step_us)
            calls = replay.calls if replay is not None else None
            fits = measured and traced > measured * 1e3 * NOISE  # the run shows what the profiler cost it
            events = recorded_starts(self.model, calls, python=bool(fits)) if replay is not None else None
            cache[key] = calibrate(replay, traced, self.facts, events, mode=mode)
        return cache[key]

    def _calibrated_baseline_us(self, mode: whatif.Scenario) -> float:
        cache = self.__dict__.setdefault("_calibrated_baselines", {})
        key = repr(mode)
        if key not in cache:
            cache[key] = self.replay.simulate(scenario_on(self._calibration(mode), replace(mode, name="calibrated")))
        return cache[key]

    def predicted_saving(self, scenario: whatif.Scenario) -> tuple[float | None, str]:
        """(% of step time the scenario saves, how that was predicted); None when no replay is possible.
        With unprofiled step times the replay is calibrated first: CPU time the profiler added is taken
        out of the baseline and of the scenario alike."""
        replay = self.replay
        if replay is None or replay.baseline_us <= 0:
            return None, ""
        mode = whatif.baseline_of(scenario)  # the baseline and its calibration replayed the way the scenario is
        cal = self._calibration(mode)
        basis = (f"critical-path replay of {replay.steps or 'the'} step{'s' if replay.steps != 1 else ''} "
                 f"({replay.actual_us / 1e3:.1f} ms traced, {replay.baseline_us / 1e3:.1f} ms replayed): {scenario.name}")
        if cal is not None and cal.applied:
            base = self._calibrated_baseline_us(mode)
            after = replay.simulate(scenario_on(cal, scenario))
            pct = max(0.0, 100.0 * (1.0 - after / base)) if base > 0 else 0.0
            basis = f"{basis}; {cal.describe()}"
        else:
            base, pct = replay.baseline_for(scenario), replay.saving_pct(scenario)
        self._predictions.append((basis, pct, self._without_waits(scenario, cal, base, pct)))
        return pct, basis

    @cached_property
    def _predictions(self) -> list:
        """Every prediction made so far: (basis, % saved, % of the step the fix saves of the rank's own work
        when no collective waits for another rank); what a job's prediction is built from (`own_work_saved`)."""
        return []

    def own_work_saved(self, basis: str) -> float | None:
        """For a finding whose basis holds a prediction made here: % of the step its fix saves of this rank's
        own work, its collectives taking only their transfer time (the engine's, for a job's prediction)."""
        return next((p[2] for p in reversed(self._predictions) if p[0] and p[0] in basis), None)

    def _without_waits(self, scenario: whatif.Scenario, cal, base: float, pct: float) -> float:
        """% of the step the scenario saves when the rank's collective kernels take only their transfer time,
        in the baseline and the fix alike: the rank's own work the fix removes, whatever the other ranks do
        (waits inside collectives are set by them). The transfer of a collective is the shortest time this
        trace shows for the same kernel on the same number of elements."""
        fixed = self._transfer_us
        if fixed is None or base <= 0:
            return pct
        own = scenario.gpu_time

        def gpu_time(o):
            mine = self.replay.of_ops(own) if own is not None else np.full(len(o), np.nan)
            return np.where(np.isnan(fixed), mine, fixed)

        # the baseline: only the collectives at their transfer (the fix's own kernel times stay out of it)
        plain = whatif.Scenario("transfer only", alloc_syncs=scenario.alloc_syncs, gpu_time=lambda o: fixed)
        fix = replace(scenario, gpu_time=gpu_time)
        if cal is not None and cal.applied:
            plain, fix = scenario_on(cal, plain), scenario_on(cal, fix)
        return max(0.0, 100.0 * (self.replay.simulate(plain) - self.replay.simulate(fix)) / base)

    @cached_property
    def _transfer_us(self) -> np.ndarray | None:
        """Per op of the replay, a collective kernel's transfer time (NaN for other ops: `_without_waits`);
        None without collective kernels."""
        ops = self.replay.ops
        comm = name_mask(ops["name"], is_comm)
        if not comm.any():
            return None
        elems = self._comm_elems
        # the collective kernels only (a name is a collective's or not, so no other op shares their groups)
        mine = ops[comm]
        key = pd.Series([f"{n}|{elems.get(c, '')}" for n, c in zip(mine["name"].astype(str), mine["correlation"])],
                        index=mine.index)
        transfer = np.full(len(ops), np.nan)
        transfer[comm] = mine["dur"].groupby(key).transform("min").to_numpy(dtype=float)
        return transfer

    @cached_property
    def _comm_elems(self) -> dict:
        """Correlation of a collective kernel → its element count (where the trace records it)."""
        c = self.model.comms
        k = c[(c["role"] == "kernel") & c["in_nelems"].notna()]
        return dict(zip(k["correlation"].to_numpy(), k["in_nelems"].to_numpy()))

    @property
    def trains(self) -> bool:
        """The trace holds training steps: backward work or an optimizer step (not a forward-only pass)."""
        cpu = self.model.cpu if self.model is not None else None
        if cpu is None or not len(cpu):
            return False
        names = cpu["name"].cat.categories if hasattr(cpu["name"], "cat") else cpu["name"].unique()
        return any(TRAINING.search(str(n)) for n in names)

    def bound_by(self) -> str:
        """What the step waits on, in words: the reason a fix elsewhere would save ~0 % of it."""
        m = self.metrics
        busy = None if m is None else (m.busy_in_steps_pct if m.steps else m.gpu_busy_pct)
        if busy is None:
            return "the trace does not show what the step waits on"
        if busy >= 80.0:
            return f"the GPU is busy {busy:.0f} % of the step with other work, which stays on the critical path"
        return (f"the GPU is idle {100 - busy:.0f} % of the step: the step is bound by the CPU side (Python, "
                "launches, syncs, input), not by these kernels")

    def ms(self, us: float) -> float:
        return round(us / 1e3, 3)

    def rel_ms(self, ts_us: float) -> float:
        """A trace time as ms from the start of the trace."""
        return round(ts_us / 1e3, 3)

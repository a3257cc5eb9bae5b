"""The trace is not the run: correct the replay for what the profiler itself cost.

The profiler adds a roughly fixed CPU cost to every event it records (an op, a runtime call, a Python
frame), so a loop whose CPU side matters runs slower in the recorded window than it does unprofiled
(measured on an H100: 1.5–2.7× on small-op loops, 1.00× on a GPU-bound one). The GPU's own work is not
slowed. The model takes c µs off every CPU gap between GPU calls per recorded event starting in it (and
off every runtime call the replay keeps), with c bisected so that the replayed step matches the step time
`gpuadvise profile` measured outside the window (run.json `steps.unprofiled_median_ms`), up to C_MAX; what
per-event cost cannot explain (a loader slowed by sampling, a GPU-bound loop) is then taken by one factor
k (≤ 1) on what is left of the CPU time. Every prediction is made on the calibrated replay: a
launch-bound loop whose CPU was doubled by the profiler is no longer called launch-bound, and host syncs
that looked free (the GPU had long finished by the time the slowed CPU asked) cost what they cost.

Why per event and not one factor over gap length: the cost lands where the events are. A
forward/backward dense with recorded ops is slowed far more than Python between syncs that records
nothing; one factor spreads the slowdown evenly, keeps the op-dense part CPU-bound above a GPU the real
run waits on, and under-predicts removing the syncs (fixtures.mechanisms.per_op_profiler_overhead: paper
27.9 % for removing the checks, one factor 18.5 %, per event 27.5 %; the syncs alone 23.6 %: 5.4 % vs
23.2 %; bf16 59.6 %: 0.4 % vs 51.1 %; the fitted c is 4.75 µs for the 5 µs planted). On the H100 pairs with
each run's measured step time the two agree within 1.4 points on every pair (launch 74.4 → 73.9 %,
optimizer 27.1 → 28.5 % for 33.5 % measured; the rest unchanged) and c comes out 1.7–6.5 µs on the
CPU-bound runs; frag-before, loader-before and tf32-after reach their measured step only with k as well
(c at C_MAX), as before, where one factor alone did the same.

Where the run does not show its own cost, the typical one is taken: TYPICAL_PER_EVENT_US per recorded op
or runtime call, the median of the per-event costs fitted on the nine CPU-bound H100 runs whose fit
converged (1.7–6.5 µs: emptycache-before/after, healthy-before/after, launch-before, optimizer-before/after,
zerograd-before/after; all recorded without Python frames, so `with_stack` frames are not counted). That
is the case
- without run.json step times (a trace from another tool, an older run folder), and
- when the traced step is the unprofiled one within noise (a GPU-bound loop: the GPU hid the profiler's
  cost, but the CPU side a fix would expose is still inflated: tf32-before, traced at its unprofiled
  32.6 ms, whose fixed loop is CPU-bound at 4.9 ms unprofiled and 6.3 ms traced), and
- in part, when the fitted cost is below the typical one and the unprofiled step is within PACED_BAND of
  the GPU's own pace (the replay with the CPU side all but gone): every cost from the fitted one up gives
  about the same step, so the fit is only the least the profiler cost, and the cost taken moves from the
  fitted one (at +10 %) to the typical one (at the GPU's pace) (an H100 ResNet-50 under bf16 autocast, bench/h100-pairs
  rn50-amp-nchw: fitted 1.8 µs at a 30.7 ms GPU-paced step; channels_last then ran at 19.8 ms, so its CPU
  side was well under the 30 ms that cost left it).
The report and every finding's basis say so ("no unprofiled step time: predicted with the typical
profiler cost for N recorded events per step").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .whatif import Scenario

# Below this the traced and unprofiled steps agree within run-to-run noise (~5 % measured): no correction.
NOISE = 1.05
K_MIN = 0.05  # the profiler never accounts for more than 95 % of the CPU time in a window
# the most the profiler is taken to cost per recorded event: 1.5× the largest fitted on the H100 pairs (6.5 µs)
C_MAX = 10.0
TYPICAL_PER_EVENT_US = 2.9  # the module docstring says where it comes from
# an unprofiled step within this share above the replay's GPU floor is (partly) the GPU's pace: the fitted
# per-event cost is then a lower bound, blended towards the typical one (all of it at the floor, none at +10 %)
PACED_BAND = 0.10


@dataclass
class Calibration:
    unprofiled_step_us: float | None  # median unprofiled step, from run.json (None: not measured)
    traced_step_us: float  # median step in the trace
    cpu_factor: float = 1.0  # k: what is left of the CPU time between GPU calls × k in every replay
    source: str = ""  # "run.json" when fitted to the measured step, "typical" for TYPICAL_PER_EVENT_US, "" neither
    clock: str = ""  # "cuda_event" or "cpu": how the unprofiled steps were timed
    per_event_us: float = 0.0  # c: µs the profiler cost per recorded event, off the CPU gap it starts in
    events_per_step: float = 0.0  # recorded events (ops, runtime calls, Python frames) per replayed step
    # the fit was a lower bound (the unprofiled step is near the GPU's pace): per_event_us is blended towards
    # the typical cost
    gpu_paced: bool = False
    fitted_us: float = 0.0  # the least cost that reaches the unprofiled step, where gpu_paced
    replayed: bool = False  # the steps had a GPU timeline to replay (else nothing could be corrected)
    events: np.ndarray | None = field(default=None, repr=False)  # their sorted start times

    @property
    def overhead_x(self) -> float | None:
        if not self.unprofiled_step_us or self.traced_step_us <= 0:
            return None
        return self.traced_step_us / self.unprofiled_step_us

    @property
    def applied(self) -> bool:
        return self.cpu_factor < 1.0 or self.per_event_us > 0

    def describe(self) -> str:
        """One sentence for a finding's basis or the report."""
        x = self.overhead_x
        if self.source == "typical":
            how = (f"the typical profiler cost for {self.events_per_step:,.0f} recorded events per step "
                   f"({self.per_event_us:g} µs each, fitted on the H100 pairs; Python frames not counted) taken off the "
                   "CPU time between GPU calls")
            if x is None:
                return f"no unprofiled step time: predicted with {how}"
            return (f"traced step {self.traced_step_us / 1e3:.1f} ms vs {self.unprofiled_step_us / 1e3:.1f} ms unprofiled "
                    f"({x:.2f}×): the GPU hid the profiler's cost, so predicted with {how}")
        if x is None:
            return "no unprofiled step time and no GPU timeline to replay: the CPU side may be inflated by profiling"
        if not self.applied:
            said = (f"traced step {self.traced_step_us / 1e3:.1f} ms vs {self.unprofiled_step_us / 1e3:.1f} ms "
                    f"unprofiled ({x:.2f}×)")
            if x <= NOISE:  # as report.overhead_words says: no measurable overhead
                return f"{said}: no correction needed"
            if self.replayed:  # the replay reached the unprofiled step with no cost taken off
                return f"{said}: the replay reaches the unprofiled step without a correction"
            # slowed beyond noise, but no replay to correct (no GPU timeline): the shares are the traced steps'
            return (f"{said}: not corrected, as there is no GPU timeline to replay; shares of the traced step "
                    "include the profiler's cost")
        if self.gpu_paced:
            return (f"calibrated to the unprofiled step ({self.unprofiled_step_us / 1e3:.1f} ms; traced "
                    f"{self.traced_step_us / 1e3:.1f} ms, {x:.2f}×), close to the GPU's own pace: the profiler cost at "
                    f"least {self.fitted_us:.1f} µs per recorded op, taken at {self.per_event_us:g} µs (towards the typical "
                    f"{TYPICAL_PER_EVENT_US:g}) "
                    f"({self.events_per_step:,.0f} ops per step) off the CPU time between GPU calls")
        how = []
        if self.per_event_us > 0:
            how.append(f"{self.per_event_us:.1f} µs per recorded op ({self.events_per_step:,.0f} per step) taken off "
                       "the CPU time between GPU calls")
        if self.cpu_factor < 1.0:
            how.append(f"{'what is left ' if how else 'CPU time between GPU calls '}× {self.cpu_factor:.2f}")
        return (f"calibrated to the unprofiled step ({self.unprofiled_step_us / 1e3:.1f} ms; traced "
                f"{self.traced_step_us / 1e3:.1f} ms, {x:.2f}×): " + ", ".join(how))


def recorded_starts(model, calls=None, python: bool = True) -> np.ndarray:
    """Sorted start times of everything the profiler recorded on the CPU side: ops (not user annotations,
    a handful per step), runtime calls and (`python`) Python frames. Each costs the profiler about the same.
    Runtime calls named in `calls` (the replay's own: their edges carry their share) are left out."""
    cpu, rt = model.cpu, model.runtime
    keep = ~rt["name"].astype(str).isin(set(calls["name"])).to_numpy() if calls is not None else slice(None)
    parts = [cpu.loc[~cpu["is_annotation"].to_numpy(dtype=bool), "ts"].to_numpy(dtype=np.float64),
             rt.loc[keep, "ts"].to_numpy(dtype=np.float64)]
    if python:
        parts.append(model.python["ts"].to_numpy(dtype=np.float64))
    return np.sort(np.concatenate(parts))


def unprofiled_step_ms(facts: dict) -> tuple[float | None, str]:
    """(median unprofiled step in ms, clock) from run.json; (None, "") when absent or malformed."""
    steps = facts.get("steps") if isinstance(facts, dict) else None
    if not isinstance(steps, dict):
        return None, ""
    v = steps.get("unprofiled_median_ms")
    clock = steps.get("clock") if isinstance(steps.get("clock"), str) else ""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None, clock
    return float(v), clock


def calibrate(replay, traced_step_us: float, facts: dict, events: np.ndarray | None = None,
              mode: Scenario | None = None) -> Calibration:
    """Find the profiler's cost for `replay` (a whatif.Replay over `replay.steps` steps) from run.json's
    unprofiled time: c µs per recorded event in `events` (sorted start times, `recorded_starts`) first, up
    to C_MAX; only what that cannot explain is scaled by k. Without `events`, k alone. `mode` (a
    baseline scenario, whatif.baseline_of) replays the steps with its switches (allocator syncs), so that a
    scenario in that mode is compared with a baseline calibrated the same way."""
    ms, clock = unprofiled_step_ms(facts)
    cal = Calibration(ms * 1e3 if ms else None, traced_step_us, source="run.json" if ms else "", clock=clock)
    mode = mode or Scenario(name="calibration")
    baseline = replay.baseline_for(mode) if replay is not None else 0.0
    if replay is None or baseline <= 0:
        return cal
    cal.replayed = True
    if ms is None or traced_step_us <= ms * 1e3 * NOISE:
        return typical(cal, replay, events)
    # The replay's window may not be exactly `steps` medians long: aim at the same ratio instead.
    target = baseline * (ms * 1e3) / traced_step_us
    if events is not None and len(events):
        ws, we = replay.window
        cal.events = events
        n = np.searchsorted(events, we) - np.searchsorted(events, ws) + len(replay.calls)  # the calls are events too
        cal.events_per_step = float(n) / max(1, replay.steps)
        c = _bisect(lambda c: replay.simulate(_scaled(mode, 1.0, events, c)), target, 0.0, C_MAX, rising=False, tol=0.01)
        cal.per_event_us = round(c, 2)
        if c < C_MAX:  # per-op cost explains it all
            floor = replay.simulate(_scaled(mode, 1.0, events, C_MAX))  # the step with the CPU side all but gone
            weight = min(1.0, max(0.0, (1 + PACED_BAND - target / max(floor, 1e-9)) / PACED_BAND))
            if c < TYPICAL_PER_EVENT_US and weight > 0:
                # the unprofiled step is (near) the GPU's own pace: every cost from c up gives about the same
                # step, so c is only the least the profiler cost; the CPU side a fix exposes is taken nearer
                # the typical cost the closer the step is to the GPU's pace (continuous: no cliff at a band)
                cal.fitted_us, cal.gpu_paced = cal.per_event_us, True
                cal.per_event_us = round(c + (TYPICAL_PER_EVENT_US - c) * weight, 2)
            return cal
    c = cal.per_event_us
    cal.cpu_factor = round(_bisect(lambda k: replay.simulate(_scaled(mode, k, events, c)), target, K_MIN, 1.0,
                                   rising=True, tol=1e-3), 4)
    return cal


def typical(cal: Calibration, replay, events: np.ndarray | None) -> Calibration:
    """The run does not show what the profiler cost it (module docstring): TYPICAL_PER_EVENT_US per recorded
    op or runtime call; `events` should leave Python frames out (recorded_starts(python=False))."""
    if events is None or not len(events):
        return cal
    ws, we = replay.window
    n = np.searchsorted(events, we) - np.searchsorted(events, ws) + len(replay.calls)
    return replace(cal, source="typical", per_event_us=TYPICAL_PER_EVENT_US, events=events,
                   events_per_step=float(n) / max(1, replay.steps))


def _bisect(f, target: float, lo: float, hi: float, rising: bool, tol: float) -> float:
    """The x in [lo, hi] where the monotone f(x) reaches target; the end nearest to it when it never does."""
    f_lo, f_hi = f(lo), f(hi)
    if (f_lo >= target) if rising else (f_lo <= target):
        return lo
    if (f_hi <= target) if rising else (f_hi >= target):
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        if (f(mid) > target) == rising:
            hi = mid
        else:
            lo = mid
        if hi - lo < tol:
            break
    return (lo + hi) / 2


def _scaled(mode: Scenario, k: float, events: np.ndarray | None = None, c: float = 0.0) -> Scenario:
    return replace(mode, name="calibration", cpu_scale=k,
                   cpu_per_event=(events, c) if events is not None and c > 0 else None)


def scenario_on(cal: Calibration, scenario):
    """The scenario as it plays on the calibrated replay: its CPU scaling on top of k."""
    if not cal.applied:
        return scenario
    per_event = (cal.events, cal.per_event_us) if cal.events is not None and cal.per_event_us > 0 else None
    return replace(scenario, cpu_scale=scenario.cpu_scale * cal.cpu_factor, cpu_per_event=per_event)


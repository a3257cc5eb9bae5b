"""The trace is not the run: correct the replay for what the profiler itself cost.

The profiler adds a roughly fixed CPU cost to every op it records (an event, shapes, a stack), so a
loop whose CPU side matters runs slower in the recorded window than it does unprofiled (measured on
an H100: 1.5–2.7× on small-op loops, 1.00× on a GPU-bound one). The GPU's own work is not slowed.
Because the cost is per recorded op and ops are spread through the CPU time between GPU calls, the
model scales that CPU time by one factor `k` (≤ 1), chosen so that the replayed step matches the step
time `gpuadvise profile` measured outside the window (run.json `steps.unprofiled_median_ms`). Every
prediction is then made on the calibrated replay: a launch-bound loop whose CPU was doubled by the
profiler is no longer called launch-bound, and host syncs that looked free (the GPU had long finished
by the time the slowed CPU asked) cost what they cost.

Why one factor over gap length and not a cost per recorded op (issue 19, checked on the H100 pairs with
each run's measured step time as run.json's): the alternative takes c µs off every CPU gap per recorded
op starting in it (and off every runtime call), with c bisected the same way. On the nine CPU-bound runs
the profiler slowed by more than 5 % (launch, optimizer, zerograd, emptycache, healthy; before and after)
the fitted c ranged 1.7–6.7 µs per op (3.9× spread) while 1/k ranged 1.37–2.73× (2.0×), so a per-op cost
is no more constant across loops than one factor is; on three GPU-bound or loader-bound runs (frag-before,
loader-before, tf32-after) no per-op cost up to 200 µs reached the unprofiled step, where k still does.
Every pair's predicted saving moved by at most 1.7 points between the two models (launch-bound on
launch-before 74.4 → 73.8 %, zerograd-before 73.6 → 71.9 %), all within tolerance either way. The data do
not favour the per-op model, so the simpler one stays; a lab with many syncs per step (where ops are
unevenly spread over the gaps) is what could still decide it.

Without run.json step times (a trace from elsewhere) nothing is scaled and the report says that the
CPU side may be inflated by profiling (typically 1.5–2.5× on loops of many small ops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .whatif import Scenario

# Below this the traced and unprofiled steps agree within run-to-run noise (~5 % measured): no correction.
NOISE = 1.05
K_MIN = 0.05  # the profiler never accounts for more than 95 % of the CPU time in a window
TYPICAL = "typically 1.5–2.5× on loops of many small ops, none on GPU-bound ones"


@dataclass
class Calibration:
    unprofiled_step_us: float | None  # median unprofiled step, from run.json (None: not measured)
    traced_step_us: float  # median step in the trace
    cpu_factor: float = 1.0  # k: CPU time between GPU calls × k in every replay
    source: str = ""  # "run.json" when measured, "" otherwise
    clock: str = ""  # "cuda_event" or "cpu": how the unprofiled steps were timed

    @property
    def overhead_x(self) -> float | None:
        if not self.unprofiled_step_us or self.traced_step_us <= 0:
            return None
        return self.traced_step_us / self.unprofiled_step_us

    @property
    def applied(self) -> bool:
        return self.cpu_factor < 1.0

    def describe(self) -> str:
        """One sentence for a finding's basis or the report."""
        x = self.overhead_x
        if x is None:
            return f"no unprofiled step time (not a `gpuadvise profile` run): the CPU side may be inflated by profiling ({TYPICAL})"
        if not self.applied:
            return (f"traced step {self.traced_step_us / 1e3:.1f} ms vs {self.unprofiled_step_us / 1e3:.1f} ms "
                    f"unprofiled ({x:.2f}×): no correction needed")
        return (f"calibrated to the unprofiled step ({self.unprofiled_step_us / 1e3:.1f} ms; traced "
                f"{self.traced_step_us / 1e3:.1f} ms, {x:.2f}×): CPU time between GPU calls × {self.cpu_factor:.2f}")


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


def calibrate(replay, traced_step_us: float, facts: dict) -> Calibration:
    """Find k for `replay` (a whatif.Replay over `replay.steps` steps) from run.json's unprofiled time."""
    ms, clock = unprofiled_step_ms(facts)
    cal = Calibration(ms * 1e3 if ms else None, traced_step_us, source="run.json" if ms else "", clock=clock)
    if ms is None or replay is None or replay.baseline_us <= 0 or traced_step_us <= ms * 1e3 * NOISE:
        return cal
    # The replay's window may not be exactly `steps` medians long: aim at the same ratio instead.
    target = replay.baseline_us * (ms * 1e3) / traced_step_us

    def at(k: float) -> float:
        return replay.simulate(_scaled(k))

    lo, hi = K_MIN, 1.0
    if at(lo) > target:  # even with almost no CPU time the GPU side is longer: take what CPU can give
        cal.cpu_factor = lo
        return cal
    for _ in range(30):  # the replay time is monotone in k: bisect
        mid = (lo + hi) / 2
        if at(mid) > target:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-3:
            break
    cal.cpu_factor = round((lo + hi) / 2, 4)
    return cal


def _scaled(k: float) -> Scenario:
    return Scenario(name="calibration", cpu_scale=k)


def scenario_on(cal: Calibration, scenario):
    """The scenario as it plays on the calibrated replay: its CPU scaling on top of k."""
    return replace(scenario, cpu_scale=scenario.cpu_scale * cal.cpu_factor) if cal.applied else scenario


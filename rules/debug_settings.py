"""debug-settings: debugging switches were on while the steps were profiled.

## What it detects
Settings that exist to debug a run and slow every step, as `gpuadvise profile` recorded them at the end
of the profiled window (run.json) or as the trace shows them:
- `CUDA_LAUNCH_BLOCKING=1` (or ROCm's `HIP_LAUNCH_BLOCKING` / `AMD_SERIALIZE_KERNEL`): in the trace, kernel
  launch calls that return only after their kernel has finished;
- autograd anomaly detection (`torch.autograd.set_detect_anomaly(True)` / `detect_anomaly()`): in the trace,
  a NaN check (`aten::isnan` … `aten::item`) after backward functions, each one a device sync on a GPU;
- deterministic algorithms (`torch.use_deterministic_algorithms(True)`, `cudnn.deterministic = True`);
- the environment variables `gpuadvise doctor` flags: `PYTORCH_NO_CUDA_MEMORY_CACHING=1`,
  `NCCL_DEBUG=INFO/TRACE`, `TORCH_DISTRIBUTED_DEBUG=DETAIL`, `TORCH_SHOW_CPP_STACKTRACES=1`, blocking NCCL
  waits, library API logging, … (one table, in `gpuadvise/doctor/probe.py`, serves both).

## Why it matters
Blocking launches take away the CPU's head start: each kernel must finish before Python runs on, so a
step costs its CPU time plus its GPU time instead of the larger of the two. Anomaly detection records a
Python traceback for every autograd node in forward and checks every gradient for NaN in backward,
which on a GPU is a `.item()`-style sync per backward function. Deterministic algorithms rule out the
fastest kernels of several ops. The logging variables write to disk or the console from inside
collectives and library calls.

## Fix
Turn them off outside debugging sessions:
```python
# in the job script, not in the code: unset CUDA_LAUNCH_BLOCKING TORCH_SHOW_CPP_STACKTRACES; NCCL_DEBUG=WARN
torch.autograd.set_detect_anomaly(False)   # and drop `with torch.autograd.detect_anomaly():`
torch.use_deterministic_algorithms(False)  # keep it only where bit-exact reruns are required
torch.backends.cudnn.deterministic = False
```
`gpuadvise doctor` lists the variables set on a machine before a run starts.

## Thresholds
Fires on any of the settings recorded on, and without run.json when the trace itself shows blocking
launches (at least 90 % of at least 20 launches in the steps return after their kernel ends) or anomaly
detection's NaN checks (after at least half of the backward functions). Predictions, when the trace allows
one: blocking launches, by a replay that runs them as the synchronous calls they were and then lets them
return at once (how much CPU work can then overlap the GPU depends on where it sits in the step); anomaly
detection, by a replay without the NaN checks and their syncs (CPU-only
traces: their time in the median step over the median step), a lower bound since the traceback recording in forward is not in
the trace. Determinism and the environment variables: not predicted (the trace shows no alternative to
compare with). Severity follows the prediction, and is at least medium for anomaly detection (its
prediction is a lower bound) and for the variables `doctor` rates bad; a blocking-launch variable in a run
that launched no kernels costs nothing there and alone gives low. The evidence's wait per step
counts each blocked launch's CPU time beyond 5 µs (what a non-blocking launch costs).
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import intervals as iv, perstep
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence, severity_for
from gpuadvise.analyzer.measure.basics.spans import ops_inside
from gpuadvise.analyzer.model.calls import LAUNCH_CALLS
from gpuadvise.analyzer.model.trace import name_mask, names_in
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.doctor import probe
from gpuadvise.fixtures.builder import GEMM, TraceBuilder
from gpuadvise.fixtures.runjson import run_json

from .base import Rule

BACKWARD = "autograd::engine::evaluate_function:"
NAN_CHECK_OPS = {"aten::isnan", "aten::ne", "aten::_is_any_true", "aten::any", "aten::item", "aten::_local_scalar_dense"}
BLOCKING_ENV = ("CUDA_LAUNCH_BLOCKING", "HIP_LAUNCH_BLOCKING", "AMD_SERIALIZE_KERNEL")


class DebugSettings(Rule):
    code = "GA140"
    name = "debug-settings"
    title = "Debug settings were on in the profiled run"
    thresholds = {"blocking_launch_share": 0.9, "min_launches": 20, "nan_check_share": 0.5, "launch_cost_us": 5.0}

    def check(self, a: Analysis):
        env = runfacts.env_vars(a.facts)
        slow = probe.slow_env(env)
        items, parts, predicted, bad_unpredicted = [], [], [], False

        blocked = self._blocking_launches(a)
        env_blocking = [e for e in slow if e["name"] in BLOCKING_ENV]
        if env_blocking or blocked["blocking"]:
            what = ", ".join(f"{e['name']}={e['value']}" for e in env_blocking) or "blocking kernel launches"
            if blocked["launches"] and not blocked["blocked"]:
                parts.append(f"{what} was set, but none of the {blocked['launches']} kernel launches in the steps waited "
                             "for its kernel (set after CUDA had started?): no cost in this run.")
            elif blocked["launches"]:
                parts.append(f"{what}: {blocked['blocked']} of {blocked['launches']} kernel launches in the steps returned "
                             f"only after their kernel finished; the CPU waited {perstep.a_median(a.metrics)}"
                             f"{blocked['wait_ms_per_step']:.2f} ms "
                             "per step inside them.")
                predicted.append((blocked["saving"], blocked["basis"]))
            else:
                parts.append(f"{what} was set, but this run launched {blocked['launches']} GPU kernels in its steps, so it "
                             "cost nothing here; on a GPU every launch would wait for its kernel.")
            items.append({"name": what, "verdict": "bad", "blocked_launches": blocked["blocked"],
                          "launches": blocked["launches"], "est_step_saving_pct": blocked["saving"]})

        anomaly = runfacts.flag(a.facts, "anomaly_detection")
        checks = self._nan_checks(a)
        if anomaly or checks["seen"]:
            source = "recorded on in run.json" if anomaly else "seen in the trace"
            if checks["checks"]:
                parts.append(f"Autograd anomaly detection ({source}): {checks['checks']} NaN checks after "
                             f"{checks['backward_functions']} backward functions, {perstep.a_median(a.metrics)}"
                             f"{checks['ms_per_step']:.2f} ms per step"
                             + (f" with {checks['syncs']} device syncs." if checks["syncs"] else "."))
                predicted.append((checks["saving"], checks["basis"]))
            else:
                parts.append(f"Autograd anomaly detection was on ({source}); the profiled steps ran "
                             f"{checks['backward_functions']} backward functions, so only its forward cost (a traceback "
                             "per autograd node) applied.")
            bad_unpredicted = True  # its forward cost is never in the prediction
            items.append({"name": "autograd anomaly detection", "verdict": "bad", "nan_checks": checks["checks"],
                          "est_step_saving_pct": checks["saving"]})

        det = runfacts.flag(a.facts, "deterministic_algorithms")
        cudnn_det = runfacts.flag(a.facts, "cudnn_deterministic")
        if det or cudnn_det:
            names = [n for n, on in (("torch.use_deterministic_algorithms(True)", det),
                                     ("torch.backends.cudnn.deterministic = True", cudnn_det)) if on]
            parts.append(f"{' and '.join(names)}: deterministic kernels where {len(names)} setting(s) demand them; how much "
                         "faster the non-deterministic ones would be is not in the trace.")
            items.append({"name": " + ".join(names), "verdict": "warn", "est_step_saving_pct": None})

        for e in slow:
            if e["name"] in BLOCKING_ENV:
                continue
            parts.append(f"{e['name']}={e['value']}: {e['why']}.")
            items.append({"name": f"{e['name']}={e['value']}", "verdict": e["verdict"], "est_step_saving_pct": None})
            bad_unpredicted = bad_unpredicted or e["verdict"] == "bad"

        if not items:
            return []
        best = max(predicted, key=lambda p: p[0], default=(0.0, ""))
        saving = best[0]
        basis = best[1] or ("not predicted: the trace has no run without these settings to compare with, and no "
                            "blocking launches or NaN checks to remove")
        if len(predicted) > 1:
            basis += " (the largest of the predictions for each setting; they do not add up)"
        severity = severity_for(saving)
        if severity == "low" and bad_unpredicted:
            severity = "medium"
        message = "Debugging switches were on in the profiled run. " + " ".join(parts)
        evidence = Evidence(steps=[s.number for s in a.metrics.steps], items=items,
                            numbers={"blocking_launches": {k: v for k, v in blocked.items() if k != "basis"},
                                     "nan_checks": {k: v for k, v in checks.items() if k != "basis"},
                                     "settings_read_at": runfacts.settings_read_at(a.facts),
                                     "statistic": "median step"})
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, severity=severity,
                             advice="Run without these switches unless you are debugging.")]

    # -- what the trace shows ------------------------------------------------------------------------
    def _blocking_launches(self, a: Analysis) -> dict:
        m, t = a.metrics, self.thresholds
        out = {"launches": 0, "blocked": 0, "blocking": False, "wait_ms_per_step": 0.0, "saving": 0.0, "basis": ""}
        la = m.launches
        if la.empty:
            return out
        la = la[names_in(la["call"], LAUNCH_CALLS)]
        if m.steps:
            starts, ends = np.array([s.start for s in m.steps]), np.array([s.end for s in m.steps])
            k = np.searchsorted(starts, la["launch_ts"].to_numpy(), side="right") - 1
            inside = (k >= 0) & (la["launch_ts"].to_numpy() < ends[np.clip(k, 0, None)])
            la = la[inside]
        if la.empty:
            return out
        blocked = (la["launch_end"] >= la["gpu_ts"] + la["gpu_us"] - 1.0).to_numpy()
        out.update(launches=int(len(la)), blocked=int(blocked.sum()))
        out["blocking"] = bool(len(la) >= t["min_launches"] and blocked.mean() >= t["blocking_launch_share"])
        if not blocked.any():
            return out
        wait = np.maximum(la["cpu_us"].to_numpy() - t["launch_cost_us"], 0.0) * blocked
        out["wait_ms_per_step"] = round(perstep.median(perstep.issued(m, la["launch_ts"], wait)) / 1e3, 3)  # the report's statistic
        if out["blocking"]:
            # the replay runs these launches as the synchronous calls they were, then lets them go
            saving, basis = a.predicted_saving(Scenario("kernel launches no longer wait for their kernels",
                                                        unblock=lambda calls: calls["name"].isin(LAUNCH_CALLS).to_numpy()))
            if saving is not None:
                out["saving"], out["basis"] = round(float(saving), 1), basis
        return out

    def _nan_checks(self, a: Analysis) -> dict:
        model, m, t = a.model, a.metrics, self.thresholds
        out = {"backward_functions": 0, "checks": 0, "syncs": 0, "seen": False, "ms_per_step": 0.0, "saving": 0.0,
               "basis": ""}
        cpu = model.cpu
        if cpu.empty:
            return out
        spans = cpu[name_mask(cpu["name"], lambda n: n.startswith(BACKWARD))]
        if spans.empty:
            return out
        ops = ops_inside(model, spans, NAN_CHECK_OPS)
        isnan = int((ops["name"] == "aten::isnan").sum()) if len(ops) else 0
        out.update(backward_functions=int(len(spans)), checks=isnan)
        out["seen"] = bool(isnan >= t["nan_check_share"] * len(spans))
        if not isnan:
            return out
        lo, hi = iv.union(ops["ts"].to_numpy(), ops["end"].to_numpy())
        rt = model.runtime
        syncs = rt[names_in(rt["name"], {"cudaStreamSynchronize", "hipStreamSynchronize", "cudaMemcpyAsync", "hipMemcpyAsync"})]
        in_checks = iv.covered(lo, hi, syncs["ts"].to_numpy(), syncs["end"].to_numpy()) > 0 if len(syncs) else np.zeros(0, bool)
        out["syncs"] = int(in_checks.sum())
        ps = m.per_step
        step_lo, step_hi = ps["start_us"].to_numpy(), ps["start_us"].to_numpy() + ps["dur_us"].to_numpy()
        per_step = iv.covered(lo, hi, step_lo, step_hi)
        out["ms_per_step"] = round(perstep.median(per_step) / 1e3, 3)  # the report's statistic

        def unblock(calls):
            return iv.covered(lo, hi, calls["ts"].to_numpy(), calls["end"].to_numpy()) > 0

        saving, basis = a.predicted_saving(Scenario("anomaly detection off: no NaN checks after backward functions",
                                                    cpu_removed=(lo, hi), unblock=unblock))
        if saving is None:  # a CPU-only trace: the steps are CPU time, and the checks are part of it
            saving = 100.0 * perstep.median(per_step) / max(m.median_step_us, 1e-9)
            basis = "CPU-only trace: the NaN checks' share of the median step"
        out["saving"] = round(float(saving), 1)
        out["basis"] = basis + "; a lower bound: anomaly mode's traceback recording in forward is not in the trace"
        return out

    # -- fixtures -------------------------------------------------------------------------------------
    def positive(self) -> TraceBuilder:
        b = _loop(blocking=True)
        b.facts = run_json(env={"CUDA_LAUNCH_BLOCKING": "1"})
        return b

    def negative(self) -> TraceBuilder:
        # the same loop with the switches present but off: CUDA_LAUNCH_BLOCKING=0, NCCL_DEBUG at WARN
        b = _loop(blocking=False)
        b.facts = run_json(env={"CUDA_LAUNCH_BLOCKING": "0", "NCCL_DEBUG": "WARN"})
        return b


def _loop(blocking: bool) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.idle(100)  # Python and framework work before each layer's launch
                with b.op("aten::linear"):
                    b.kernel(GEMM, 200, blocking=blocking)
            b.sync()
    b.finish()
    return b


RULE = DebugSettings()

"""allocator-churn: GPU memory is given back to CUDA and asked for again, step after step.

## What it detects
The caching allocator normally takes memory from CUDA once (cudaMalloc) and reuses it for the rest of
the run. It gives memory back (cudaFree) only on `torch.cuda.empty_cache()`, after a cudaMalloc that
failed (it frees its whole cache and retries), under `garbage_collection_threshold`, or for every
tensor when caching is off (`PYTORCH_NO_CUDA_MEMORY_CACHING=1`). This rule finds that happening in
the loop:
- in a trace: cudaFree/hipFree runtime calls inside the training iterations (ProfilerSteps, or the
  spans between `Optimizer.step` annotations when the profiler was not stepped);
- in an allocator snapshot's history: segments released (`segment_free`/`segment_unmap`) and then
  allocated again, more than once.

## Why it matters
cudaFree synchronizes the whole device and cudaMalloc is a slow driver call, which after a release
waits for the device too (a device memory allocation is an implicit synchronization): the CPU stops
launching work while they run, and the memory handed back is requested again a moment later. A one-off
`empty_cache()` between phases is harmless; one per step costs every step.

## Fix
Take `empty_cache()` out of the loop, and leave the caching allocator on:
```python
for batch in loader:
    loss = model(batch.cuda(non_blocking=True)).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    # torch.cuda.empty_cache()  # remove: the next step would cudaMalloc the same memory again
```
Unset `PYTORCH_NO_CUDA_MEMORY_CACHING` (a debugging switch). If the frees are out-of-memory retries
(`memory_stats()["num_alloc_retries"]` grows), lower the peak instead: see memory-pressure, and try
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

## Thresholds
- Trace: free calls inside at least 2 iterations and at least half of them. The allocator never
  frees in a steady loop unless told to, so a free recurring across iterations is the pattern, while
  a single one (a one-off `empty_cache()`, the CUDA context's `cudaFree(0)` at start-up) is not.
  Without ProfilerSteps or `Optimizer.step` annotations the iterations are unknown and the rule stays
  silent: start-up allocations would look the same.
- Snapshot history: at least 2 release-then-reallocate cycles (a one-off `empty_cache()` between
  benchmark phases makes one).
The trace saving is a range. Its low end is the critical-path replay of the steps without the
allocator calls (on every thread) at the CPU speed the trace shows, calibrated to run.json's unprofiled
step when there is one. The replay runs with allocator syncs (`Scenario.alloc_syncs`, for the baseline,
its calibration and the fix alike, and for no other rule): cudaFree, and every cudaMalloc after a release
(a device memory allocation is an implicit synchronization; after empty_cache() each cudaMalloc maps new
memory), waits for all GPU work launched before it and then does its driver work. Under the profiler the
slowed CPU reaches every call after the GPU has drained, so the trace shows those waits as free; they
bind once the CPU is faster. Counting the mallocs' waits moves the H100 emptycache pair from 33.5 % to
35.7 % (measured 43.0 %), and lets the calibration of fixtures.mechanisms.allocator_churn_many_blocks
find the planted 5 µs per event (5.3 µs; 1.1 µs with cudaMalloc as CPU time). The profiler slows the
Python and launch work around the calls but not the driver time inside them, so without it the calls
are a larger share of a shorter step, and the device syncs, which cannot bind while the profiled CPU
trails the GPU, make the CPU wait. The high end is the same replay with that CPU work 2.4× faster (the
largest slowdown `gpuadvise profile`'s default capture caused on the H100 pairs' loops; the calls keep
their time) and is the headline: an `empty_cache()` per step costs more than the time inside its calls
(H100: 5.2 ms of calls, 8.1 ms measured). The factor stays fixed even with run.json's step time: the
calibrated replay (the low end then) gives 28.5 % on the H100 emptycache pair against 43.0 % measured.
Its calibration fits 3.0 µs per recorded event where the same loop without empty_cache() (emptycache-
after) fits 4.9 µs, and at 4.9 µs the replay gives 43.4 %: the unprofiled step holds ~1.8 ms of churn
cost the replay does not model yet, which the calibration takes as less profiler overhead. From a snapshot
alone the calls cannot be timed (0).
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.memory import allocator_calls, iterations
from gpuadvise.analyzer.model.calls import ALLOC_CALLS, FREE_CALLS
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

GiB = 2**30
GEMM = "ampere_tf32_s1688gemm_64x64_nn"


class AllocatorChurn(Rule):
    code = "GA121"
    name = "allocator-churn"
    title = "GPU memory is freed and re-allocated in the loop"
    requires = ("memory",)
    # the most `gpuadvise profile`'s capture (shapes + memory history) slowed a loop's CPU side on the H100
    # pairs (h100/README.md: 2.0–2.4×); kept with run.json step times too: the calibrated replay falls short
    # on the emptycache pair (docstring, Thresholds)
    thresholds = {"min_iterations_with_frees": 2, "min_share_of_iterations": 0.5, "min_release_cycles": 2,
                  "max_profiler_cpu_slowdown": 2.4}

    def check(self, a: Analysis):
        out = []
        if a.has("trace"):
            out += self._from_trace(a)
        if not out:
            out += self._from_history(a)
        return out

    def _from_trace(self, a: Analysis):
        tm, t = a.memory.trace, self.thresholds
        if tm is None or not tm.iterations:
            return []
        if tm.iterations_with_frees < max(t["min_iterations_with_frees"], t["min_share_of_iterations"] * tm.iterations):
            return []
        windows, kind = iterations(a.model, a.metrics)
        calls = allocator_calls(a.model, windows)
        calls = calls[calls["window"] >= 0]
        m = a.metrics
        # iteration time on the GPU timeline when the iterations are ProfilerSteps
        step_us = float(m.per_step["dur_us"].sum()) if kind == "ProfilerStep" else sum(e - s for s, e in windows)
        share = 100.0 * tm.allocator_ms_in_iterations * 1e3 / step_us if step_us else 0.0
        # every thread's calls: the autograd thread allocates too, and cudaFree syncs the whole device
        saving, basis = a.predicted_saving(Scenario(
            "cudaMalloc/cudaFree calls removed, and with them their device-wide syncs",
            remove=lambda c: c["name"].isin(ALLOC_CALLS + FREE_CALLS).to_numpy(), alloc_syncs=True))
        span = None
        if saving is None:
            saving, basis = share, "share of iteration time spent in the allocator calls (no GPU timeline to replay)"
        else:
            saving, basis, span = self._range(a, saving, basis, tm.allocator_ms_in_iterations * 1e3 / tm.iterations)
        names = calls["name"].astype(str)
        free_name = next((n for n in FREE_CALLS if (names == n).any()), "cudaFree")
        per_iter = calls.groupby("window").agg(frees=("name", lambda s: int(s.isin(FREE_CALLS).sum())),
                                               calls=("name", "size"), total_ms=("dur", lambda d: round(d.sum() / 1e3, 3)))
        worst = calls.nlargest(5, "dur")
        what = "ProfilerSteps" if kind == "ProfilerStep" else "iterations (between `Optimizer.step` calls)"
        message = (f"{free_name} ran inside {tm.iterations_with_frees} of {tm.iterations} {what}: "
                   f"{tm.frees_in_iterations} frees and {tm.mallocs_in_iterations} mallocs, covering "
                   f"{tm.allocator_ms_in_iterations:.1f} ms, {share:.1f} % of the iteration time. The caching allocator "
                   "frees GPU memory only on empty_cache(), after a failed cudaMalloc, or when caching is disabled.")
        label = ((lambda w: f"ProfilerStep#{a.metrics.steps[w].number}") if kind == "ProfilerStep"
                 else (lambda w: f"iteration {w + 1}"))
        items = [{"name": label(int(w)), "frees": int(r.frees), "calls": int(r.calls), "total_ms": float(r.total_ms)}
                 for w, r in per_iter.head(10).iterrows()]
        evidence = Evidence(
            steps=[s.number for s in a.metrics.steps],
            time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in zip(worst["ts"], worst["end"])],
            items=items,
            numbers={"iterations": tm.iterations, "iteration_kind": kind, "iterations_with_frees": tm.iterations_with_frees,
                     "frees_in_iterations": tm.frees_in_iterations, "mallocs_in_iterations": tm.mallocs_in_iterations,
                     "allocator_ms_in_iterations": tm.allocator_ms_in_iterations, "share_of_iteration_time_pct": round(share, 1)})
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=self._advice(a),
                             range_pct=span)]

    def _range(self, a: Analysis, replayed: float, basis: str, calls_us: float):
        """(headline, basis, range). The replay runs at the traced CPU speed, or the calibrated one with
        run.json's step time (which can take part of the calls' cost for profiler overhead). The allocator calls are driver
        time, which the profiler barely slows, while it slows the Python and launch work around them: without
        it the step is shorter, the calls a larger share of it, and their device syncs (which cannot bind
        while the profiled CPU is slower than the GPU) start to cost. The high end replays the steps with
        that CPU work as fast as the profiler's largest measured slowdown allows, the calls left as they are."""
        replay = a.replay
        f = self.thresholds["max_profiler_cpu_slowdown"]
        alloc = lambda c: c["name"].isin(ALLOC_CALLS + FREE_CALLS).to_numpy()  # noqa: E731
        before = replay.simulate(Scenario("unprofiled CPU", cpu_scale=1 / f, unscaled=alloc, alloc_syncs=True))
        after = replay.simulate(Scenario("unprofiled CPU, no allocator calls", cpu_scale=1 / f, remove=alloc,
                                         alloc_syncs=True))
        high = max(0.0, 100.0 * (1 - after / before)) if before > 0 else 0.0
        if high <= replayed:
            return replayed, basis, None
        cal = a.calibration
        calibrated = cal is not None and cal.applied and cal.source == "run.json"  # fitted to this run's step
        typical = cal is not None and cal.applied and cal.source == "typical"
        speed = ("on the calibrated replay" if calibrated else "with the typical profiler cost taken off" if typical
                 else "at the traced CPU speed")
        # the calibration fits one unprofiled step time, so churn cost the replay does not model reads to it as
        # less profiler overhead (module docstring): the calibrated figure is the low end, not the estimate
        unknown = ("The calibration to the unprofiled step can take part of the calls' cost for profiler "
                   "overhead, so the calibrated figure is a lower bound" if calibrated else
                   "The trace cannot tell how far the profiler slowed this loop")
        basis += (f" gives {replayed:.1f} % {speed}. The calls are {calls_us / 1e3:.1f} ms of driver "
                  f"time per step, which the profiler hardly slows, while it slows the Python and launch work around "
                  f"them (up to {f:g}× with `gpuadvise profile`'s default capture on the H100 pairs' loops): without it the calls "
                  f"are a larger share of a shorter step, and the calls' device syncs make the CPU wait for the GPU. "
                  f"Replayed with that CPU work {f:g}× faster: {high:.1f} %, the headline, as an empty_cache() per "
                  f"step costs more than the time inside the calls. {unknown}: {replayed:.1f}–{high:.1f} %")
        return high, basis, (replayed, high)

    def _from_history(self, a: Analysis):
        h = a.memory.history
        if h is None or h.release_cycles < self.thresholds["min_release_cycles"]:
            return []
        freed = sum(r["bytes"] for r in h.releases)
        unit = "s" if h.timed else "entry"
        message = (f"The allocator released segments and allocated them again {h.release_cycles} times in the recorded "
                   f"history: {h.segment_frees} segment frees and {h.segment_allocs} segment allocations, "
                   f"{h.reallocated_bytes / GiB:.2f} GiB re-allocated after the first release. Each release is a cudaFree "
                   "(it synchronizes the device), each re-allocation a cudaMalloc.")
        evidence = Evidence(
            items=[{"name": f"release at {r['at']} {unit}", "segments": r["segments"], "gib": round(r["bytes"] / GiB, 2)}
                   for r in h.releases],
            numbers={"release_cycles": h.release_cycles, "segment_frees": h.segment_frees, "segment_allocs": h.segment_allocs,
                     "reallocated_gib": round(h.reallocated_bytes / GiB, 2), "released_gib_listed": round(freed / GiB, 2)})
        return [self.finding(message=message, evidence=evidence, saving=0.0, advice=self._advice(a),
                             basis="a snapshot has no timeline of CPU work: the cost of each cudaMalloc/cudaFree cannot be "
                                   "measured here; profile the steps to time it")]

    @staticmethod
    def _advice(a: Analysis) -> str:
        c = a.memory.counters
        if c is not None and c.num_alloc_retries:
            return (f"memory_stats() counts {c.num_alloc_retries} cudaMalloc retries: the frees are out-of-memory "
                    "retries. Lower the peak (see memory-pressure).")
        return ("Look for `torch.cuda.empty_cache()` (or `gc.collect()` + `empty_cache()`) inside the loop and remove it, "
                "and check that `PYTORCH_NO_CUDA_MEMORY_CACHING` is not set.")

    def positive(self) -> TraceBuilder:
        # empty_cache() at the end of every step: the next step cudaMallocs its activations again
        b = TraceBuilder()
        for _ in range(4):
            with b.step():
                b.cpu("cudaMalloc", 300, cat="cuda_runtime")
                for _ in range(20):
                    b.kernel(GEMM, 200)
                b.sync()
                b.cpu("cudaFree", 800, cat="cuda_runtime")
        b.finish()
        return b

    def negative(self) -> TraceBuilder:
        # the cache grows in the first step and is reused after; one cudaFree outside the loop
        b = TraceBuilder()
        b.cpu("cudaFree", 5_000, cat="cuda_runtime")  # CUDA context start-up (cudaFree(0))
        for i in range(4):
            with b.step():
                if i == 0:
                    b.cpu("cudaMalloc", 300, cat="cuda_runtime")
                for _ in range(20):
                    b.kernel(GEMM, 200)
                b.sync()
        b.finish()
        return b


RULE = AllocatorChurn()

"""Per-step wall times of the profiled run, in and out of the profiler's window.

A step n runs from step boundary n to boundary n+1 (boundaries: optimizer steps, DataLoader batches,
`gpuadvise.step()`, or a fallback source), so step n is `ProfilerStep#n` in the trace. At each
boundary the session calls `end()` first thing and `begin()` last thing: its own work in between
(profiler transitions, trace export, run.json writes) is in no step.

On the CPU a step's time is `time.perf_counter_ns()` from begin to end. Where the script runs on a
GPU (CUDA initialised by the script itself, so timing never initialises CUDA for a CPU script) a
CUDA event is also recorded at each begin and end on the current stream, and the step's GPU time is
the elapsed time between them: what the GPU took for that step, with no synchronize in the loop.
Events are resolved lazily (`query()` says they are done) and, at the end of the run, waited for.

Memory stays bounded on long runs: the first `keep_head` steps and the last `keep_tail` are kept (the
whole run's times go to the step record, record.py, through `on_final`: each step once its time is
final, in step order).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

# Phases: what the profiling session was doing during a step.
UNPROFILED = ("wait", "after", "off")  # nothing of the profiler recording
PROFILED = ("active",)
MAX_PENDING = 512  # the steps in the trace
# the others ("warmup": profiler armed, CUDA tracer on; "shapes": the one-step shape probe;
# "memory": CUDA memory history on) are neither: they are excluded from both medians.


class StepTimes:
    def __init__(self, torch=None, keep_head: int = 200, keep_tail: int = 50, settle: int = 2, on_final=None):
        self.torch = torch
        self.keep_head, self.settle = keep_head, settle
        self.head: list[list] = []  # [number, phase, source, start_ns, end_ns, start_ev, end_ev, gpu_ms]
        self.tail: deque = deque(maxlen=keep_tail)
        self.on_final = on_final  # fn(number, phase, cpu_ms, gpu_ms), once per step, in step order
        self._unreported: deque = deque()  # ended steps not yet handed to on_final
        self.count = 0
        self.open: list | None = None
        self.error: str | None = None
        self.used_cuda = False
        self._pending: deque = deque()  # steps whose CUDA events are not resolved yet
        self._cuda = bool(torch is not None and _cuda_available(torch))

    # -- at a boundary ---------------------------------------------------------------------------
    def end(self) -> None:
        """The open step ends now (called first thing at a boundary)."""
        if self.open is None or self.error:
            return
        step, self.open = self.open, None
        try:
            step[4] = time.perf_counter_ns()
            if step[5] is not None:
                step[6] = self._record()
                if step[6] is None:
                    step[5] = None
                else:
                    self.used_cuda = True  # a step with both events: the GPU clock applies
                    self._pending.append(step)
                    if len(self._pending) > MAX_PENDING:  # the GPU is far behind (or hung): stop waiting on the oldest
                        old = self._pending.popleft()
                        old[5] = old[6] = None
            self.count += 1
            (self.head if len(self.head) < self.keep_head else self.tail).append(step)
            if self.on_final is not None:
                self._unreported.append(step)
            self._resolve(wait=False)
            self._report()
        except Exception as exc:  # timing must never reach the user's loop
            self._disable(exc)

    def _report(self) -> None:
        """Hand the steps whose time is final (no CUDA event pending) to on_final, oldest first."""
        while self._unreported and self._unreported[0][6] is None:
            s = self._unreported.popleft()
            self.on_final(s[0], s[1], (s[4] - s[3]) / 1e6, s[7])

    def begin(self, number: int, phase: str, source: str | None) -> None:
        """Step `number` starts now (called last thing at a boundary)."""
        if self.error:
            return
        try:
            self.open = [number, phase, source, None, None, self._record(), None, None]
            self.open[3] = time.perf_counter_ns()
        except Exception as exc:
            self._disable(exc)

    # -- CUDA events ---------------------------------------------------------------------------
    def _record(self):
        """A timing event on the current stream, or None: no GPU, CUDA not initialised by the
        script, or the stream is being captured into a CUDA graph (an event would break the capture)."""
        if not self._cuda:
            return None
        cuda = self.torch.cuda
        if not cuda.is_initialized() or cuda.is_current_stream_capturing():
            return None
        ev = cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _resolve(self, wait: bool) -> None:
        while self._pending:
            step = self._pending[0]
            try:
                if not wait and not step[6].query():
                    return
                if wait:
                    step[6].synchronize()
                step[7] = step[5].elapsed_time(step[6])
            except Exception:  # this step's events are unusable (another device, say): no GPU time for it
                step[7] = None
            step[5] = step[6] = None  # the events can go
            self._pending.popleft()

    def close(self, wait_for_gpu: bool) -> None:
        """At the end of the run: drop the unfinished step, resolve the events still pending (waiting
        for the GPU only when the script ended normally: never block an interrupted process)."""
        self.open = None
        if self.error:
            return
        try:
            self._resolve(wait=wait_for_gpu)
            for s in self._unreported:  # still pending (an interrupted run): their GPU time is not known
                s[5] = s[6] = None
            if self.on_final is not None:
                self._report()
        except Exception as exc:
            self._disable(exc)

    def _disable(self, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        self.open = None
        self._pending.clear()

    # -- the record --------------------------------------------------------------------------------
    def steps(self) -> list[list]:
        return self.head + list(self.tail)

    def summary(self, first: int | None = None, last: int | None = None, median_upto: int | None = None) -> dict:
        """run.json's `steps` (the keys are documented in runfolder/layout.py): of every kept step, or of the
        kept steps numbered `first` … `last` (a later window and the unprofiled steps around it). The
        unprofiled median counts the steps up to `median_upto` only: the level the window ran at, not
        where a long run drifted to later."""
        try:
            self._resolve(wait=False)
            if self.on_final is not None:
                self._report()
        except Exception as exc:
            self._disable(exc)
        steps = self.steps()
        kept = "all" if not self.tail or self.count == len(steps) else \
            f"first {len(self.head)} and last {len(self.tail)} of {self.count}"
        if first is not None or last is not None:
            lo, hi = first if first is not None else 0, last if last is not None else float("inf")
            steps = [s for s in steps if lo <= s[0] <= hi]
            kept = f"steps {steps[0][0]}–{steps[-1][0]}" if steps else "none"
        clock = "cuda_event" if self.used_cuda else "cpu"
        cpu_ms = [round((s[4] - s[3]) / 1e6, 3) for s in steps]
        gpu_ms = [None if s[7] is None else round(s[7], 3) for s in steps]
        ms = gpu_ms if clock == "cuda_event" else cpu_ms
        out = {
            "clock": clock,
            "count": self.count,
            "kept": kept,
            "settle": self.settle,
            "number": [s[0] for s in steps],
            "phase": [s[1] for s in steps],
            "step_sources": [s[2] for s in steps],
            "ms": ms,
            "cpu_ms": cpu_ms,
        }
        if clock == "cuda_event":
            out["gpu_ms"] = gpu_ms
        # the first step after a window follows the trace export (cold caches, freed buffers): skipped too
        phase_of = {s[0]: s[1] for s in steps}
        skip = {s[0] for s in steps if s[1] == "after" and phase_of.get(s[0] - 1, "after") not in UNPROFILED}
        upto = median_upto if median_upto is not None else float("inf")
        unprof = [m for s, m in zip(steps, ms)
                  if s[1] in UNPROFILED and self.settle < s[0] <= upto and s[0] not in skip and m is not None]
        prof = [m for s, m in zip(steps, ms) if s[1] in PROFILED and m is not None]
        u = round(statistics.median(unprof), 3) if unprof else None
        p = round(statistics.median(prof), 3) if prof else None
        out.update(unprofiled_median_ms=u, unprofiled_n=len(unprof), profiled_median_ms=p, profiled_n=len(prof),
                   overhead_x=round(p / u, 3) if u and p else None)
        if self.error:
            out["error"] = self.error
        return out


def _cuda_available(torch) -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False

"""The profiling session inside the user's process: steps torch.profiler, times every step, writes the
run folder.

The parts live in their own modules:
- steps/sources.py: where step boundaries come from (gpuadvise.step(), optimizer hook, DataLoader,
  backward/CUDA-graph fallbacks);
- windows/window.py: the schedule (wait, warm-up, record), the profiler, the shape probe, and `WindowHooks`,
  the callbacks at the edges of the recorded steps;
- runfolder/writers.py: the run folder's files (trace, memory snapshot, run.json);
- steps/record.py: every step's time and memory samples for the whole run, in a sidecar file;
- steps/telemetry.py: the GPU's own readings (NVML: clocks, power, temperature, throttle reasons) about once
  a second in a daemon thread, in `telemetry.jsonl` beside it;
- windows/later.py (with plan.py, triggers.py, requests.py, slowwatch.py there): the windows after the first
  (`--on-signal`, `--when-slower`, `--every`), recorded by the same profiler.
This module is what happens at each boundary, and the session's start and end.

Every boundary is timed (steps/times.py), also outside the profiler's window, so run.json can tell the
unprofiled step time from the profiled one. On a GPU, CUDA memory history runs for `memory_steps`
steps after the window and is dumped (it is not on during the recorded steps: it slows them); further
steps are timed as unprofiled, until the script ends.

Any failure in here is recorded and profiling (or timing) is switched off; the exception never
reaches the user's code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from pathlib import Path

from .. import loaderprobe
from ..active import active, set_active  # noqa: F401 - where gpuadvise.step() and the bootstrap find them
from ..facts import compiled  # torch.compile recording
from ..facts import distributed as distfacts
from ..facts import general
from ..frameworks import importwatch
from ..runfolder import jobfolder, layout, writers
from ..steps.record import StepRecord
from ..steps.sources import SOURCES, StepSources
from ..steps.telemetry import Telemetry
from ..steps.times import StepTimes
from ..windows import later, quiet
from ..windows.requests import REQUESTS
from ..windows.window import ShapeProbe, Window, WindowHooks, cuda

# run.json's unprofiled median counts the steps before window 1 and this many after it (and its memory
# history): the level window 1 ran at, which a run that drifts later does not move
AFTER_WINDOW_STEPS = 20

PREFIX = "gpuadvise> "


class StopAfterCapture(SystemExit):
    """Ends the script right after the capture when --stop-after-capture is given."""


class Session:
    def __init__(self, config: dict):
        self.config = config
        self.out = Path(config["out"])
        self.rank = layout.rank()
        self.prof = None
        self.torch = None
        self.steps = 0  # step boundaries seen (= ProfilerStep numbers while the window runs)
        self.done = False  # the trace is written
        self.failed = False
        self.complete = False  # trace written and memory window over: --stop-after-capture may stop
        self.memory_history = False
        self.finishing = False  # set before the final stop: a partial window must not become a trace
        self._next_after_write = 1
        self.record = StepRecord(self.out / layout.steps_name(self.rank))
        self.times = StepTimes(on_final=self._final_step)
        self.memory_steps = 0  # CUDA memory history steps after the window (set at start: GPU only)
        self.window = Window(config)
        self.sources = StepSources(self._boundary)
        self.status: dict = {"state": "not started", "steps_stepped": 0, "step_source": None, "files": {}}
        self.probe = ShapeProbe(self.status, self.window.probe_step)
        # Capture features that must run only while the window records add their callbacks here.
        self.hooks = WindowHooks()
        self.started = time.time()
        self.later: later.LaterWindows | None = None  # windows after the first, when an option asks
        self.telemetry: Telemetry | None = None  # NVML sampled in its own thread, on an NVIDIA GPU with pynvml

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            import torch
        except Exception as exc:
            self._fail("torch could not be imported", exc)
            return
        self.torch = torch
        w = self.window
        self.times = StepTimes(torch, keep_head=w.end + self.config.get("keep_after", 100),
                               keep_tail=max(50, 2 * later.CONTEXT_STEPS + w.w + w.a + 10),
                               on_final=self._final_step)
        self.memory_steps = self.config.get("memory_steps", 2) if self.config["memory_history"] and cuda(torch) else 0
        self._start_long_run()
        if cuda(torch):  # the GPU's clocks, power and temperature over the run; silent without pynvml
            self.telemetry = Telemetry.start(self.out / layout.telemetry_name(self.rank), lambda: self.steps)
        quiet.ignore_profiler_warnings()
        quiet.set_log(self.out / layout.log_name(self.rank), errors_to_stderr=cuda(torch))
        try:
            general.install(torch, in_window=lambda: self.hooks.open and not self.done)  # the first window's steps
            distfacts.install(torch)  # DDP/FSDP/DeepSpeed settings and the job's process group
            compiled.install(torch, lambda: (self.steps, self._phase(self.steps)))  # compile facts
            schedule = self.later.plan.schedule if self.later is not None else None
            self.prof = self.window.profiler(torch, self.config, self._on_trace_ready, schedule=schedule)
            with quiet.quiet_fd2():
                self.prof.start()
        except Exception as exc:
            self._fail("profiler start failed", exc)
        # DataLoader sampling while the window records (window hooks); installed before the
        # step sources' DataLoader hook, so its wait timing leaves our step work out
        loaderprobe.attach(self, torch)
        self.record.watch_worker_starts(torch, lambda: self.steps)  # each epoch's DataLoader workers
        try:  # the step hooks also time an unprofiled run (profiler failed to start)
            self.sources.install(torch)
            importwatch.install()  # a training framework's own steps, once the script imports one
        except Exception as exc:
            self.status["hooks_error"] = repr(exc)
        if not self.failed:
            self.status["state"] = "waiting for steps"
        if self.window.shapes:
            self.status["shapes"] = {"mode": "window"}
        self._write_status()

    def _start_long_run(self) -> None:
        """With --on-signal, --when-slower or --every: the windows after the first. A fresh run starts with a
        fresh step record (and rank 0 with a fresh request file)."""
        for name in [layout.steps_name(self.rank), layout.telemetry_name(self.rank)] + \
                ([REQUESTS] if self.rank in (None, 0) else []):
            with contextlib.suppress(OSError):
                os.unlink(self.out / name)
        if later.wanted(self.config):
            self.later = later.LaterWindows(self)
            self.later.triggers.install()

    def finish(self, exit_code=None) -> None:
        """At the end of the script: record what happened to the capture (the trace is already written)."""
        try:
            self.times.close(wait_for_gpu=exit_code == 0)
            self.record.close()
            if self.telemetry is not None:
                self.telemetry.stop()
            self.probe.end(keep=False, out=self.out)
            self._hooks_stop(self.steps, captured=False)  # still open: the script ended inside a window
            if self.later is not None:
                self.later.close(self.steps)
            if self.prof is not None and self.done:
                self.finishing = True  # a later window still recording is incomplete: never written
                try:
                    with quiet.quiet_fd2():
                        self.prof.stop()  # no window is due any more: just release it
                except Exception:
                    pass
            if self.prof is not None and not self.done and not self.failed:
                self.finishing = True
                w = self.window
                self.status["state"] = (f"incomplete: the script ended after {self.steps} steps; the window needs "
                                        f"{w.end} (wait {w.W} + warmup {w.w} + active {w.a})")
                try:
                    with quiet.quiet_fd2():
                        self.prof.stop()
                except Exception:
                    pass
                self._record_memory_stats()
            elif self.memory_history:  # the script ended inside the memory window: what was recorded is valid
                self._stop_memory_history(dump=True)
            self._write_status(exit_code=exit_code)
        except Exception:  # nothing may escape at exit either
            pass
        finally:
            if self.later is not None:
                self.later.triggers.uninstall()

    def manual_step(self) -> None:
        self.sources.manual()

    # -- one step boundary ------------------------------------------------------------------------------
    def _boundary(self, source: str) -> None:
        self.times.end()
        self.steps += 1
        k = self.steps
        stop = False
        try:
            self.record.tick()
            if self.record.wants_memory(k):
                self.record.memory(k, self.torch)
            self._advance(k, source)
            stop = self.complete and self.config.get("stop_after_capture") and not self.failed
        except Exception as exc:  # pragma: no cover - _advance swallows its own failures
            self.status["step_error"] = repr(exc)
        finally:
            self.times.begin(k, self._phase(k), source)
        if stop:
            raise StopAfterCapture(0)

    def _advance(self, k: int, source: str) -> None:
        self.status["steps_stepped"] = k
        w = self.window
        if self.failed or self.prof is None:
            if k in (1, 2, 4, 8, 16, 32, 64, 128):
                self._write_status()
            return
        if self.probe.running and k == w.probe_step + 1:
            self.probe.end(keep=True, out=self.out)
        if self.later is not None:
            self.later.take_requests(k)
        if not self.done:
            self.status["step_source"] = SOURCES[source]
            if not w.recorded(k):
                self._write_status()  # here it lands in no recorded step; run.json stays true after os._exit
            try:
                with quiet.quiet_fd2() if w.transition(k) else contextlib.nullcontext():
                    self.prof.step()
            except Exception as exc:
                self._fail("profiler step failed", exc)
                return
            if k == w.probe_step:
                self.probe.start(self.torch)
            if k == w.first_recorded and not self.done:
                general.start_of_window(self.torch)  # the flags the recorded steps start with
                self.hooks.start(self, k)
            if self.done and self.memory_steps:
                self._start_memory_history()
            if self.done and not self.memory_steps:
                self.complete = True
            return
        if self.later is not None:
            self.later.step(k)
        if self.memory_history and k >= w.end + self.memory_steps:
            self._stop_memory_history(dump=True)
            self.complete = True
            self._write_status()
            return
        if k - w.end == self._next_after_write:  # a few writes after the window, then one at the end
            self._next_after_write *= 2
            self._write_status()

    def step_phase(self, k: int) -> str:
        """What the profiler does in step k ("wait", "active", "after", …: run.json `steps.phase`)."""
        return self._phase(k)

    def _phase(self, k: int) -> str:
        if self.failed or self.prof is None:
            return "off"
        if self.probe.running:
            return "shapes"
        if not self.done:
            return self.window.phase(k)
        if self.memory_history:
            return "memory"
        return (self.later.phase(k) if self.later is not None else None) or "after"

    def _final_step(self, number: int, phase: str, cpu_ms: float, gpu_ms: float | None) -> None:
        """Each step once its time is final: into the whole-run record, and to the slowdown watch."""
        self.record.add(number, phase, cpu_ms, gpu_ms)
        if self.later is not None:
            ms = gpu_ms if gpu_ms is not None else None if self.times.used_cuda else cpu_ms
            self.later.triggers.observe(number, phase, ms)

    def _hooks_stop(self, k: int, captured: bool) -> None:
        if self.later is not None:
            self.later.hooks_stop(k, captured)
        else:
            self.hooks.stop(self, k, captured)

    # -- window end ---------------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        if self.finishing:  # stopped mid-window at exit: torch still calls us; keep no partial trace
            return
        ending = self.later.ending(prof.step_num) if self.later is not None else None
        if ending is not None:
            self.later.trace_ready(prof, ending)
            return
        general.end_of_window(self.torch)  # the settings the traced steps ran with, not those at exit
        distfacts.end_of_window(self.torch)
        try:
            final = writers.write_trace(prof, self.out, self.rank, self.probe.events, self.window.a, self.status)
            self.status["files"]["trace"] = final.name
            if self.later is not None:
                self.later.first_captured(final.name)
            self._record_memory_stats()
            self.done = True
            self.status["state"] = "captured"
            self.status["captured_at"] = time.time()
            self.hooks.stop(self, self.steps, captured=True)
            self._write_status()
            job = jobfolder.job_env()
            if job is None or job.reports:  # a job's report is the reporting rank's to print
                print(f"{PREFIX}captured {self.window.a} steps → {final}{self.sources.note()}", file=sys.stderr, flush=True)
        except Exception as exc:  # the window is lost, the training is not
            self._fail("writing the trace failed", exc)

    # -- CUDA memory ----------------------------------------------------------------------------------
    def _start_memory_history(self) -> None:
        try:
            self.torch.cuda.memory._record_memory_history(max_entries=self.config["max_entries"], stacks="python")
            self.memory_history = True
        except Exception as exc:
            self.status["memory_history_error"] = repr(exc)
            self.complete = True

    def _record_memory_stats(self) -> None:
        """`torch.cuda.memory_stats()` counters (at the end of the window, or at exit without one)."""
        torch = self.torch
        if torch is None or not cuda(torch):
            return
        try:
            self.status["memory_stats"] = writers.memory_stats(torch)
        except Exception as exc:
            self.status["memory_stats_error"] = repr(exc)

    def _stop_memory_history(self, dump: bool) -> None:
        torch = self.torch
        if torch is None or not self.memory_history:
            return
        self.memory_history = False
        try:
            if dump:
                self.status["files"]["memory_snapshot"] = writers.dump_memory_snapshot(torch, self.out, self.rank)
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as exc:
            self.status["memory_snapshot_error"] = repr(exc)

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed = True
        self.status["state"] = f"failed: {what}"
        self.status["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.status["error_traceback"] = traceback.format_exc(limit=8)
        try:
            if self.prof is not None:
                with quiet.quiet_fd2():
                    self.prof.stop()
        except Exception:
            pass
        try:
            self.probe.end(keep=False, out=self.out)
            self._stop_memory_history(dump=False)
            self._hooks_stop(self.steps, captured=False)
            if self.later is not None:
                self.later.failed(self.steps)
        except Exception:
            pass
        print(f"{PREFIX}profiling stopped ({what}: {self.status['error']}); your script continues unprofiled",
              file=sys.stderr, flush=True)
        try:
            self._write_status()
        except Exception:
            pass

    def _write_status(self, exit_code=None) -> None:
        c = self.config
        capture = dict(self.status, window=self.window.as_dict(),
                       options={k: c.get(k) for k in ("record_shapes", "shapes_probe", "with_stack",
                                                      "profile_memory", "memory_history")},
                       memory_steps=self.memory_steps)
        if importwatch.ERRORS:
            capture["framework_errors"] = list(importwatch.ERRORS)
        capture["files"] = dict(capture.get("files") or {}, step_record=layout.steps_name(self.rank))
        if self.record.error:
            capture["step_record_error"] = self.record.error
        if self.later is not None:
            self.later.describe(capture)
        upto = self.window.end + self.memory_steps + AFTER_WINDOW_STEPS
        writers.write_run_json(self.out, self.rank, c, capture, self.times.summary(median_upto=upto), self.torch,
                               exit_code)


"""The profiling session inside the user's process: steps torch.profiler, times every step, writes the
run folder.

Stepping needs no code change. Step boundaries come from, in order of precedence:
- `gpuadvise.step()`: once called, the only signal;
- a global optimizer-step hook (after every `optimizer.step()`);
- the DataLoader iterator (each batch), until the first optimizer step is seen;
- fallbacks for loops none of those see: CUDA graph replays (`CUDAGraph.replay()`) and autograd
  backward calls (`loss.backward()`). A fallback takes over once it fires twice with no step from
  the sources above ever seen, or, after they were seen, once they have been silent for three of
  their usual steps while the fallback kept firing (a loop that ends in graph replays after a few
  eager warm-up steps). Any of the sources above takes back over when it fires again.

Every boundary is timed (steptimes.py), also outside the profiler's window, so run.json can tell the
unprofiled step time from the profiled one. The window (default: wait 10, warm-up 2, record 3):
- steps 1 … wait−1 are unprofiled, except the last one when the shape probe runs (shapes.py): a
  separate CPU-only profiler with shapes on, for that one step;
- warm-up steps are traced and discarded by torch.profiler, then `active` steps are recorded,
  without shapes, and written (with the probe's matmul shapes merged in) the moment the window ends;
- on a GPU, CUDA memory history then runs for `memory_steps` steps and is dumped (it is not on
  during the recorded steps: it slows them);
- further steps are timed as unprofiled, until the script ends.

Any failure in here is recorded and profiling (or timing) is switched off; the exception never
reaches the user's code.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path

from . import facts as facts_mod
from . import quiet, runfolder, shapes
from .steptimes import StepTimes

PREFIX = "gpuadvise> "

# source key → what run.json's capture.step_source and the messages call it
SOURCES = {
    "manual": "gpuadvise.step()",
    "optimizer": "optimizer.step()",
    "dataloader": "DataLoader batch",
    "cuda_graph": "CUDA graph replay",
    "backward": "backward()",
}
FALLBACKS = ("cuda_graph", "backward")


class StopAfterCapture(SystemExit):
    """Ends the script right after the capture when --stop-after-capture is given."""


class Session:
    def __init__(self, config: dict):
        self.config = config
        self.out = Path(config["out"])
        self.rank = runfolder.rank()
        self.prof = None
        self.torch = None
        self.mode = "auto"  # "auto" (the precedence above) or "manual" (gpuadvise.step() was called)
        self.optimizer_steps = 0
        self.steps = 0  # step boundaries seen (= ProfilerStep numbers while the window runs)
        self.done = False  # the trace is written
        self.failed = False
        self.complete = False  # trace written and memory window over: --stop-after-capture may stop
        self.memory_history = False
        self.finishing = False  # set before the final stop: a partial window must not become a trace
        self.fallback = None  # the fallback source driving the steps, if any
        self._fallback_count = {s: 0 for s in FALLBACKS}
        self._primary_resumed: int | None = None  # when the user's code last resumed after a main-source step
        self._primary_steps_ns: deque = deque(maxlen=16)  # the last steps from the main sources, our work excluded
        self._probe = None
        self._probe_running = False
        self._probe_events: list | None = None
        self._next_after_write = 1
        self.times = StepTimes()
        self.memory_steps = 0  # CUDA memory history steps after the window (set at start: GPU only)
        c = config
        self.W, self.w, self.a = c["wait"], c["warmup"], c["active"]
        self.window_end = self.W + self.w + self.a  # the boundary that ends the last recorded step
        # The probe needs a step of its own before the warm-up, not step 0 (the script's setup), and at
        # least one warm-up step: the window must not start at the boundary where the probe stops. torch
        # crashes (a segfault at the scope's exit) when one profiler stops and another starts inside the
        # same open record_function, and the optimizer hook runs inside `Optimizer.step#…`.
        probe_fits = self.W >= 2 and self.w >= 1
        self.probe_step = self.W - 1 if c.get("shapes_probe") and not c["record_shapes"] and probe_fits else None
        # a window too short for the probe records shapes itself, as before the probe existed
        self.window_shapes = bool(c["record_shapes"] or (c.get("shapes_probe") and not probe_fits))
        self.status: dict = {"state": "not started", "steps_stepped": 0, "step_source": None, "files": {}}
        self.started = time.time()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            import torch
        except Exception as exc:
            self._fail("torch could not be imported", exc)
            return
        self.torch = torch
        self.times = StepTimes(torch, keep_head=self.window_end + self.config.get("keep_after", 100))
        self.memory_steps = self.config.get("memory_steps", 2) if self.config["memory_history"] and _cuda(torch) else 0
        quiet.ignore_profiler_warnings()
        quiet.set_log(self.out / runfolder.log_name(self.rank), errors_to_stderr=_cuda(torch))
        try:
            facts_mod.install(torch)
            self._start_profiler(torch)
        except Exception as exc:
            self._fail("profiler start failed", exc)
        try:  # the step hooks also time an unprofiled run (profiler failed to start)
            self._install_hooks(torch)
        except Exception as exc:
            self.status["hooks_error"] = repr(exc)
        if not self.failed:
            self.status["state"] = "waiting for steps"
        if self.window_shapes:
            self.status["shapes"] = {"mode": "window"}
        self._write_status()

    def _start_profiler(self, torch) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        c = self.config
        activities = [ProfilerActivity.CPU]
        if _cuda(torch):
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(
            activities=activities,
            schedule=schedule(wait=self.W, warmup=self.w, active=self.a, repeat=1),
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.window_shapes,
            with_stack=c["with_stack"],
            profile_memory=c["profile_memory"],
            **_trace_only(torch, c["with_stack"]),
        )
        with quiet.quiet_fd2():
            self.prof.start()

    def _install_hooks(self, torch) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._after_optimizer_step)
        self._hook_dataloader(torch)
        self._hook_fallbacks(torch)

    def finish(self, exit_code=None) -> None:
        """At the end of the script: record what happened to the capture (the trace is already written)."""
        try:
            self.times.close(wait_for_gpu=exit_code == 0)
            self._end_probe(keep=False)
            if self.prof is not None and self.done:
                try:
                    self.prof.stop()  # the schedule has no more windows (repeat=1): just release it
                except Exception:
                    pass
            if self.prof is not None and not self.done and not self.failed:
                self.finishing = True
                self.status["state"] = (f"incomplete: the script ended after {self.steps} steps; the window needs "
                                        f"{self._needed()} (wait {self.W} + warmup {self.w} + active {self.a})")
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

    # -- step sources --------------------------------------------------------------------------------
    def manual_step(self) -> None:
        self.mode = "manual"
        self._boundary("manual")

    def _after_optimizer_step(self, opt, args, kwargs) -> None:
        try:
            facts_mod.record_optimizer(opt)
        except Exception:
            pass
        self.optimizer_steps += 1
        if self.mode == "auto":
            self._primary("optimizer")

    def _hook_dataloader(self, torch) -> None:
        from torch.utils.data import dataloader as dl

        original = dl._BaseDataLoaderIter.__next__
        session = self

        def __next__(it):
            # Without an optimizer (inference, custom update rules) each batch starts a step.
            if session.mode == "auto" and session.optimizer_steps == 0:
                session._primary("dataloader")
            return original(it)

        dl._BaseDataLoaderIter.__next__ = __next__

    def _hook_fallbacks(self, torch) -> None:
        session = self
        original_backward = torch.autograd.backward

        @functools.wraps(original_backward)
        def backward(*args, **kwargs):
            session._fallback_event("backward")
            return original_backward(*args, **kwargs)

        torch.autograd.backward = backward  # Tensor.backward() calls torch.autograd.backward
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        original_replay = getattr(graph_cls, "replay", None)
        if _cuda(torch) and original_replay is not None:
            @functools.wraps(original_replay)
            def replay(graph, *args, **kwargs):
                session._fallback_event("cuda_graph")
                return original_replay(graph, *args, **kwargs)

            graph_cls.replay = replay

    def _primary(self, source: str) -> None:
        now = time.perf_counter_ns()
        if self._primary_resumed is not None:  # the user's own time for that step, our work excluded
            self._primary_steps_ns.append(now - self._primary_resumed)
        self._fallback_count = dict.fromkeys(self._fallback_count, 0)
        self.fallback = None  # a main source that fires again takes back over
        try:
            self._boundary(source)
        finally:  # silence is counted from when the user's code resumes: our work (an export) is none
            self._primary_resumed = time.perf_counter_ns()

    def _fallback_event(self, source: str) -> None:
        if self.mode == "manual":
            return
        try:
            compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", None)
            if compiling is not None and compiling():  # inside a graph torch.compile is tracing: not a step
                return
            if self.fallback is None:
                self._fallback_count[source] += 1
                if not self._fallback_takes_over(source):
                    return
                self.fallback = source
            elif self.fallback != source:
                return
        except Exception:
            return
        self._boundary(source)

    def _fallback_takes_over(self, source: str) -> bool:
        n = self._fallback_count[source]
        if self._primary_resumed is None:  # no optimizer step or batch ever: the fallback is all there is
            return n >= 2
        if n < 3 or not self._primary_steps_ns:
            return False
        usual = statistics.median(self._primary_steps_ns)
        return time.perf_counter_ns() - self._primary_resumed > 3 * usual

    # -- one step boundary ------------------------------------------------------------------------------
    def _boundary(self, source: str) -> None:
        self.times.end()
        self.steps += 1
        k = self.steps
        stop = False
        try:
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
        if self.failed or self.prof is None:
            if k in (1, 2, 4, 8, 16, 32, 64, 128):
                self._write_status()
            return
        if self._probe_running and k == self.probe_step + 1:
            self._end_probe(keep=True)
        if not self.done:
            self.status["step_source"] = SOURCES[source]
            if not self.W + self.w < k <= self.window_end:
                self._write_status()  # here it lands in no recorded step; run.json stays true after os._exit
            try:
                transition = k in (self.W, self.W + self.w, self.window_end)
                with quiet.quiet_fd2() if transition else contextlib.nullcontext():
                    self.prof.step()
            except Exception as exc:
                self._fail("profiler step failed", exc)
                return
            if k == self.probe_step:
                self._start_probe()
            if self.done and self.memory_steps:
                self._start_memory_history()
            if self.done and not self.memory_steps:
                self.complete = True
            return
        if self.memory_history and k >= self.window_end + self.memory_steps:
            self._stop_memory_history(dump=True)
            self.complete = True
            self._write_status()
            return
        if k - self.window_end == self._next_after_write:  # a few writes after the window, then one at the end
            self._next_after_write *= 2
            self._write_status()

    def _phase(self, k: int) -> str:
        if self.failed or self.prof is None:
            return "off"
        if self._probe_running:
            return "shapes"
        if not self.done:
            return "wait" if k < self.W else "warmup" if k < self.W + self.w else "active"
        return "memory" if self.memory_history else "after"

    def _needed(self) -> int:
        return self.window_end

    # -- the shape probe ----------------------------------------------------------------------------------
    def _start_probe(self) -> None:
        try:
            from torch.profiler import ProfilerActivity, profile

            self._probe = profile(activities=[ProfilerActivity.CPU], record_shapes=True, **_trace_only(self.torch))
            with quiet.quiet_fd2():
                self._probe.start()
            self._probe_running = True
        except Exception as exc:
            self._probe = None
            self.status["shapes"] = {"mode": "probe", "state": f"probe failed: {type(exc).__name__}: {exc}"}

    def _end_probe(self, keep: bool) -> None:
        probe, self._probe, self._probe_running = self._probe, None, False
        if probe is None:
            return
        tmp = None
        try:
            with quiet.quiet_fd2():
                probe.stop()
            if keep:
                fd, tmp = tempfile.mkstemp(prefix=".gpuadvise-probe-", suffix=".json", dir=self.out)
                os.close(fd)
                probe.export_chrome_trace(tmp)
                self._probe_events = shapes.probe_events(tmp)
                self.status["shapes"] = {"mode": "probe", "probe_step": self.probe_step,
                                         "state": "probed", "probe_matmuls": len(self._probe_events)}
        except Exception as exc:
            self.status["shapes"] = {"mode": "probe", "state": f"probe failed: {type(exc).__name__}: {exc}"}
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    # -- window end ---------------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        if self.finishing:  # stopped mid-window at exit: torch still calls us; keep no partial trace
            return
        facts_mod.end_of_window(self.torch)  # the settings the traced steps ran with, not those at exit
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            final = self.out / runfolder.trace_name(self.rank)
            tmp_json = self.out / f".{final.name}.json.tmp"
            tmp_gz = self.out / f".{final.name}.tmp"
            prof.export_chrome_trace(str(tmp_json))
            with gzip.open(tmp_gz, "wb", compresslevel=6) as dst:
                self._copy_trace(tmp_json, dst)
            os.replace(tmp_gz, final)
            os.unlink(tmp_json)
            self.status["files"]["trace"] = final.name
            self._record_memory_stats()
            self.done = True
            self.status["state"] = "captured"
            self.status["captured_at"] = time.time()
            self._write_status()
            print(f"{PREFIX}captured {self.a} steps → {final}{self._source_note()}", file=sys.stderr, flush=True)
        except Exception as exc:  # the window is lost, the training is not
            for p in (locals().get("tmp_json"), locals().get("tmp_gz")):
                try:
                    if p is not None and p.exists():
                        p.unlink()
                except OSError:
                    pass
            self._fail("writing the trace failed", exc)

    def _copy_trace(self, src: Path, dst) -> None:
        """Copy the exported trace into the gzip stream, with the probe's matmul shapes merged in."""
        if self._probe_events is not None:
            try:
                with tempfile.TemporaryFile(dir=self.out) as annotated:
                    report = shapes.annotate_copy(src, annotated, self._probe_events, self.a)
                    annotated.seek(0)
                    shutil.copyfileobj(annotated, dst, 1 << 20)
                self.status["shapes"] = dict(self.status.get("shapes") or {}, **report)
                return
            except Exception as exc:  # shapes are a bonus: the plain trace is still written
                self.status["shapes"] = dict(self.status.get("shapes") or {},
                                             state=f"merge failed: {type(exc).__name__}: {exc}")
        with open(src, "rb") as fh:
            shutil.copyfileobj(fh, dst, 1 << 20)

    def _source_note(self) -> str:
        if self.fallback is None:
            return ""
        return (f" (steps marked by {SOURCES[self.fallback]} calls: no optimizer.step() or DataLoader batch "
                "was seen; call gpuadvise.step() once per iteration to mark the steps yourself)")

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
        if torch is None or not _cuda(torch):
            return
        try:
            self.status["memory_stats"] = {k: v for k, v in torch.cuda.memory_stats().items()
                                           if isinstance(v, (int, float)) and not k.startswith(("active.", "inactive_split."))}
        except Exception as exc:
            self.status["memory_stats_error"] = repr(exc)

    def _stop_memory_history(self, dump: bool) -> None:
        torch = self.torch
        if torch is None or not self.memory_history:
            return
        self.memory_history = False
        try:
            if dump:
                final = self.out / runfolder.snapshot_name(self.rank)
                tmp = self.out / f".{final.name}.tmp"
                torch.cuda.memory._dump_snapshot(str(tmp))
                os.replace(tmp, final)
                self.status["files"]["memory_snapshot"] = final.name
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
            self._end_probe(keep=False)
            self._stop_memory_history(dump=False)
        except Exception:
            pass
        print(f"{PREFIX}profiling stopped ({what}: {self.status['error']}); your script continues unprofiled",
              file=sys.stderr, flush=True)
        try:
            self._write_status()
        except Exception:
            pass

    def _write_status(self, exit_code=None) -> None:
        torch = self.torch
        path = self.out / runfolder.run_json_name(self.rank)
        data = runfolder.read_json(path)
        data.update(self.config.get("run", {}))
        data["rank"] = self.rank
        c = self.config
        data["capture"] = dict(self.status, window={"wait": self.W, "warmup": self.w, "active": self.a},
                               options={k: c.get(k) for k in ("record_shapes", "shapes_probe", "with_stack",
                                                              "profile_memory", "memory_history")},
                               memory_steps=self.memory_steps)
        steps = self.times.summary()
        recorded = [s for s, p in zip(steps["step_sources"], steps["phase"]) if p == "active"]
        steps["source"] = (recorded or steps["step_sources"] or [None])[-1]
        data["steps"] = steps
        if torch is not None:
            try:
                data["environment"] = facts_mod.environment(torch)
                data["settings"] = facts_mod.backend_flags(torch)
            except Exception:
                pass
        f = facts_mod.facts()
        data.update({k: [dict((kk, vv) for kk, vv in d.items() if kk != "id") for d in v] for k, v in f.items()})
        if exit_code is not None:
            data["script_exit_code"] = exit_code
        runfolder.write_json_atomic(path, data)


def _cuda(torch) -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


def _trace_only(torch, with_stack: bool = False) -> dict:
    """`trace_only` (torch >= 2.10) skips building Python event objects when the profiler stops: we
    only export the trace, and on a big window that build takes seconds. Older torch: nothing.
    Stacks need those objects (torch warns and turns trace_only off): not asked for with_stack."""
    if with_stack:
        return {}
    try:
        from torch.profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(trace_only=True)}
    except Exception:
        return {}


_ACTIVE: Session | None = None


def active() -> Session | None:
    return _ACTIVE


def set_active(session: Session | None) -> None:
    global _ACTIVE
    _ACTIVE = session

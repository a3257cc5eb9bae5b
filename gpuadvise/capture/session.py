"""The profiling session inside the user's process: steps torch.profiler, writes the run folder.

Stepping needs no code change: a global optimizer-step hook steps the profiler after every
`optimizer.step()`. Loops without an optimizer are stepped by the DataLoader iterator instead, until
the first optimizer step is seen, and a script may call `gpuadvise.step()` itself, which then takes
over. The trace is written the moment the window completes. Any failure in here is recorded and
profiling is switched off; the exception never reaches the user's code.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from . import facts as facts_mod
from . import runfolder

PREFIX = "gpuadvise> "


class StopAfterCapture(SystemExit):
    """Ends the script right after the capture when --stop-after-capture is given."""


class Session:
    def __init__(self, config: dict):
        self.config = config
        self.out = Path(config["out"])
        self.rank = runfolder.rank()
        self.prof = None
        self.torch = None
        self.mode = "auto"  # "auto" (optimizer, else DataLoader) or "manual" (gpuadvise.step())
        self.optimizer_steps = 0
        self.steps = 0
        self.done = False
        self.failed = False
        self.memory_history = False
        self.finishing = False  # set before the final stop: a partial window must not become a trace
        self.status: dict = {"state": "not started", "steps_stepped": 0, "step_source": None, "files": {}}
        self.started = time.time()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile, schedule
        except Exception as exc:
            self._fail("torch could not be imported", exc)
            return
        self.torch = torch
        try:
            facts_mod.install(torch)
            c = self.config
            activities = [ProfilerActivity.CPU]
            cuda = torch.cuda.is_available()
            if cuda:
                activities.append(ProfilerActivity.CUDA)
            self.prof = profile(
                activities=activities,
                schedule=schedule(wait=c["wait"], warmup=c["warmup"], active=c["active"], repeat=1),
                on_trace_ready=self._on_trace_ready,
                record_shapes=c["record_shapes"],
                with_stack=c["with_stack"],
                profile_memory=c["profile_memory"],
            )
            if cuda and c["memory_history"]:
                self._start_memory_history()
            self.prof.start()
            from torch.optim.optimizer import register_optimizer_step_post_hook

            register_optimizer_step_post_hook(self._after_optimizer_step)
            self._hook_dataloader(torch)
            self.status["state"] = "waiting for steps"
            self._write_status()
        except Exception as exc:
            self._fail("profiler start failed", exc)

    def finish(self, exit_code=None) -> None:
        """At the end of the script: record what happened to the capture (the trace is already written)."""
        try:
            if self.prof is not None and self.done:
                try:
                    self.prof.stop()  # the schedule has no more windows (repeat=1): just release it
                except Exception:
                    pass
            if self.prof is not None and not self.done and not self.failed:
                self.finishing = True
                self.status["state"] = (f"incomplete: the script ended after {self.steps} steps; the window needs "
                                        f"{self._needed()} (wait {self.config['wait']} + warmup {self.config['warmup']} "
                                        f"+ active {self.config['active']})")
                try:
                    self.prof.stop()
                except Exception:
                    pass
                self._stop_memory_history(dump=False)
            self._write_status(exit_code=exit_code)
        except Exception:  # nothing may escape at exit either
            pass

    # -- stepping ---------------------------------------------------------------------------------
    def manual_step(self) -> None:
        self.mode = "manual"
        self._step("gpuadvise.step()")

    def _after_optimizer_step(self, opt, args, kwargs) -> None:
        try:
            facts_mod.record_optimizer(opt)
        except Exception:
            pass
        self.optimizer_steps += 1
        if self.mode == "auto":
            self._step("optimizer.step()")

    def _hook_dataloader(self, torch) -> None:
        from torch.utils.data import dataloader as dl

        original = dl._BaseDataLoaderIter.__next__
        session = self

        def __next__(it):
            # Without an optimizer (inference, custom update rules) each batch starts a step.
            if session.mode == "auto" and session.optimizer_steps == 0 and not session.done:
                session._step("DataLoader batch")
            return original(it)

        dl._BaseDataLoaderIter.__next__ = __next__

    def _step(self, source: str) -> None:
        if self.done or self.failed or self.prof is None:
            return
        try:
            if self.status["step_source"] != source:
                self.status["step_source"] = source
            self.prof.step()
            self.steps += 1
            self.status["steps_stepped"] = self.steps
            if not self.done and self.steps <= self._needed() + 1:
                self._write_status()  # a few small writes: run.json stays true even after os._exit
        except Exception as exc:
            self._fail("profiler step failed", exc)
            return
        if self.done and self.config.get("stop_after_capture"):
            raise StopAfterCapture(0)

    def _needed(self) -> int:
        c = self.config
        return c["wait"] + c["warmup"] + c["active"]

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
            with open(tmp_json, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp_gz, final)
            os.unlink(tmp_json)
            self.status["files"]["trace"] = final.name
            self._stop_memory_history(dump=True)
            self.done = True
            self.status["state"] = "captured"
            self.status["captured_at"] = time.time()
            self._write_status()
            print(f"{PREFIX}captured {self.config['active']} steps → {final}", file=sys.stderr, flush=True)
        except Exception as exc:  # the window is lost, the training is not
            for p in (locals().get("tmp_json"), locals().get("tmp_gz")):
                try:
                    if p is not None and p.exists():
                        p.unlink()
                except OSError:
                    pass
            self._fail("writing the trace failed", exc)

    # -- CUDA memory ----------------------------------------------------------------------------------
    def _start_memory_history(self) -> None:
        try:
            self.torch.cuda.memory._record_memory_history(max_entries=self.config["max_entries"], stacks="python")
            self.memory_history = True
        except Exception as exc:
            self.status["memory_history_error"] = repr(exc)

    def _stop_memory_history(self, dump: bool) -> None:
        torch = self.torch
        if torch is None or not torch.cuda.is_available():
            return
        try:
            self.status["memory_stats"] = {k: v for k, v in torch.cuda.memory_stats().items()
                                           if isinstance(v, (int, float)) and not k.startswith(("active.", "inactive_split."))}
        except Exception as exc:
            self.status["memory_stats_error"] = repr(exc)
        if not self.memory_history:
            return
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
        self.memory_history = False

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed = True
        self.status["state"] = f"failed: {what}"
        self.status["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.status["error_traceback"] = traceback.format_exc(limit=8)
        try:
            if self.prof is not None:
                self.prof.stop()
        except Exception:
            pass
        try:
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
        data["capture"] = dict(self.status, window={k: self.config[k] for k in ("wait", "warmup", "active")},
                               options={k: self.config[k] for k in ("record_shapes", "with_stack", "profile_memory", "memory_history")})
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


_ACTIVE: Session | None = None


def active() -> Session | None:
    return _ACTIVE


def set_active(session: Session | None) -> None:
    global _ACTIVE
    _ACTIVE = session

"""The profiling window: which step is unprofiled, probed, warmed up, recorded; the profiler that follows
that schedule; the one-step shape probe; and the callbacks at the edges of the recorded steps.

The window (default: wait 10, warm-up 2, record 3), by step boundary k (step k starts at boundary k):
- steps 1 … wait−1 are unprofiled, except the last one when the shape probe runs (facts/shapes.py): a
  separate CPU-only profiler with shapes on, for that one step;
- warm-up steps are traced and discarded by torch.profiler, then `active` steps are recorded,
  without shapes, and written (with the probe's matmul shapes merged in) the moment the window ends;
- after the window: CUDA memory history on a GPU (see session/session.py), then unprofiled steps.

Kept apart from the session so that the schedule's arithmetic, and the place where other capture
features hook into the recorded steps (`WindowHooks`), can be read without the step detection or the
file writing around them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ..facts import shapes
from . import quiet


class Window:
    """The schedule's numbers, from the run's config."""

    def __init__(self, config: dict):
        self.W, self.w, self.a = config["wait"], config["warmup"], config["active"]
        self.end = self.W + self.w + self.a  # the boundary that ends the last recorded step
        self.first_recorded = self.W + self.w  # the boundary that starts the first recorded step
        # The probe needs a step of its own before the warm-up, not step 0 (the script's setup), and at
        # least one warm-up step: the window must not start at the boundary where the probe stops. torch
        # crashes (a segfault at the scope's exit) when one profiler stops and another starts inside the
        # same open record_function, and the optimizer hook runs inside `Optimizer.step#…`.
        probe_fits = self.W >= 2 and self.w >= 1
        wants_probe = config.get("shapes_probe") and not config["record_shapes"]
        self.probe_step = self.W - 1 if wants_probe and probe_fits else None
        # a window too short for the probe records shapes itself, as before the probe existed
        self.shapes = bool(config["record_shapes"] or (config.get("shapes_probe") and not probe_fits))

    def transition(self, k: int) -> bool:
        """Boundaries where torch.profiler changes state (and prints its own noise)."""
        return k in (self.W, self.first_recorded, self.end)

    def recorded(self, k: int) -> bool:
        """Whether the step that boundary k ends was recorded."""
        return self.first_recorded < k <= self.end

    def phase(self, k: int) -> str:
        """The phase of step k while the window is still open."""
        return "wait" if k < self.W else "warmup" if k < self.first_recorded else "active"

    def as_dict(self) -> dict:
        return {"wait": self.W, "warmup": self.w, "active": self.a}

    def profiler(self, torch, config: dict, on_trace_ready, schedule=None):
        """A torch.profiler that follows the schedule (this window alone, or `schedule`: a callable of the
        step number, windows.Plan's, that adds later windows); not started."""
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler import schedule as one_window

        activities = [ProfilerActivity.CPU]
        if cuda(torch):
            activities.append(ProfilerActivity.CUDA)
        return profile(
            activities=activities,
            schedule=schedule or one_window(wait=self.W, warmup=self.w, active=self.a, repeat=1),
            on_trace_ready=on_trace_ready,
            record_shapes=self.shapes,
            with_stack=config["with_stack"],
            profile_memory=config["profile_memory"],
            **trace_only(torch, config["with_stack"]),
        )


class WindowHooks:
    """Callbacks at the edges of the recorded steps: the place for capture features that must run only
    while the window records (sampling the DataLoader, collecting torch.compile events, …).

    - `on_start`: `fn(session, k)`, right after torch.profiler starts recording, at boundary k (the
      first recorded step begins);
    - `on_stop`: `fn(session, k, captured)`, once, when recording ends: at the window's last boundary
      after the trace is written (`captured` True), or when the script ends or profiling fails while
      the window is open (`captured` False).

    A callback may add keys to `session.status` (they land in run.json's `capture`). One that raises is
    recorded under `capture.hook_errors` and never reaches the user's code.
    """

    def __init__(self):
        self.on_start: list = []
        self.on_stop: list = []
        self.open = False

    def start(self, session, k: int) -> None:
        self.open = True
        self._call(self.on_start, session, session, k)

    def stop(self, session, k: int, captured: bool) -> None:
        if not self.open:
            return
        self.open = False
        self._call(self.on_stop, session, session, k, captured)

    @staticmethod
    def _call(callbacks: list, session, *args) -> None:
        for fn in callbacks:
            try:
                fn(*args)
            except Exception as exc:
                errors = session.status.setdefault("hook_errors", [])
                errors.append(f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")


class ShapeProbe:
    """A CPU-only profiler with shapes on, for the one step before the warm-up; its matmul events are
    merged into the recorded trace. Results and failures go to `status["shapes"]`."""

    def __init__(self, status: dict, probe_step: int | None):
        self.status = status
        self.probe_step = probe_step
        self.prof = None
        self.running = False
        self.events: list | None = None

    def start(self, torch) -> None:
        try:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True, **trace_only(torch))
            with quiet.quiet_fd2():
                self.prof.start()
            self.running = True
        except Exception as exc:
            self.prof = None
            self.status["shapes"] = {"mode": "probe", "state": f"probe failed: {type(exc).__name__}: {exc}"}

    def end(self, keep: bool, out: Path) -> None:
        prof, self.prof, self.running = self.prof, None, False
        if prof is None:
            return
        tmp = None
        try:
            with quiet.quiet_fd2():
                prof.stop()
            if keep:
                fd, tmp = tempfile.mkstemp(prefix=".gpuadvise-probe-", suffix=".json", dir=out)
                os.close(fd)
                prof.export_chrome_trace(tmp)
                self.events = shapes.probe_events(tmp)
                self.status["shapes"] = {"mode": "probe", "probe_step": self.probe_step,
                                         "state": "probed", "probe_matmuls": len(self.events)}
        except Exception as exc:
            self.status["shapes"] = {"mode": "probe", "state": f"probe failed: {type(exc).__name__}: {exc}"}
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def cuda(torch) -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


def trace_only(torch, with_stack: bool = False) -> dict:
    """`trace_only` (torch >= 2.10) skips building Python event objects when the profiler stops: we
    only export the trace, and on a big window that build takes seconds. Older torch: nothing.
    Stacks need those objects (torch warns and turns trace_only off), so it is not asked for with_stack."""
    if with_stack:
        return {}
    try:
        from torch.profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(trace_only=True)}
    except Exception:
        return {}

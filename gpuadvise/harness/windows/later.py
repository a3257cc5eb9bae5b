"""The windows after the first, inside the profiling session (`--on-signal`, `--when-slower`, `--every`):
what the session does for them at a step boundary and when one's trace is ready.

- At each boundary, the triggers' requests (triggers.py, requests.py) become planned windows
  (plan.py); the profiler is stepped through a planned window's boundaries only, its step counter
  moved to the window's first step (no per-step cost in between);
- a window's hooks (loader sampling, …) record into that window's run.json entry, not window 1's;
- its trace is written as `trace.wN…`, and its `step_times` (its recorded steps and the unprofiled
  ones within CONTEXT_STEPS of it) once those steps have run;
- at the end, a window the script did not finish is "incomplete", one it never reached "not reached".
"""

from __future__ import annotations

import sys
import time

from ..runfolder import writers
from . import quiet
from .plan import Plan, Planned
from .requests import Requests
from .triggers import Triggers

PREFIX = "gpuadvise> "
# the unprofiled steps on each side of a later window that its recorded steps are compared with (run.json
# `steps` for window 1 has the steps before it): the level the run was at when the window recorded
CONTEXT_STEPS = 10
KEPT_FOR_EVIDENCE = 2  # of --max-windows, with --when-slower: one for a new level and one for a stall until each is recorded
LONG_RUN_OPTIONS = ("on_signal", "when_slower", "every")  # any of them: windows after the first
# status keys the session itself keeps up to date: never what a later window's hooks recorded
SESSION_KEYS = {"state", "steps_stepped", "step_source", "files", "captured_at", "step_error", "hooks_error", "error",
                "error_traceback", "memory_stats", "shapes"}


def wanted(config: dict) -> bool:
    return any(config.get(k) for k in LONG_RUN_OPTIONS)


class LaterWindows:
    def __init__(self, session):
        self.session = session
        w, c = session.window, session.config
        self.plan = Plan(w.W, w.w, w.a, earliest_later=w.end + session.memory_steps + 1,
                         max_auto=int(c.get("max_windows") or 10),
                         kept_for_evidence=KEPT_FOR_EVIDENCE if c.get("when_slower") else 0)
        self.triggers = Triggers(c, Requests(session.out, session.rank), w.w, w.a)
        self._hook_window: Planned | None = None  # the later window whose hooks are open
        self._status_before: dict = {}
        self._unsettled: list[Planned] = []  # captured windows whose steps after them are still to come

    # -- at a step boundary ---------------------------------------------------------------------------
    def take_requests(self, k: int) -> None:
        s = self.session
        for req, automatic in self.triggers.boundary(k, s.window.end):
            win = self.plan.add(req.step, k, req.trigger, req.detail, request=req.id, automatic=automatic)
            if win is None:
                continue
            if req.step < win.start and req.trigger != "every":
                win.detail += (f" (asked for step {req.step}; " + ("this rank was past it" if req.step <= k else
                               "window 1 and its memory history come first") + ")")
            print(f"{PREFIX}window {win.index} ({win.trigger}) will record steps {win.first_recorded}–{win.end - 1}"
                  f"{': ' + win.detail if win.detail else ''}", file=sys.stderr, flush=True)
            s._write_status()

    def step(self, k: int) -> None:
        """After window 1: step the profiler through a later window's boundaries (and only those)."""
        s = self.session
        ending, current = self.plan.ending_at(k), self.plan.containing(k)
        ending = ending if ending is not None and ending.index > 1 and ending.state == "recording" else None
        if current is not None and (current.index == 1 or current.state.startswith(("incomplete", "failed"))):
            current = None
        if ending is not None or current is not None:
            try:
                if s.prof.step_num != k - 1:  # not stepped since the last window
                    s.prof.step_num = k - 1
                with quiet.quiet_fd2():
                    s.prof.step()  # a window that ends here is written inside (trace_ready)
            except Exception as exc:
                s._fail("profiler step failed", exc)
                return
            if current is not None and current.state == "planned":
                current.state = "warming up" if k < current.first_recorded else "recording"
            if current is not None and k == current.first_recorded:
                current.state = "recording"
                self._hooks_start(current, k)
        if self._unsettled:
            self._settle(k)

    def phase(self, k: int) -> str | None:
        return self.plan.phase(k)

    # -- a window's trace ---------------------------------------------------------------------------------
    def ending(self, k: int) -> Planned | None:
        """The later window whose trace the profiler hands over at boundary k (None: window 1's)."""
        win = self.plan.ending_at(k)
        return win if win is not None and win.index > 1 else None

    def trace_ready(self, prof, win: Planned) -> None:
        """A later window's trace: written beside the first; its steps and what its hooks saw go in its entry."""
        s = self.session
        try:
            final = writers.write_trace(prof, s.out, s.rank, s.probe.events, win.active, win.extra, window=win.index)
            win.trace, win.state = final.name, "captured"
            win.extra["captured_at"] = round(time.time(), 3)
        except Exception as exc:  # this window is lost; the training and the other windows are not
            win.state = f"failed: writing the trace failed: {type(exc).__name__}: {exc}"
            final = None
        self.hooks_stop(s.steps, captured=final is not None)
        self._window_steps(win, win.end - 1)
        self._unsettled.append(win)
        s._write_status()
        if final is not None:
            print(f"{PREFIX}captured window {win.index} ({win.trigger}), steps {win.first_recorded}–{win.end - 1} → "
                  f"{final}", file=sys.stderr, flush=True)

    def first_captured(self, trace_name: str) -> None:
        self.plan.windows[0].state, self.plan.windows[0].trace = "captured", trace_name

    # -- hooks of a later window -----------------------------------------------------------------------
    def _hooks_start(self, win: Planned, k: int) -> None:
        s = self.session
        self._hook_window, self._status_before = win, dict(s.status)
        s.hooks.start(s, k)

    def hooks_stop(self, k: int, captured: bool) -> None:
        """Close the window hooks (window 1's or a later one's); a later window's keys go in its entry."""
        s = self.session
        s.hooks.stop(s, k, captured)
        win, self._hook_window = self._hook_window, None
        if win is None:
            return
        before = self._status_before
        for key in [key for key, v in s.status.items()
                    if key not in SESSION_KEYS and (key not in before or before[key] is not v)]:
            win.extra[key] = s.status.pop(key)
            if key in before:
                s.status[key] = before[key]

    # -- step times --------------------------------------------------------------------------------------
    def _window_steps(self, win: Planned, last: int) -> None:
        """A later window's `step_times`: its own and the unprofiled ones around it, up to step `last`."""
        times = self.session.times
        before = [w.end for w in self.plan.windows if w.end <= win.start]
        after = [w.start - 1 for w in self.plan.windows if w.start >= win.end]
        first = max([win.start - CONTEXT_STEPS, times.settle + 1] + before)
        win.extra["step_times"] = times.summary(first, min([last] + after))

    def _settle(self, k: int, final: bool = False) -> None:
        """Once CONTEXT_STEPS steps followed a window (or at the end), its step times are complete."""
        for win in list(self._unsettled):
            if final or k > win.end + CONTEXT_STEPS:
                self._window_steps(win, min(k - 1, win.end + CONTEXT_STEPS))
                self._unsettled.remove(win)
                if not final:
                    self.session._write_status()

    # -- the end -----------------------------------------------------------------------------------------
    def close(self, steps: int) -> None:
        """At the end of the script: what became of the windows not captured."""
        for win in self.plan.later():
            if win.state == "captured" or win.state.startswith(("failed", "not ")):
                continue
            if win.start <= steps:
                win.state = f"incomplete: the script ended at step {steps}, inside the window"
            else:
                win.state = f"not reached: the script ended at step {steps}"
        self._settle(steps + 1, final=True)

    def failed(self, steps: int) -> None:
        for win in self.plan.later():
            if win.state != "captured":
                win.state = f"not recorded: profiling failed at step {steps}"

    def describe(self, capture: dict) -> None:
        """run.json's `capture.triggers`, `capture.windows` and `capture.window_notes`."""
        capture["triggers"] = self.triggers.describe()
        capture["windows"] = [w.as_dict() for w in self.plan.windows]
        if self.plan.notes:
            capture["window_notes"] = list(self.plan.notes)

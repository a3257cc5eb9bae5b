"""When to record a window after the first: the three ways a long run asks for one.

- `--on-signal`: a signal (SIGUSR2 unless `--signal` names another) to the training process, or to the
  `gpuadvise profile` process that runs it (it passes the signal on), asks for a window from the next
  step; so does a line in the run folder's request file (`gpuadvise trigger RUN`, or `--file` where
  signals cannot reach the process). The handler only counts: the request is made at the next step
  boundary, outside any of the user's code.
- `--when-slower PCT` (slowwatch.py): a drift of the median step, or a periodic stall.
- `--every N`: a window every N steps after the first one.

Signals and slowdowns go through the request file (requests.py) so that every rank of a job records the
same steps; `--every` needs no agreement (every rank counts the same steps). Each boundary costs a few
comparisons; the file is stat'ed every `requests.POLL_EVERY` steps when something may write to it.
"""

from __future__ import annotations

import signal
import threading

from .requests import Request, Requests
from .slowwatch import SlowWatch

DEFAULT_SIGNAL = "USR2"


def signal_number(name: str) -> int:
    """A signal name as the user writes it (USR2, SIGUSR2, sigusr2, 12); ValueError when unknown."""
    text = str(name).strip().upper()
    if text.isdigit():
        return int(signal.Signals(int(text)))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return int(getattr(signal.Signals, text))
    except AttributeError:
        raise ValueError(f"unknown signal {name!r}") from None


class Triggers:
    def __init__(self, config: dict, requests: Requests, warmup: int, active: int):
        self.requests = requests
        self.warmup, self.active = warmup, active  # of every window: where a stall is placed in one
        self.every = config.get("every")
        self.on_signal = bool(config.get("on_signal"))
        self.signum = signal_number(config.get("signal") or DEFAULT_SIGNAL) if self.on_signal else None
        pct = config.get("when_slower")
        self.watch = SlowWatch(float(pct), int(config.get("slower_steps") or 20)) if pct else None
        self.signalled = 0
        self.listening: str | None = None  # why signals are not heard, when they are not
        self._previous = None
        self._posted = False
        self._after_profiled = True  # the next unprofiled step follows a profiled one (or the start)

    # -- set-up ---------------------------------------------------------------------------------------
    def install(self) -> None:
        if not self.on_signal:
            return
        if threading.current_thread() is not threading.main_thread():
            self.listening = "not listening for signals: the capture started outside the main thread (use the request file)"
            return
        try:
            self._previous = signal.signal(self.signum, self._handler)
        except (ValueError, OSError) as exc:
            self.listening = f"not listening for signals: {exc} (use the request file)"

    def uninstall(self) -> None:
        if self.signum is not None and self.listening is None and signal.getsignal(self.signum) is self._handler:
            try:
                signal.signal(self.signum, self._previous if self._previous is not None else signal.SIG_DFL)
            except (ValueError, OSError):
                pass

    def _handler(self, signum, frame) -> None:
        self.signalled += 1  # the request is made at the next step boundary
        if callable(self._previous):
            self._previous(signum, frame)

    def describe(self) -> dict:
        """run.json's `capture.triggers`."""
        return {"on_signal": signal.Signals(self.signum).name if self.signum is not None else None,
                "listening": self.listening or ("yes" if self.on_signal else None),
                "when_slower_pct": self.watch.pct if self.watch else None,
                "slower_steps": self.watch.k if self.watch else None, "every": self.every,
                "requests": self.requests.path.rsplit("/", 1)[-1]}

    # -- per step --------------------------------------------------------------------------------------
    def observe(self, number: int, phase: str, ms: float | None) -> None:
        """A step's final time; only unprofiled ones after the loop's start-up count."""
        if self.watch is None:
            return
        unprofiled = phase in ("wait", "after", "off")
        if unprofiled and not self._after_profiled and ms is not None and number > 2:
            self.watch.observe(number, ms)
        self._after_profiled = not unprofiled

    def boundary(self, k: int, first_window_end: int) -> list[tuple[Request, bool]]:
        """The windows to plan at boundary k: (request, automatic) pairs."""
        out: list[tuple[Request, bool]] = []
        if self.signalled:
            self.signalled = 0
            self.requests.post(k, "signal", f"{signal.Signals(self.signum).name} received before step {k}")
            self._posted = True
        if self.watch is not None:
            seen = self.watch.check()
            if seen is not None:
                step = None
                if seen.at_step is not None:  # the stall in the window's second recorded step (a first is left out when slow)
                    step = max(seen.at_step - self.warmup - min(1, self.active - 1), k + self.requests.lead)
                self.requests.post(k, seen.kind, seen.detail, step=step)
                self._posted = True
        if self.every and k > first_window_end and (k - first_window_end) % self.every == 0:
            out.append((Request(f"every-{k}", k + 1, "every", f"every {self.every} steps", "schedule"), True))
        if self.on_signal or self._posted or self.requests.lead > 1:
            for r in self.requests.poll(k, force=self._posted):
                out.append((r, r.trigger in ("slower", "stall")))
            self._posted = False
        return out

"""Several profiled windows in one run: the first from `--wait/--warmup/--active`, the others planned while
the script runs (a signal, `gpuadvise trigger`, `--when-slower`, `--every`).

A window starts at a step boundary `start`: `warmup` warm-up steps (traced and discarded), then `active`
recorded steps; `end = start + warmup + active` is the boundary that ends its last recorded step, where
its trace is written. Steps are numbered as run.json's `steps` and the trace's `ProfilerStep#N` number
them, so window 2's trace holds `ProfilerStep#start+warmup` … `#end-1`.

One torch.profiler follows the whole plan: `Plan.schedule` is its schedule (a callable of the step
number), so window 1 and the later ones are the same profiler's cycles, never two profilers at once
(torch crashes when one stops and another starts inside one open `record_function`). Between windows the
session does not step the profiler at all (no per-step cost); it moves the profiler's step counter to
the window's first step when one begins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_WINDOWS = 100  # a safety net for a script signalled in a loop: each window is a trace file
# the evidence --when-slower records, for which --max-windows keeps windows: a new regime, a recurring stall
EVIDENCE = {"slower": "a new regime after a drift", "stall": "a recurring stall"}
REASONS = {"schedule": "window 1 (--wait/--warmup/--active)", "signal": "asked for (a signal)",
           "trigger file": "asked for (gpuadvise trigger)", "every": "the schedule (--every)",
           "slower": "a new regime: the level the step time settled at after an established drift",
           "stall": "a recurring stall: the next one its period predicts"}


@dataclass
class Planned:
    index: int  # 1-based, in the order the windows start
    start: int  # the boundary where the warm-up begins
    warmup: int
    active: int
    trigger: str  # "schedule" (window 1), "signal", "trigger file", "slower", "stall", "every"
    detail: str = ""
    requested_at: int | None = None  # the step boundary at which it was asked for
    request: str | None = None  # the request's id (capture-requests.jsonl)
    state: str = "planned"
    trace: str | None = None
    extra: dict = field(default_factory=dict)  # what the window hooks recorded (loader sampling, …), and step times
    reason: str = ""  # why this moment, in words: which evidence it records (run.json's `reason`)
    again_of: Planned | None = field(default=None, repr=False)  # the window that recorded this evidence first

    @property
    def first_recorded(self) -> int:
        return self.start + self.warmup

    @property
    def end(self) -> int:
        return self.start + self.warmup + self.active

    def steps(self) -> list[int]:
        """The recorded steps (as run.json and the trace number them)."""
        return list(range(self.first_recorded, self.end))

    def as_dict(self) -> dict:
        reason = self.reason + (f", again (window {self.again_of.index} recorded the first)" if self.again_of else "")
        out = {"index": self.index, "trigger": self.trigger, "reason": reason, "detail": self.detail,
               "requested_at": self.requested_at,
               "request": self.request, "start": self.start, "warmup": self.warmup, "active": self.active,
               "steps": [self.first_recorded, self.end - 1], "state": self.state, "trace": self.trace}
        out.update(self.extra)
        return out


class Plan:
    """The windows of one run and the profiler schedule that records them."""

    def __init__(self, first_start: int, warmup: int, active: int, earliest_later: int, max_auto: int,
                 kept_for_evidence: int = 0):
        self.warmup, self.active = warmup, active
        self.earliest_later = earliest_later  # later windows start after window 1 and its memory history
        self.max_auto = max_auto
        # with --when-slower, --max-windows keeps a window for each kind of evidence not recorded yet (a new
        # regime after a drift, a recurring stall: the moments that explain most): neither --every nor a
        # repeat of one kind (a climb that goes on slowing down) takes the last ones
        self.kept_for_evidence = min(kept_for_evidence, max(max_auto - 1, 0))
        self.windows = [Planned(1, first_start, warmup, active, "schedule", reason=REASONS["schedule"])]
        self.auto = 0  # windows planned by --every / --when-slower
        self.notes: list[str] = []

    # -- planning ------------------------------------------------------------------------------------
    def add(self, start: int, k: int, trigger: str, detail: str = "", request: str | None = None,
            automatic: bool = False) -> Planned | None:
        """Plan a window from boundary `start` (moved to the first free boundary after k and after the
        windows already planned). None when the cap is reached or an overlapping window already covers it."""
        if automatic and self.auto >= self.max_auto:
            self._note(f"{trigger}: not recorded at step {k}, --max-windows ({self.max_auto}) reached")
            return None
        kept = self._kept_for(trigger) if automatic else []
        if kept and self.auto >= self.max_auto - len(kept):
            what = " and ".join(EVIDENCE[e] for e in kept)
            self._note(f"{trigger}: not recorded at step {k}" + (f", a repeat of window {self._first_of(trigger).index}'s "
                       "evidence" if trigger in EVIDENCE else "") + f": the last {len(kept)} of --max-windows "
                       f"({self.max_auto}) are kept for --when-slower ({what}, not recorded yet)")
            return None
        if len(self.windows) >= MAX_WINDOWS:
            self._note(f"{trigger}: not recorded at step {k}, {MAX_WINDOWS} windows is the most one run keeps")
            return None
        start = max(start, k + 1, self.earliest_later)
        end = start + self.warmup + self.active
        for w in self.windows:
            if w.state.startswith(("incomplete", "failed")):
                continue
            if start < w.end and w.start < end:  # overlaps: the steps it asks for are being recorded anyway
                if w.index > 1 and w.state == "planned" and trigger != w.trigger and trigger not in w.detail:
                    w.detail = f"{w.detail}; also {trigger}: {detail}" if w.detail else f"also {trigger}: {detail}"
                return None
        planned = Planned(len(self.windows) + 1, start, self.warmup, self.active, trigger, detail, requested_at=k,
                          request=request, reason=REASONS.get(trigger, trigger),
                          again_of=self._first_of(trigger) if trigger in EVIDENCE else None)
        self.windows.append(planned)
        self.windows.sort(key=lambda w: w.start)
        for i, w in enumerate(self.windows, start=1):
            w.index = i
        if automatic:
            self.auto += 1
        return planned

    def _first_of(self, trigger: str) -> Planned | None:
        return next((w for w in self.windows if w.trigger == trigger and w.index > 1), None)

    def _kept_for(self, trigger: str) -> list[str]:
        """The kinds of evidence that windows are kept for, against a window for `trigger`: those not
        recorded yet, other than the one this window records for the first time."""
        if not self.kept_for_evidence:
            return []
        recorded = {w.trigger for w in self.windows if w.index > 1}
        missing = [e for e in EVIDENCE if e not in recorded]
        if trigger in EVIDENCE and trigger not in recorded:
            return []  # the first window of its kind: what the budget was kept for
        return missing[:self.kept_for_evidence]

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # -- lookups -------------------------------------------------------------------------------------
    def containing(self, k: int) -> Planned | None:
        """The window whose warm-up or recording holds step k."""
        for w in self.windows:
            if w.start <= k < w.end:
                return w
        return None

    def ending_at(self, k: int) -> Planned | None:
        for w in self.windows:
            if w.end == k:
                return w
        return None

    def later(self) -> list[Planned]:
        return self.windows[1:]

    def phase(self, k: int) -> str | None:
        w = self.containing(k)
        if w is None:
            return None
        return "warmup" if k < w.first_recorded else "active"

    def schedule(self, k: int):
        """torch.profiler's schedule: the action for step k (ProfilerStep#k)."""
        from torch.profiler import ProfilerAction

        w = self.containing(k)
        if w is None or w.state.startswith(("incomplete", "failed")):
            return ProfilerAction.NONE
        if k < w.first_recorded:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if k == w.end - 1 else ProfilerAction.RECORD

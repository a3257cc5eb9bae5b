"""What both framework callbacks do with a profiling session: start one when training starts (unless
`gpuadvise profile` or another capture already runs one: the callback then only marks steps), and end
it when training ends, printing where the run folder is and the top findings, as `gpuadvise profile` does."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuadvise.api.capture import Capture
from gpuadvise.harness.runfolder import layout
from gpuadvise.harness.active import active

PREFIX = "gpuadvise> "


class CallbackCapture:
    def __init__(self, name: str, out, options: dict, summary: bool):
        self.name = name  # the callback, for run.json's `command`
        self.out = Path(out) if out is not None else None
        self.options = options
        self.summary = summary
        self.capture: Capture | None = None
        self.path: Path | None = self.out  # the run folder, once known
        self.reports = None

    def start(self) -> None:
        """Start a session of our own, unless one already runs in this process."""
        if self.capture is not None or active() is not None:
            return
        out = self.out or layout.new_run_dir(sys.argv[0] if sys.argv and sys.argv[0] else "train")
        self.path = Path(out)
        capture = Capture(out, **self.options)
        capture.command = [self.name, str(out)]
        try:
            capture.__enter__()
        except Exception as exc:  # a folder holding an older capture, one we cannot create: train on, unprofiled
            print(f"{PREFIX}not profiling this run: {exc}", file=sys.stderr, flush=True)
            return
        self.capture = capture

    def complete(self) -> bool:
        """Our session has written the trace and recorded what it records after the window."""
        session = active() if self.capture is not None else None
        return bool(session is not None and session.complete)

    def finish(self, failed: bool = False) -> None:
        """End our session; print the run folder, and (`summary`) the top findings, on the first rank."""
        cap, self.capture = self.capture, None
        if cap is None:
            return
        cap.__exit__(RuntimeError if failed else None, None, None)
        if layout.rank() not in (None, 0):
            return
        print(f"{PREFIX}run folder: {cap.path}", file=sys.stderr, flush=True)
        if self.summary:
            from gpuadvise.harness.cli import _summary

            self.reports = _summary(cap.path, layout.rank())

    def top_findings(self, n: int = 3) -> list[str]:
        """The summary's first findings, one line each ("[high] Training waits on the DataLoader (~23% of
        step time): …advice"), for the framework's logger; empty without an analysis."""
        from gpuadvise.analyzer.model.report import all_findings

        lines = []
        for f in all_findings(self.reports)[:n] if self.reports else []:
            saving = f.impact.est_step_saving_pct
            head = f"[{f.severity}] {f.title}" + (f" (~{saving:.1f}% of step time)" if saving else "")
            lines.append(f"gpuadvise {f.topic}: {head}: {f.advice.splitlines()[0] if f.advice else ''}".rstrip(": "))
        return lines

#!/usr/bin/env python3
"""Benchmark `gpuadvise view`: time to first paint and time to findings on big traces.

    python bench/bench_view.py [--sizes 250,1000] [--data-dir bench/data] [PATH ...]

Each trace is opened in a fresh process running the real app headless (160×45) from paths, as
`gpuadvise view PATH` does, with three timestamps taken from inside the app:

- first paint: the loading screen has been drawn (loading and analysis run in a thread worker);
- findings: the analysis is done and the findings screen has been drawn;
- timeline ready: the worker has indexed every event for the timeline (after the findings show).

All three count from the process start (interpreter start-up and imports included). While the worker
runs, a 50 ms UI timer records the longest gap between its ticks: how long the UI could not respond
at worst. Peak RSS comes from getrusage (the loader's helper process, if it forks one, is not
counted). Each trace is opened twice: with GPUADVISE_NO_CACHE=1 (a full parse), then with the model
cache the loader keeps beside big traces (analyzer/cache.py), as a second `gpuadvise view` would. Traces are `bench/data/grown_<size>mb.json` (see
grow_trace.py / bench_analyze.py); pass paths to time other files. Not a test: it prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, resource, sys, time
T0 = float(sys.argv[2])
# as `gpuadvise view PATH` does (tui/cli.py): the analysis starts before the app (and Textual) is imported
from gpuadvise.analyzer import run as analysis
from gpuadvise.tui.ahead import start_analysis
sources = analysis.resolve_inputs([sys.argv[1]])
ahead = start_analysis([sys.argv[1]], sources)
from gpuadvise.tui.app import GpuadviseApp

marks = {}
gaps = []

class Timed(GpuadviseApp):
    def on_mount(self):
        super().on_mount()
        self.call_after_refresh(lambda: marks.setdefault("first_paint", time.time() - T0))
        self._last = time.monotonic()
        self._ticker = self.set_interval(0.05, self._tick)

    def _tick(self):
        now = time.monotonic()
        if self.failure:
            marks["error"] = self.failure
            self.exit()
            return
        if "findings" not in marks or not self.data.timeline_ready(len(self.data.reports) - 1):
            gaps.append(now - self._last)
        self._last = now
        if "findings" in marks and self.data.timeline_ready(len(self.data.reports) - 1):
            marks.setdefault("timeline_ready", time.time() - T0)
            self.exit()

    def _start(self, data):  # the analysis is done: screens are created, findings first
        super()._start(data)
        self.call_after_refresh(lambda: marks.setdefault("findings", time.time() - T0))

app = Timed(paths=[sys.argv[1]], cursor_blink=False, sources=sources, ahead=ahead)
app.run(headless=True, size=(160, 45))
marks["max_ui_gap"] = max(gaps, default=0.0)
marks["findings_count"] = len(app.data.findings) if app.data else 0
marks["events"] = sum(r.model.meta.events_total for r in app.data.reports if r.model) if app.data else 0
marks["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(marks))
'''


def measure(path: Path, cached: bool) -> dict:
    env = dict(os.environ)
    if not cached:
        env["GPUADVISE_NO_CACHE"] = "1"  # the loader's model cache (cache.py) off: a full parse
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), repr(t0)], cwd=REPO, capture_output=True, text=True,
                         env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    lines = out.stdout.strip().splitlines()
    if not lines:
        return {"error": "no result"}
    return json.loads(lines[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", type=Path)
    p.add_argument("--sizes", default="250,1000", help="grown trace sizes in MB (default 250,1000)")
    p.add_argument("--data-dir", type=Path, default=REPO / "bench" / "data")
    args = p.parse_args()
    from bench_analyze import bytecode_as_installed  # sibling script

    bytecode_as_installed()
    paths = list(args.paths) or [args.data_dir / f"grown_{s.strip()}mb.json" for s in args.sizes.split(",") if s.strip()]
    print("| trace | MB | parse | events | first paint | findings | timeline ready | worst UI stall | peak RSS |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for path in paths:
        if not path.is_file():
            print(f"| {path.name} | – | | missing: make it with bench/bench_analyze.py --keep | | | | | |")
            continue
        mb = path.stat().st_size / 1e6
        # cold first (and it leaves the model cache behind), then the re-open that reads the cache
        for cached in (False, True):
            r = measure(path, cached)
            how = "cached model" if cached else "full parse"
            if "error" in r:
                print(f"| {path.name} | {mb:,.0f} | {how} | FAILED: {r['error']} | | | | | |")
                continue
            print(f"| {path.name} | {mb:,.0f} | {how} | {r['events']:,} | {r['first_paint']:.2f} s | "
                  f"{r['findings']:.1f} s | {r['timeline_ready']:.1f} s | {r['max_ui_gap'] * 1e3:,.0f} ms | "
                  f"{r['peak_rss_mb']:,.0f} MB |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

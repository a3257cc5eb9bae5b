#!/usr/bin/env python3
"""Where every second of `gpuadvise analyze FILE` goes, phase by phase:

    python bench/profile_load.py FILE [--workers 1|2]

Runs `gpuadvise analyze FILE --format json --no-cache -o <tmp>` in this process with timers around
the reader's steps and the analysis's steps, then prints one line per phase (seconds and share):

- read: `scan` (the compiled scanner: JSON bytes → flat columns and their distinct texts, decoded once;
  a chunk it declines is timed here too, then decoded by msgspec), `decode` (JSON bytes → event structs,
  msgspec), `args` (the args of the events a column needs), `columns` (structs or scanned columns →
  per-chunk numpy columns), `frames` (chunks joined into the model's DataFrames),
  `split` (waiting for the forked worker's half and merging it; 2 workers only), `other read` (finding
  the array, windows, header);
- analysis: `metrics` (measure.compute), `memory` (the memory summary), `rules` (run_rules, with the
  Analysis's lazy measures they pull), `figures` (the report's charts), `report` (rendering and writing).

With 2 workers the read phases are the parent's (it decodes half, then waits for the worker's half).
A bench, not a test: the numbers depend on the machine and its load (printed with them).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SPENT: dict[str, float] = defaultdict(float)


def timed(owner, attr: str, phase: str) -> None:
    fn = getattr(owner, attr)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            SPENT[phase] += time.perf_counter() - t0

    setattr(owner, attr, wrapper)


def instrument() -> None:
    from gpuadvise.analyzer.read import chunks, columns, parallel
    from gpuadvise.analyzer.run import single

    timed(single, "load_trace", "read")
    for name, phase in (("decode_events", "decode"), ("decode_args", "args")):
        if hasattr(chunks, name):  # the columnar reader's steps
            timed(chunks, name, phase)
    if not hasattr(chunks, "decode_events"):  # the reader before: decoding events and their args is one step
        timed(chunks, "decode_chunk", "decode")
    timed(columns.Builder, "add_chunk", "columns")
    if hasattr(chunks, "scan_chunk"):
        timed(chunks, "scan_chunk", "scan")
        timed(columns.Builder, "add_scanned", "columns")
    timed(columns.Builder, "frames", "frames")
    timed(columns.Builder, "merge", "split")
    timed(parallel.forked.Forked, "result", "split")
    timed(single, "compute", "metrics")
    timed(single, "summarize", "memory")
    timed(single, "run_rules", "rules")
    timed(single, "trace_figures", "figures")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    os.environ["GPUADVISE_LOAD_WORKERS"] = str(args.workers)
    instrument()
    from gpuadvise.cli import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rc = cli(["analyze", args.trace, "--format", "json", "--no-cache", "-o", str(Path(tmp) / "r.json")])
        total = time.perf_counter() - t0
    if rc not in (0, 1):
        sys.exit(f"analyze exited {rc}")
    read = SPENT.pop("read")
    # columns is timed around add_chunk, which (columnar reader) calls decode_args: count args once
    if "args" in SPENT and "columns" in SPENT:
        SPENT["columns"] -= SPENT["args"]
    inner = sum(SPENT[k] for k in ("scan", "decode", "args", "columns", "frames", "split"))
    SPENT["other read"] = read - inner
    SPENT["report"] = total - read - sum(SPENT[k] for k in ("metrics", "memory", "rules", "figures"))
    size = os.path.getsize(args.trace) / 1e6
    print(f"{args.trace}: {size:.0f} MB, {args.workers} worker(s), load {os.getloadavg()[0]:.2f}; total {total:.2f} s "
          f"(read {read:.2f} s)")
    for phase in ("scan", "decode", "args", "columns", "frames", "split", "other read", "metrics", "memory", "rules",
                  "figures", "report"):
        if phase in SPENT:
            print(f"  {phase:<11} {SPENT[phase]:7.2f} s  {SPENT[phase] / total:5.1%}")


if __name__ == "__main__":
    main()

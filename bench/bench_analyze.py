#!/usr/bin/env python3
"""Benchmark `gpuadvise analyze` against a bare json.load on grown real traces.

    python bench/bench_analyze.py [--sizes 100,1000] [--keep] [--data-dir bench/data] [--hta]

For each size (MB of uncompressed JSON) a trace ``grown_<size>mb.json`` is made with
grow_trace.py (unless present), then each tool runs in its own fresh child process so
that wall time and peak RSS (ru_maxrss from os.wait4) belong to that tool alone.
Prints a markdown table.  MB are 10**6 bytes throughout.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grow_trace  # noqa: E402  (sibling script)

REPO_ROOT = Path(__file__).resolve().parent.parent

JSON_LOAD = "import json, sys\nwith open(sys.argv[1]) as f:\n    json.load(f)\n"
HTA_SCRIPT = (
    "import os, sys\n"
    "from hta.trace_analysis import TraceAnalysis\n"
    "p = sys.argv[1]\n"
    "a = TraceAnalysis(trace_files={0: p}, trace_dir=os.path.dirname(p))\n"
    "a.get_temporal_breakdown(visualize=False)\n"
)


# The helper that actually spawns and reaps the measured child.  It runs in its own
# small, fresh interpreter because a child's ru_maxrss starts at its parent's peak RSS
# (fork copies the parent's memory high-water mark, exec keeps it), and this benchmark
# process gets big while growing traces.  Prints "returncode wall_seconds maxrss_kib".
LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)\n"
    "_, status, ru = os.wait4(p.pid, 0)  # rusage of exactly this child\n"
    "wall = time.perf_counter() - t0\n"
    "p.returncode = os.waitstatus_to_exitcode(status)  # tell Popen it was reaped\n"
    "print(p.returncode, wall, ru.ru_maxrss)\n"
)


@dataclass
class Run:
    rc: int
    wall_s: float
    peak_rss_mb: float
    stderr: str


def measure(cmd: list[str]) -> Run:
    """Run cmd once in a fresh child; return its exit code, wall time, peak RSS and stderr."""
    with tempfile.TemporaryFile() as err:
        res = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], stdout=subprocess.PIPE,
                             stderr=err, text=True, check=True)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    rc, wall, maxrss_kib = res.stdout.split()
    return Run(int(rc), float(wall), int(maxrss_kib) * 1024 / 1e6, stderr)  # ru_maxrss: KiB on Linux


def warm_page_cache(path: Path) -> None:
    """Read the file once so no tool pays for the cold disk read and the order is fair."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def tools(path: Path, out_json: Path, with_hta: bool) -> list[tuple[str, list[str]]]:
    py = sys.executable
    # `python -m gpuadvise` is the `gpuadvise` console script run by this interpreter,
    # without a shell shim (e.g. pyenv) in between.
    t = [
        ("json.load", [py, "-c", JSON_LOAD, str(path)]),
        ("gpuadvise", [py, "-m", "gpuadvise", "analyze", str(path), "--format", "json", "-o", str(out_json)]),
    ]
    if with_hta:
        t.append(("HTA", [py, "-c", HTA_SCRIPT, str(path)]))
    return t


def fmt_row(size_mb, tool, run: Run | None, base: Run | None) -> str:
    if run is None:
        return f"| {size_mb:.0f} | {tool} | skipped | | | | | |"
    ok = run.rc == 0
    name = tool if ok else f"{tool} **FAILED** (rc={run.rc})"
    cells = [f"{size_mb:.0f}", name, f"{run.wall_s:.2f}", f"{size_mb / run.wall_s:.1f}",
             f"{run.peak_rss_mb:.0f}", f"{run.peak_rss_mb / size_mb:.2f}"]
    if ok and base is not None and base.rc == 0 and run is not base:
        cells += [f"{run.wall_s / base.wall_s:.2f}", f"{run.peak_rss_mb / base.peak_rss_mb:.2f}"]
    else:
        cells += ["", ""]
    return "| " + " | ".join(cells) + " |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,1000", help="comma-separated target sizes in MB (default 100,1000)")
    ap.add_argument("--data-dir", type=Path, default=REPO_ROOT / "bench" / "data")
    ap.add_argument("--src", type=Path, default=grow_trace.DEFAULT_SRC, help="trace to grow")
    ap.add_argument("--keep", action="store_true", help="keep grown traces this run created (default: delete)")
    ap.add_argument("--hta", action="store_true", help="also time HTA's temporal breakdown")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    with_hta = args.hta and importlib.util.find_spec("hta") is not None
    if args.hta and not with_hta:
        print("HTA not installed, skipped", file=sys.stderr)

    args.data_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            path = args.data_dir / f"grown_{size}mb.json"
            created = not path.exists()
            if created:
                print(f"growing {args.src.name} to ~{size} MB -> {path}", file=sys.stderr)
                grow_trace.grow(args.src, path, size)
            file_mb = path.stat().st_size / 1e6
            warm_page_cache(path)
            try:
                base = None
                for tool, cmd in tools(path, Path(tmp) / "out.json", with_hta):
                    print(f"  {file_mb:.0f} MB: {tool} ...", file=sys.stderr, flush=True)
                    run = measure(cmd)
                    if run.rc != 0:
                        print(f"--- {tool} failed on {path} (rc={run.rc}); stderr (tail):\n"
                              f"{run.stderr[-4000:]}\n---", file=sys.stderr)
                    base = run if tool == "json.load" else base
                    rows.append(fmt_row(file_mb, tool, run, base))
                if args.hta and not with_hta:
                    rows.append(fmt_row(file_mb, "HTA (not installed)", None, None))
            finally:
                if created and not args.keep:
                    path.unlink()

    ram_gb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    print(f"\n{os.cpu_count()} CPUs, {ram_gb:.0f} GB RAM, Python {platform.python_version()} on "
          f"{platform.machine()}; MB = 10^6 bytes; each tool in a fresh process, page cache warm\n")
    print("| size (MB) | tool | time (s) | MB/s | peak RSS (MB) | RSS / file size | time vs json.load | RSS vs json.load |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

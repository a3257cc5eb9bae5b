#!/usr/bin/env python3
"""The reader's targets, measured side by side in one run (ratios are what count on a shared machine):

    python bench/bench_reader.py [--trace bench/data/resnet30.json] [--job bench/data/job16] [--repeat 3]

1. `json.load` of the big trace, then `gpuadvise analyze TRACE --format json --no-cache` (cold: no model
   cache): wall time and peak RSS of each, in fresh processes (bench_analyze.measure).
   Target: analyze ≤ 0.1× json.load's time, peak RSS ≤ 0.5× the file.
2. `gpuadvise analyze JOB_DIR --no-cache` with `-j 1` and `-j 2`: seconds per GB of traces. Target ≤ 3 s/GB.
   Beside them, the least either could take with this reader on this machine, whatever the analysis cost:
   the interpreter's start with the analysis's imports, plus reading every rank and nothing else (one
   process reading the ranks one after the other, as `-j 1` does; for `-j 2`, half of that reading).
3. `gpuadvise view TRACE`, uncached: the time until the findings screen is drawn (bench_view.measure).
   Target: within 1.2× analyze's time.

Make the inputs first: the trace with `python bench/grow_trace.py SRC bench/data/resnet30.json --size-mb 970`
(SRC: the ResNet-50 V100 sample, kineto/tb_plugin/samples/resnet50_num_workers_0/…, ×32), the job with
`python bench/make_job.py bench/data/job16 --ranks 16`. gpuadvise's modules are compiled to bytecode first, as
`pip install` does (bench_analyze.bytecode_as_installed). Every run's inputs are read into the page cache just
before it (json.load's 4 GB, or the host's memory reclaim, can push them out: a disk read is no part of the
targets). With `--repeat N` each gpuadvise command runs N times and the medians are compared, with the range
beside them. The machine's load (`os.getloadavg`) is printed beside the numbers. Not a test: it prints a table and whether each target is met.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import JSON_LOAD, bytecode_as_installed, measure, warm_page_cache  # noqa: E402  (sibling scripts)
from bench_view import measure as measure_view  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# The interpreter's start with what `gpuadvise analyze` imports before it reads a byte.
START_ONLY = "import gpuadvise.analyzer.run.engine, gpuadvise.analyzer.read.loader\n"
# Reading alone: each trace read as `analyze --no-cache` reads it, no analysis; prints the seconds spent reading.
READ_ONLY = (
    "import sys, time\n"
    "from gpuadvise.analyzer.read.loader import load_trace\n"
    "t = time.perf_counter()\n"
    "for f in sys.argv[1:]:\n"
    "    load_trace(f, cache=False)\n"
    "print(time.perf_counter() - t)\n"
)


def job_floor(py: str, files: list, env: dict) -> tuple[float, float]:
    """(the interpreter's start with the analysis's imports, seconds reading every file in one process)."""
    import subprocess

    for f in files:
        warm_page_cache(f)
    start = measure([py, "-c", START_ONLY], env).wall_s
    out = subprocess.run([py, "-c", READ_ONLY, *map(str, files)], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout
    return start, float(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=REPO / "bench/data/resnet30.json")
    p.add_argument("--job", type=Path, default=REPO / "bench/data/job16")
    p.add_argument("--skip-json-load", action="store_true", help="leave out json.load (needs ~3× the file in RAM)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run each gpuadvise command N times and compare medians (json.load runs once)")
    a = p.parse_args()
    bytecode_as_installed()
    py = sys.executable
    env = {"GPUADVISE_NO_CACHE": "1", "OMP_NUM_THREADS": "1"}
    job_files = sorted(f for f in a.job.iterdir() if f.is_file() and not f.name.startswith(".")) if a.job.is_dir() else []
    rows, ok, floors = [], [], []

    def runs(files, how):
        """`how()` N times, each after its inputs are read into the page cache again (a 4 GB json.load, or
        the host's memory reclaim, may have pushed them out): (median wall s, highest peak RSS MB, range)."""
        walls, rss = [], []
        for _ in range(max(1, a.repeat)):
            for f in files:
                warm_page_cache(f)
            wall, peak = how()
            walls.append(wall)
            rss.append(peak)
        spread = f"{min(walls):.2f}–{max(walls):.2f}" if len(walls) > 1 else ""
        return statistics.median(walls), max(rss), spread

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        size = a.trace.stat().st_size / 1e6
        base = None
        if not a.skip_json_load:
            warm_page_cache(a.trace)
            r = measure([py, "-c", JSON_LOAD, str(a.trace)], env)
            base = (r.wall_s, r.peak_rss_mb, "")

        def analyze(*args):
            r = measure([py, "-m", "gpuadvise", "analyze", *map(str, args), "--format", "json", "--no-cache", "-o", out], env)
            return r.wall_s, r.peak_rss_mb

        def view():
            v = measure_view(a.trace, cached=False)
            if "findings" not in v:
                raise SystemExit(f"view failed: {v.get('error')}")
            return v["findings"], v.get("peak_rss_mb", float("nan"))

        ana = runs([a.trace], lambda: analyze(a.trace))
        shown = runs([a.trace], view)
        load = os.getloadavg()[0]
        if base is not None:
            rows.append(("json.load", size, *base))
        rows.append(("analyze (cold, --no-cache)", size, *ana))
        rows.append(("view: findings on screen", size, *shown))
        if base is not None:
            ok.append((f"analyze ≤ 0.1× json.load: {ana[0] / base[0]:.3f}×", ana[0] <= 0.1 * base[0]))
        ok.append((f"analyze peak RSS ≤ 0.5× the file: {ana[1] / size:.2f}×", ana[1] <= 0.5 * size))
        ok.append((f"view findings ≤ 1.2× analyze: {shown[0] / ana[0]:.2f}×", shown[0] <= 1.2 * ana[0]))
        if job_files:
            job_gb = sum(f.stat().st_size for f in job_files) / 1e9
            start, reading = job_floor(py, job_files, env)
            floors.append(f"the interpreter's start with the analysis's imports {start:.2f} s; reading the "
                          f"{len(job_files)} ranks alone, one after the other {reading:.2f} s")
            for jobs in (1, 2):
                r = runs(job_files, lambda jobs=jobs: analyze(a.job, "-j", jobs))
                floor = (start + reading / jobs) / job_gb
                rows.append((f"analyze {a.job.name} -j {jobs} ({r[0] / job_gb:.1f} s/GB; reading alone "
                             f"{floor:.1f} s/GB)", job_gb * 1e3, *r))
                ok.append((f"{a.job.name} -j {jobs} ≤ 3 s/GB: {r[0] / job_gb:.1f} s/GB (start and reading "
                           f"alone: {floor:.1f} s/GB)", r[0] / job_gb <= 3.0))
    print(f"load average {load:.2f} on {os.cpu_count()} CPUs (after the single-trace runs)"
          + (f"; medians of {a.repeat} runs" if a.repeat > 1 else ""))
    print("| run | MB | wall s | range s | peak RSS MB |\n|---|---:|---:|---:|---:|")
    for name, mb, wall, rss, spread in rows:
        print(f"| {name} | {mb:,.0f} | {wall:.2f} | {spread} | {rss:,.0f} |")
    for text, met in ok:
        print(f"{'met    ' if met else 'NOT met'}  {text}")
    for text in floors:
        print(f"job floor: {text}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

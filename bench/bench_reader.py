#!/usr/bin/env python3
"""The reader's targets, measured side by side in one run (ratios are what count on a shared machine):

    python bench/bench_reader.py [--trace bench/data/resnet30.json] [--job bench/data/job16]

1. `json.load` of the big trace, then `gpuadvise analyze TRACE --format json --no-cache` (cold: no model
   cache): wall time and peak RSS of each, in fresh processes (bench_analyze.measure).
   Target: analyze ≤ 0.1× json.load's time, peak RSS ≤ 0.5× the file.
2. `gpuadvise analyze JOB_DIR --no-cache` with `-j 1` and `-j 2`: seconds per GB of traces. Target ≤ 3 s/GB.
3. `gpuadvise view TRACE`, uncached: the time until the findings screen is drawn (bench_view.measure).
   Target: within 1.2× analyze's time.

Make the inputs first: the trace with `python bench/grow_trace.py SRC bench/data/resnet30.json --size-mb 970`
(SRC: the ResNet-50 V100 sample, kineto/tb_plugin/samples/resnet50_num_workers_0/…, ×32), the job with
`python bench/make_job.py bench/data/job16 --ranks 16`. The machine's load (`os.getloadavg`) is printed
beside the numbers. Not a test: it prints a table and whether each target is met.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import JSON_LOAD, measure, warm_page_cache  # noqa: E402  (sibling scripts)
from bench_view import measure as measure_view  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", type=Path, default=REPO / "bench/data/resnet30.json")
    p.add_argument("--job", type=Path, default=REPO / "bench/data/job16")
    p.add_argument("--skip-json-load", action="store_true", help="leave out json.load (needs ~3× the file in RAM)")
    a = p.parse_args()
    py = sys.executable
    env = {"GPUADVISE_NO_CACHE": "1", "OMP_NUM_THREADS": "1"}
    rows, ok = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        size = a.trace.stat().st_size / 1e6
        warm_page_cache(a.trace)
        base = None if a.skip_json_load else measure([py, "-c", JSON_LOAD, str(a.trace)], env)
        ana = measure([py, "-m", "gpuadvise", "analyze", str(a.trace), "--format", "json", "--no-cache", "-o", out], env)
        view = measure_view(a.trace, cached=False)
        load = os.getloadavg()[0]
        if base is not None:
            rows.append(("json.load", size, base.wall_s, base.peak_rss_mb))
        rows.append(("analyze (cold, --no-cache)", size, ana.wall_s, ana.peak_rss_mb))
        if "findings" in view:
            rows.append(("view: findings on screen", size, view["findings"], view.get("peak_rss_mb", float("nan"))))
        if base is not None:
            ok.append((f"analyze ≤ 0.1× json.load: {ana.wall_s / base.wall_s:.2f}×", ana.wall_s <= 0.1 * base.wall_s))
        ok.append((f"analyze peak RSS ≤ 0.5× the file: {ana.peak_rss_mb / size:.2f}×", ana.peak_rss_mb <= 0.5 * size))
        if "findings" in view:
            ok.append((f"view findings ≤ 1.2× analyze: {view['findings'] / ana.wall_s:.2f}×", view["findings"] <= 1.2 * ana.wall_s))
        else:
            ok.append((f"view failed: {view.get('error')}", False))
        if a.job.is_dir():
            job_gb = sum(f.stat().st_size for f in a.job.iterdir() if f.is_file()) / 1e9
            for f in a.job.iterdir():
                warm_page_cache(f)
            for jobs in (1, 2):
                r = measure([py, "-m", "gpuadvise", "analyze", str(a.job), "--format", "json", "--no-cache", "-j",
                             str(jobs), "-o", out], env)
                rows.append((f"analyze {a.job.name} -j {jobs} ({r.wall_s / job_gb:.1f} s/GB)", job_gb * 1e3, r.wall_s,
                             r.peak_rss_mb))
                ok.append((f"{a.job.name} -j {jobs} ≤ 3 s/GB: {r.wall_s / job_gb:.1f} s/GB", r.wall_s / job_gb <= 3.0))
    print(f"load average {load:.2f} on {os.cpu_count()} CPUs (after the single-trace runs)")
    print("| run | MB | wall s | peak RSS MB |\n|---|---:|---:|---:|")
    for name, mb, wall, rss in rows:
        print(f"| {name} | {mb:,.0f} | {wall:.2f} | {rss:,.0f} |")
    for text, met in ok:
        print(f"{'met    ' if met else 'NOT met'}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What analysis costs, this checkout against an earlier commit, side by side in one run:

    python bench/bench_analysis.py [--before main] [--job bench/data/job16] [--corpus] [--repeat 2]

1. The job (a folder of rank traces, `bench/make_job.py`): `gpuadvise analyze JOB --format json --no-cache
   -j 1` and `-j 2`, each in a fresh process (bench_analyze.measure), the two versions taking turns, the
   fastest of `--repeat` runs kept: wall seconds, seconds per GB of traces (the issue's target: ≤ 3 s/GB)
   and the ratio after/before. The two versions' JSON reports of the job are compared byte for byte.
2. With `--corpus`: `bench/profile_rules.py --corpus` under each version: CPU seconds of analysing every
   trace of ../shared/traces, in all and per piece (read, metrics, rules with their lazy measures).

The earlier commit is exported with `git archive` into a temporary folder laid out as the installed package
(`gpuadvise/`, with `analyzer/`, `rules/` and `fixtures/` inside it), and each side runs with its own
folder first on PYTHONPATH, from a working folder of its own (`python -m gpuadvise` run in this checkout
would import the checkout's code whatever PYTHONPATH says). The machine's load is printed beside the numbers.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import measure, warm_page_cache  # noqa: E402  (sibling script)

REPO = Path(__file__).resolve().parent.parent
PARTS = ("analyzer", "rules", "fixtures")  # top-level folders the package installs inside gpuadvise/


def layout(src: Path, out: Path) -> Path:
    """`out`, holding gpuadvise/ as installed (pyproject's package-dir), made of links into `src`."""
    pkg = out / "gpuadvise"
    pkg.mkdir(parents=True)
    for entry in (src / "gpuadvise").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for part in PARTS:
        (pkg / part).symlink_to(src / part)
    return out


def export(rev: str, out: Path) -> Path:
    """The tree of commit `rev`, written to `out` (git archive)."""
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", default="main", help="the commit to compare with (default: main)")
    p.add_argument("--job", type=Path, default=REPO / "bench/data/job16")
    p.add_argument("--corpus", action="store_true", help="also the corpus sweep's CPU seconds")
    p.add_argument("--repeat", type=int, default=2, help="runs of each job measurement; the fastest is kept")
    a = p.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sides = {"before": layout(export(a.before, tmp / "src"), tmp / "before"), "after": layout(REPO, tmp / "after")}
        work = tmp / "work"
        work.mkdir()
        os.chdir(work)  # `python -m gpuadvise` looks in its working folder first: never this checkout
        env = {side: {"PYTHONPATH": str(path), "GPUADVISE_NO_CACHE": "1", "OMP_NUM_THREADS": "1"}
               for side, path in sides.items()}
        check = [py, "-c", "import gpuadvise.analyzer.measure.basics.metrics as m; print(m.__file__)"]
        for side in sides:  # each side imports its own code
            where = subprocess.run(check, cwd=work, env={**os.environ, **env[side]}, capture_output=True, text=True,
                                   check=True).stdout.strip()
            print(f"{side}: {where}")
        if a.job.is_dir():
            files = [f for f in a.job.iterdir() if f.is_file()]
            gb = sum(f.stat().st_size for f in files) / 1e9
            for f in files:
                warm_page_cache(f)
            print(f"\njob {a.job} ({len(files)} files, {gb * 1e3:.0f} MB), best of {a.repeat}")
            print("| -j | before s | after s | before s/GB | after s/GB | after/before |\n|---:|---:|---:|---:|---:|---:|")
            met = []
            for jobs in (1, 2):
                best = {side: float("inf") for side in sides}
                for _ in range(a.repeat):
                    for side in sides:
                        out = work / f"{side}.json"
                        r = measure([py, "-m", "gpuadvise", "analyze", str(a.job), "--format", "json", "--no-cache",
                                     "-j", str(jobs), "-o", str(out)], env[side])
                        if r.rc not in (0, 1):
                            sys.exit(f"{side} -j {jobs} exited {r.rc}: {r.stderr[-2000:]}")
                        best[side] = min(best[side], r.wall_s)
                b, t = best["before"], best["after"]
                print(f"| {jobs} | {b:.2f} | {t:.2f} | {b / gb:.1f} | {t / gb:.1f} | {t / b:.2f} |")
                met.append((f"-j {jobs} ≤ 3 s/GB: {t / gb:.1f} s/GB", t / gb <= 3.0))
            same = (work / "before.json").read_bytes() == (work / "after.json").read_bytes()
            print(f"job reports byte-identical: {same}")
            for text, ok in met:
                print(f"{'met    ' if ok else 'NOT met'}  {text}")
        if a.corpus:
            print()
            for side in sides:
                res = subprocess.run([py, str(REPO / "bench/profile_rules.py"), "--corpus", "--top", "12"], cwd=work,
                                     env={**os.environ, **env[side]}, capture_output=True, text=True)
                if res.returncode:
                    sys.exit(f"{side} corpus sweep failed: {res.stderr[-2000:]}")
                head = res.stdout.splitlines()
                print(f"{side}: " + "\n".join(head))
        os.chdir(REPO)
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

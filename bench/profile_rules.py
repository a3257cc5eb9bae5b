#!/usr/bin/env python3
"""Where the analysis of a trace goes, rule by rule and metric by metric:

    python bench/profile_rules.py FILE_OR_DIR [...]     # each trace file (a folder: its *.json[.gz] files)
    python bench/profile_rules.py --corpus              # every trace of ../shared/traces (snapshots left out)
    python bench/profile_rules.py FILE --cprofile 25    # and the 25 functions with the most own time
    python bench/profile_rules.py --job DIR -j 1        # a job folder analysed as one job (all its ranks)

Runs `gpuadvise analyze F --format json --no-cache -o <tmp>` for each file in this process, with timers
around the pipeline's pieces, and prints CPU seconds (`time.process_time`) per piece, summed over the files:

- `read`: the reader (load_trace), whole;
- `metrics:<step>`: each step of measure.compute (launch_stats, copy_table, sync_table, per_step_table, …);
- `lazy:<name>`: the Analysis's lazy measures (replay, calibration, collectives, compiled, …) and
  `predicted_saving`, paid by whichever rule asks first;
- `rule:<name>`: each rule's `check`, without the lazy measures and metric steps it pulls;
- `engine:<step>`: what run_rules does around the rules (a job's per-rank saving, ranges, fixes);
- `memory`, `figures`, `report` (rendering and writing the JSON, with everything not listed above).

Times are exclusive: a piece's time leaves out the listed pieces it calls. The total is the CPU time of
all `analyze` calls. A bench, not a test: the numbers depend on the machine's load (printed with them).
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the corpus list; gpuadvise itself as installed (or on PYTHONPATH)

SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
_STACK: list[list[float]] = []  # per open timer: [children's time]


def _timed(fn, label: str):
    def wrapper(*a, **kw):
        _STACK.append([0.0])
        t0 = time.process_time()
        try:
            return fn(*a, **kw)
        finally:
            spent = time.process_time() - t0
            children = _STACK.pop()[0]
            SPENT[label] += spent - children
            CALLS[label] += 1
            if _STACK:
                _STACK[-1][0] += spent
    wrapper.__wrapped__ = fn
    return wrapper


def _replace_everywhere(original, wrapped) -> None:
    """Point every loaded gpuadvise module's name for `original` at `wrapped` (`from x import f` copies)."""
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("gpuadvise"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, wrapped)


def instrument() -> None:
    from functools import cached_property

    from gpuadvise.analyzer.measure import analysis, memory
    from gpuadvise.analyzer.measure.basics import metrics
    from gpuadvise.analyzer.read import loader
    from gpuadvise.analyzer.run import figures, single
    from gpuadvise.rules import all_rules

    for rule in all_rules():
        rule.check = _timed(rule.check, f"rule:{rule.name}")
    for attr, value in list(vars(analysis.Analysis).items()):
        if isinstance(value, cached_property):
            prop = cached_property(_timed(value.func, f"lazy:{attr.lstrip('_')}"))
            prop.__set_name__(analysis.Analysis, attr)
            setattr(analysis.Analysis, attr, prop)
    analysis.Analysis.predicted_saving = _timed(analysis.Analysis.predicted_saving, "lazy:predicted_saving")
    steps = ("compile_work", "launch_stats", "find_steps", "gpu_timeline", "trace_window", "dataloader_spans",
             "copy_table", "sync_table", "per_step_table", "temporal_breakdown", "idle_breakdown", "kernel_table",
             "op_table", "copy_summary", "launch_thread", "plan")
    for step in steps:
        fn = getattr(metrics, step)
        _replace_everywhere(fn, _timed(fn, f"metrics:{step}"))
    metrics.phases.apply = _timed(metrics.phases.apply, "metrics:phases")
    for name in ("_for_every_rank", "_place_ranges", "_fix_from_what_is_off"):
        setattr(single, name, _timed(getattr(single, name), f"engine:{name.strip('_')}"))
    _replace_everywhere(loader.load_trace, _timed(loader.load_trace, "read"))
    _replace_everywhere(memory.summarize, _timed(memory.summarize, "memory"))
    _replace_everywhere(figures.trace_figures, _timed(figures.trace_figures, "figures"))


def trace_files(args: list[str], corpus: bool) -> list[Path]:
    files: list[Path] = []
    if corpus:
        from _corpus_support import TRACES, corpus_files

        files += [TRACES / rel for rel in corpus_files() if not rel.endswith((".pickle", ".pkl"))]
    for a in map(Path, args):
        files += sorted(p for p in a.iterdir() if p.name.endswith((".json", ".json.gz"))) if a.is_dir() else [a]
    return files


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*")
    p.add_argument("--corpus", action="store_true", help="every trace of the shared corpus")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="also print the N functions with most own time")
    p.add_argument("--top", type=int, default=30, help="pieces to print (default 30)")
    p.add_argument("--workers", type=int, default=1, help="the reader's processes (default 1)")
    p.add_argument("--job", type=Path, help="a job folder, analysed as one job (`analyze DIR -j N`)")
    p.add_argument("-j", type=int, default=1, help="with --job: ranks analysed at once (default 1: all in this "
                   "process, so every rank's pieces are timed)")
    a = p.parse_args()
    os.environ["GPUADVISE_LOAD_WORKERS"] = str(a.workers)
    files = [a.job] if a.job else trace_files(a.paths, a.corpus)
    if not files:
        sys.exit("no trace files given (paths, or --corpus with ../shared/traces present)")
    instrument()
    from gpuadvise.cli import main as cli

    prof = cProfile.Profile() if a.cprofile else None
    total = 0.0
    size = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            size += sum(p.stat().st_size for p in f.iterdir() if p.is_file()) if f.is_dir() else f.stat().st_size
            t0 = time.process_time()
            if prof:
                prof.enable()
            jobs = ["-j", str(a.j)] if a.job else []
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                cli(["analyze", str(f), "--format", "json", "--no-cache", *jobs, "-o", str(Path(tmp) / "r.json")])
            if prof:
                prof.disable()
            total += time.process_time() - t0
    SPENT["report"] = total - sum(SPENT.values())
    analysis = sum(v for k, v in SPENT.items() if k.split(":")[0] in ("metrics", "lazy", "rule", "engine"))
    rules = sum(v for k, v in SPENT.items() if k.startswith(("rule:", "lazy:", "engine:")))
    what = f"job {a.job.name} (-j {a.j})" if a.job else f"{len(files)} trace(s)"
    print(f"{what}, {size / 1e6:.0f} MB, load {os.getloadavg()[0]:.2f}: CPU {total:.2f} s in all, "
          f"read {SPENT['read']:.2f} s, metrics {analysis - rules:.2f} s, rules with their lazy measures {rules:.2f} s")
    for label, spent in sorted(SPENT.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {label:<36} {spent:8.3f} s  {spent / total:6.1%}  ({CALLS.get(label, 0)} calls)")
    if prof:
        print()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(a.cprofile)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

"""`gpuadvise analyze PATH…`: analyse traces, rank folders, run folders or snapshots and write a report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuadvise.analyzer.errors import EXIT_GATE, EXIT_OK
from gpuadvise.analyzer.report import formats
from gpuadvise.analyzer.read.sources import refuse_overwriting_inputs, resolve
from gpuadvise.analyzer.report.output import check_writable, write_atomic

from . import ranks
from .gate import describe, matching, parse_fail_on


def build_parser() -> argparse.ArgumentParser:
    a = argparse.ArgumentParser(
        prog="gpuadvise analyze",
        description="Analyse torch.profiler traces (.json/.json.gz), folders of them, or a `gpuadvise profile` run folder.")
    a.add_argument("paths", nargs="+", metavar="PATH")
    a.add_argument("--format", "-f", choices=formats.CHOICES,
                   help="report format (default: from -o's extension, else text)")
    a.add_argument("-o", "--output", metavar="FILE",
                   help="write the report here instead of stdout (markdown: with its charts beside it, FILE-*.svg)")
    a.add_argument("--perfetto", metavar="OUT.json",
                   help="also write the trace with a 'gpuadvise' track: one slice per finding over its evidence "
                        "(open it in https://ui.perfetto.dev or chrome://tracing)")
    a.add_argument("--fail-on", metavar="SEVERITY|TOPIC[,…]",
                   help="exit 1 when a finding of this severity or worse (high, medium, low, info), or of this "
                        "topic or rule, is reported (for CI)")
    a.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    a.add_argument("--top", type=int, default=5, help="findings shown in text format (default 5)")
    a.add_argument("--no-cache", action="store_true", help="parse the traces again instead of using the cached model")
    a.add_argument("-j", "--jobs", type=_positive_int, metavar="N",
                   help="ranks analysed in parallel worker processes (default: as many as CPUs and memory allow; "
                        "1: one after the other in this process)")
    a.add_argument("--scheduler", metavar="ADDRESS",
                   help="analyse the ranks on this dask.distributed scheduler (tcp://host:8786); its workers must "
                        "see the traces at the same paths (needs the dask extra)")
    return a


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of workers ≥ 1, got {text!r}")
    return n


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    fmt = formats.choose(args.format, args.output).name  # an unknown -o extension fails before the analysis
    fail_on = parse_fail_on(args.fail_on)  # a wrong value fails before minutes of analysis
    for target in (args.output, args.perfetto):
        if target:
            check_writable(Path(target))
            refuse_overwriting_inputs(Path(target), args.paths)
    show = not args.quiet and sys.stderr.isatty()

    bar = _ProgressLine() if show else None

    def progress(i, n, src):
        if bar:
            bar.start(f"{src.path}" + (f" ({i + 1}/{n})" if n > 1 else ""))

    sources = resolve(args.paths)  # bad paths fail here, before anything is imported or started
    # a job's worker processes start now, their imports beside this process' own (the analysis below)
    ranks.start_early(sources, args.jobs, args.scheduler)
    from gpuadvise.analyzer.model.report import all_findings
    from .engine import analyze_paths

    try:
        reports = analyze_paths(sources, progress=progress, bytes_progress=bar.update if bar else None,
                                jobs=args.jobs, scheduler=args.scheduler, rank_progress=bar.ranks if bar else None,
                                cache=False if args.no_cache else None)
    finally:
        if bar:
            bar.clear()
    if args.output:
        out = Path(args.output)
        for path, text in formats.files(reports, fmt, out, top=args.top):  # charts first, the report last
            write_atomic(path, text)
        if show:
            print(f"gpuadvise: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(formats.render(reports, fmt, top=args.top))
    if args.perfetto:
        from .perfetto import write_perfetto

        write_perfetto(reports, Path(args.perfetto))
        if show:
            print(f"gpuadvise: wrote {args.perfetto}", file=sys.stderr)
    if fail_on:
        hits = matching([f.to_dict() for f in all_findings(reports)], fail_on)
        if hits:
            print(f"gpuadvise: --fail-on {fail_on.text}: {len(hits)} finding{'s' if len(hits) != 1 else ''} "
                  f"({describe(hits)})", file=sys.stderr)
            return EXIT_GATE
    return EXIT_OK


class _ProgressLine:
    """One self-overwriting stderr line while a big trace is decoded: percent and MB/s."""

    def __init__(self):
        import time

        self.time = time.monotonic
        self.label, self.t0, self.last, self.shown = "", 0.0, 0.0, False
        self.created = self.time()

    def start(self, label: str) -> None:
        self.label, self.t0, self.last = label, self.time(), 0.0

    def ranks(self, done: int, total: int, nbytes: int) -> None:
        """Ranks analysed in parallel: how many are done, and the MB/s of trace files they covered."""
        now = self.time()
        self.shown = True
        rate = nbytes / max(now - self.created, 1e-9) / 1e6
        sys.stderr.write(f"\r\x1b[Kgpuadvise: ranks {done}/{total} done ({nbytes / 1e6:.0f} MB, {rate:.0f} MB/s)")
        sys.stderr.flush()

    def update(self, done: int, total: int) -> None:
        now = self.time()
        if now - self.last < 0.2 or now - self.t0 < 0.5:  # quiet for small traces, ≤5 redraws a second
            return
        self.last, self.shown = now, True
        rate = done / max(now - self.t0, 1e-9) / 1e6
        sys.stderr.write(f"\r\x1b[Kgpuadvise: reading {self.label}: {100 * done / max(total, 1):.0f}% ({rate:.0f} MB/s)")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

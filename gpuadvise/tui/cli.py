"""`gpuadvise view PATH…`: check the paths, then run the TUI. Exit codes follow `gpuadvise analyze`:
0 success, 2 bad input (one line on stderr), 3 internal error."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys

from gpuadvise.analyzer.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, InputError

from .ahead import start_analysis


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuadvise view",
        description="Browse the findings, steps, timeline, kernels, copies and memory of a trace in the terminal.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a trace (.json/.json.gz), a folder of per-rank traces, a run folder or a memory snapshot")
    p.add_argument("--compare", action="store_true",
                   help="two runs side by side: PATH… is BEFORE AFTER (what `gpuadvise compare` reports)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from gpuadvise.analyzer import run as analysis

        if args.compare and len(args.paths) != 2:
            raise InputError(None, f"--compare takes two runs, BEFORE and AFTER; got {len(args.paths)} path"
                                   f"{'s' if len(args.paths) != 1 else ''}")
        sources = analysis.resolve_inputs(args.paths)  # missing files fail here, in one line, before the screen is taken over
    except InputError as exc:
        print(f"gpuadvise: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    if importlib.util.find_spec("textual") is None:  # textual is an optional dependency
        from gpuadvise.analyzer.install import install_command

        print(f"gpuadvise: error: `gpuadvise view` needs textual; {install_command('tui')}", file=sys.stderr)
        return EXIT_INPUT
    # the analysis starts before the app is imported: Textual's imports run while the reader scans
    ahead = None if args.compare else start_analysis(args.paths, sources)
    try:
        from .app import GpuadviseApp
    except ImportError as exc:  # textual is there but broken
        from gpuadvise.analyzer.install import install_command

        if ahead is not None:
            ahead.cancelled.set()
        print(f"gpuadvise: error: `gpuadvise view` needs textual ({exc}); {install_command('tui')}", file=sys.stderr)
        return EXIT_INPUT
    if args.compare:
        from .compare_app import CompareApp

        app = CompareApp(paths=args.paths)
    else:
        app = GpuadviseApp(paths=args.paths, sources=sources, ahead=ahead)
    # Our own loop: asyncio.run() would join the worker thread on the way out, so quitting while a
    # 1 GB trace loads would hang until the analysis finished.
    loop = asyncio.new_event_loop()
    try:
        app.run(loop=loop)
    except Exception as exc:
        if os.environ.get("GPUADVISE_DEBUG"):
            raise
        print(f"gpuadvise: internal error: {type(exc).__name__}: {exc} (set GPUADVISE_DEBUG=1 for details)",
              file=sys.stderr)
        return EXIT_INTERNAL
    if app.failure:
        print(app.failure, file=sys.stderr)
    code = app.return_code if app.return_code is not None else EXIT_OK
    if code == 1:  # Textual's code for an exception it caught (and printed): our bug
        code = EXIT_INTERNAL
    if app.exit_code and not code:
        code = app.exit_code
    if app.loading or getattr(app, "analysing", False):
        # Quit while a big trace was still loading: the analysis thread cannot be interrupted and the
        # interpreter would wait for it at exit. Nothing is left to save, so leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    return code

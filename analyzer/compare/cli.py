"""`gpuadvise compare BEFORE AFTER`: did the fix work, as predicted, and did anything regress?

Exit codes: 0 the comparison was made (and the gate, if any, passed); 1 the gate tripped
(`--fail-on-regression`, `--fail-on`); 2 bad input (one line on stderr); 3 internal error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuadvise.analyzer.errors import EXIT_GATE, EXIT_OK, InputError

from gpuadvise.analyzer.report.formats import CHOICES as FORMATS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuadvise compare",
        description="Compare two runs (run folders, traces or folders of rank traces): step time before → after, "
                    "the findings resolved, new and still there, each resolved finding's predicted saving next to "
                    "the change measured, the kernels and ops that changed most, and what differs between the runs.",
        epilog="Exit codes: 0 compared (gate passed), 1 the gate tripped, 2 bad input, 3 internal error.")
    p.add_argument("before", metavar="BEFORE", help="the run before the change")
    p.add_argument("after", metavar="AFTER", help="the run after the change")
    p.add_argument("--format", "-f", choices=FORMATS, help="report format (default: from -o's extension, else text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the report here instead of stdout (markdown: with its charts beside it, FILE-*.svg)")
    p.add_argument("--fail-on-regression", metavar="PCT",
                   help="exit 1 when the step time got worse by more than PCT percent")
    p.add_argument("--fail-on", metavar="SEVERITY|TOPIC[,…]",
                   help="exit 1 when AFTER has a new finding of this severity or worse (high, medium, low, info), "
                        "or of this topic or rule")
    p.add_argument("-j", "--jobs", type=int, metavar="N", help="ranks analysed in parallel (as in analyze)")
    p.add_argument("--no-cache", action="store_true", help="parse the traces again instead of using the cached model")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    return p


def main(argv: list[str]) -> int:
    return run(build_parser().parse_args(argv))


def run(args) -> int:
    from gpuadvise.analyzer import run as analysis
    from gpuadvise.analyzer.report import formats
    from gpuadvise.analyzer.report.output import check_writable, write_atomic
    from gpuadvise.analyzer.run.gate import parse_fail_on, parse_regression

    from . import diff as cmp_mod
    from .gate import apply_gate
    from .load import load_side

    if args.jobs is not None and args.jobs < 1:
        raise InputError(None, f"-j/--jobs: expected a whole number of workers ≥ 1, got {args.jobs}")
    # wrong gate values fail before minutes of analysis
    fail_on = parse_fail_on(args.fail_on)
    regression = parse_regression(args.fail_on_regression)
    fmt = formats.choose(args.format, args.output).name  # an unknown -o extension fails before the analysis
    if args.output:
        check_writable(Path(args.output))
        analysis.refuse_overwriting_inputs(Path(args.output), [args.before, args.after])
    # each path resolved (and its run.json read) once: a missing or empty one fails before either side
    # is analysed, and the analysis takes the sources as they are
    inputs = [analysis.resolve_inputs([path]) for path in (args.before, args.after)]
    cache = False if args.no_cache else None
    show = not args.quiet and sys.stderr.isatty()
    sides = []
    for name, path, sources in zip(("BEFORE", "AFTER"), (args.before, args.after), inputs):
        if show:
            print(f"gpuadvise: analysing {name} {path}", file=sys.stderr)
        sides.append(load_side(sources, jobs=args.jobs, cache=cache, label=path))
    result = cmp_mod.compare(*sides)
    if fail_on or regression is not None:
        apply_gate(result, fail_on, regression)
    if args.output:
        out = Path(args.output)
        for path, text in formats.compare_files(result, fmt, out):  # charts first, the report last
            write_atomic(path, text)
        if show:
            print(f"gpuadvise: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(formats.render_compare(result, fmt))
    gate = result.get("gate")
    if gate and gate["failed"]:
        print("gpuadvise: " + "; ".join(gate["reasons"]), file=sys.stderr)  # one line, for the CI log
        return EXIT_GATE
    return EXIT_OK

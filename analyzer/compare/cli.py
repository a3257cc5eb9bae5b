"""`gpuadvise compare BEFORE AFTER`: did the fix work, as predicted, and did anything regress?

Exit codes: 0 the comparison was made (and the gate, if any, passed); 1 the gate tripped
(`--fail-on-regression`, `--fail-on`); 2 bad input (one line on stderr); 3 internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpuadvise.analyzer.errors import EXIT_GATE, EXIT_OK, InputError

FORMATS = ("text", "md", "json", "html")


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
    from gpuadvise.analyzer.read.sources import refuse_overwriting_inputs, resolve
    from gpuadvise.analyzer.report import EXTENSIONS
    from gpuadvise.analyzer.report import compare as render_compare
    from gpuadvise.analyzer.report.output import check_writable, write_atomic
    from gpuadvise.analyzer.run.gate import parse_fail_on, parse_regression

    from . import diff as cmp_mod

    if args.jobs is not None and args.jobs < 1:
        raise InputError(None, f"-j/--jobs: expected a whole number of workers ≥ 1, got {args.jobs}")
    # wrong gate values fail before minutes of analysis
    fail_on = parse_fail_on(args.fail_on)
    regression = parse_regression(args.fail_on_regression)
    fmt = args.format
    if fmt is None and args.output:
        fmt = EXTENSIONS.get(Path(args.output).suffix.lower())
    fmt = fmt or "text"
    if args.output:
        check_writable(Path(args.output))
        refuse_overwriting_inputs(Path(args.output), [args.before, args.after])
    for path in (args.before, args.after):
        resolve([path])  # a missing or empty path fails before the other side is analysed
    if args.no_cache:
        os.environ["GPUADVISE_NO_CACHE"] = "1"
    show = not args.quiet and sys.stderr.isatty()
    sides = []
    for name, path in (("BEFORE", args.before), ("AFTER", args.after)):
        if show:
            print(f"gpuadvise: analysing {name} {path}", file=sys.stderr)
        sides.append(cmp_mod.load_side(path, jobs=args.jobs))
    result = cmp_mod.compare(*sides)
    if fail_on or regression is not None:
        cmp_mod.apply_gate(result, fail_on, regression)
    if args.output:
        out = Path(args.output)
        files = render_compare.markdown_files(result, out) if fmt == "md" else [(out, render_compare.render(result, fmt))]
        for path, text in files:  # a markdown report's charts first, the report last
            write_atomic(path, text)
        if show:
            print(f"gpuadvise: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(render_compare.render(result, fmt))
    gate = result.get("gate")
    if gate and gate["failed"]:
        print("gpuadvise: " + "; ".join(gate["reasons"]), file=sys.stderr)  # one line, for the CI log
        return EXIT_GATE
    return EXIT_OK

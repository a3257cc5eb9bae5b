"""`gpuadvise doctor [--format text|json] [--workers N]`: check this machine and this torch build.

Exit codes follow the other commands: 0 when the report was printed (whatever its verdicts), 2 for bad
arguments, 3 for an internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap

from gpuadvise.version import __version__
from gpuadvise.analyzer.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK
from gpuadvise.analyzer.report.safe import terminal

from . import checks, probe

MARK = {"ok": "ok  ", "info": "info", "warn": "WARN", "bad": "BAD "}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuadvise doctor",
        description="What this machine and this torch build can do and how they are set, with a verdict per line: "
                    "versions, GPUs, TF32/cudnn.benchmark/determinism defaults, environment variables that slow "
                    "training, CPU cores for DataLoader workers, /dev/shm, Triton.")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument("--workers", type=_workers, metavar="N",
                   help="the DataLoader num_workers you plan to use: checked against the CPU cores")
    return p


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of workers ≥ 0, got {text!r}")
    return n


def report(workers: int | None = None) -> dict:
    torch, error = probe.load_torch()
    facts = probe.collect(torch, torch_error=error, free_memory=True)
    found = checks.judge(facts, workers=workers)
    return {"gpuadvise": __version__, "facts": facts, "checks": found, "summary": checks.summary(found)}


def render_text(doc: dict) -> str:
    lines = ["gpuadvise doctor: this machine and its torch build", ""]
    width = max((len(c["label"]) for c in doc["checks"]), default=10)
    for c in doc["checks"]:
        # values come from the environment (variables, device names): no escape sequence reaches the terminal
        lines.append(f"  {MARK.get(c['verdict'], c['verdict'])}  {c['label']:<{width}}  {terminal(c['value'])}")
        if c["note"]:
            lines += textwrap.wrap(terminal(c["note"]), width=100, initial_indent=" " * 10, subsequent_indent=" " * 10)
    s = doc["summary"]
    lines += ["", f"{s['ok']} ok, {s['info']} info, {s['warn']} warn, {s['bad']} bad"]
    if not doc["facts"]["gpus"]:
        lines.append("No GPU is visible to torch on this machine: the GPU checks were skipped.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else EXIT_INPUT
    try:
        doc = report(workers=args.workers)
        text = json.dumps(doc, indent=2, default=str) + "\n" if args.format == "json" else render_text(doc)
    except KeyboardInterrupt:
        print("gpuadvise: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # our bug: one line, the traceback with GPUADVISE_DEBUG
        if os.environ.get("GPUADVISE_DEBUG"):
            raise
        print(f"gpuadvise: internal error: {type(exc).__name__}: {exc} (set GPUADVISE_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_INTERNAL
    sys.stdout.write(text)
    return EXIT_OK

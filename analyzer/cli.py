"""The `gpuadvise` command line."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from gpuadvise import __version__

from .errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, InputError

FORMATS = ("text", "md", "json")
EXTENSIONS = {".md": "md", ".markdown": "md", ".json": "json", ".txt": "text"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuadvise", description="Find out why PyTorch training leaves the GPU idle, and what to change.")
    p.add_argument("--version", action="version", version=f"gpuadvise {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    a = sub.add_parser("analyze", help="analyse a trace, a folder of per-rank traces, or a run folder",
                       description="Analyse torch.profiler traces (.json/.json.gz), folders of them, or a `gpuadvise profile` run folder.")
    a.add_argument("paths", nargs="+", metavar="PATH")
    a.add_argument("--format", "-f", choices=FORMATS, help="report format (default: from -o's extension, else text)")
    a.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout")
    a.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    a.add_argument("--top", type=int, default=5, help="findings shown in text format (default 5)")
    a.add_argument("--no-cache", action="store_true", help="parse the traces again instead of using the cached model")
    a.add_argument("-j", "--jobs", type=_positive_int, metavar="N",
                   help="ranks analysed in parallel worker processes (default: as many as CPUs and memory allow; "
                        "1: one after the other in this process)")
    a.add_argument("--scheduler", metavar="ADDRESS",
                   help="analyse the ranks on this dask.distributed scheduler (tcp://host:8786); its workers must "
                        "see the traces at the same paths (pip install 'gpuadvise[dask]')")

    sub.add_parser("profile", help="run a training script under the profiler and report (gpuadvise profile -h)", add_help=False)
    sub.add_parser("view", help="browse findings and the trace in a terminal UI (gpuadvise view -h)", add_help=False)
    sub.add_parser("rules", help="list the rule catalog")
    e = sub.add_parser("explain", help="show one rule's documentation")
    e.add_argument("rule", metavar="RULE", help="rule code (GA102) or name (dataloader-stall)")
    return p


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of workers ≥ 1, got {text!r}")
    return n


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "profile":
        from gpuadvise.capture.cli import main as profile_main

        return profile_main(argv[1:])
    if argv and argv[0] == "view":
        from gpuadvise.tui.cli import main as view_main

        return view_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "analyze":
            return cmd_analyze(args)
        if args.command == "rules":
            return cmd_rules()
        if args.command == "explain":
            return cmd_explain(args.rule)
        parser.print_help()
        return EXIT_OK
    except InputError as exc:
        print(f"gpuadvise: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("gpuadvise: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # our bug: say so in one line, keep the traceback for GPUADVISE_DEBUG
        if os.environ.get("GPUADVISE_DEBUG"):
            raise
        print(f"gpuadvise: internal error: {type(exc).__name__}: {exc} (set GPUADVISE_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_INTERNAL


def cmd_analyze(args) -> int:
    from .engine import analyze_paths

    if args.no_cache:
        os.environ["GPUADVISE_NO_CACHE"] = "1"
    fmt = args.format
    if fmt is None and args.output:
        fmt = EXTENSIONS.get(Path(args.output).suffix.lower())
    fmt = fmt or "text"
    if args.output:
        _check_writable(Path(args.output))
        _refuse_overwriting_inputs(Path(args.output), args.paths)
    show = not args.quiet and sys.stderr.isatty()

    bar = _ProgressLine() if show else None

    def progress(i, n, src):
        if bar:
            bar.start(f"{src.path}" + (f" ({i + 1}/{n})" if n > 1 else ""))

    try:
        reports = analyze_paths(args.paths, progress=progress, bytes_progress=bar.update if bar else None,
                                jobs=args.jobs, scheduler=args.scheduler, rank_progress=bar.ranks if bar else None)
    finally:
        if bar:
            bar.clear()
    text = render(reports, fmt, top=args.top)
    if args.output:
        write_atomic(Path(args.output), text)
        if show:
            print(f"gpuadvise: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
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


def render(reports, fmt: str, top: int = 5) -> str:
    if fmt == "json":
        from .render_json import render as r

        return r(reports)
    if fmt == "md":
        from .render_markdown import render as r

        return r(reports)
    from .render_text import render as r

    return r(reports, top=top)


def _check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(path, "output is a folder")
    if not parent.is_dir():
        raise InputError(path, f"output folder {parent} does not exist")
    if not os.access(parent, os.W_OK) and not (path.exists() and os.access(path, os.W_OK)):
        raise InputError(path, "output is not writable")


def _refuse_overwriting_inputs(out: Path, paths: list[str]) -> None:
    """Never write the report over a file being analysed. A folder's earlier report (or any JSON that is
    not a trace) is not an input: writing `-o RUN/report.json` again replaces it."""
    if not out.exists():
        return
    from .sources import resolve

    target = out.resolve()
    for src in resolve(paths):
        if any(q is not None and q.exists() and q.resolve() == target for q in (src.path, src.snapshot)):
            raise InputError(out, "the output would overwrite an input trace; choose another -o")


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside the target, then rename: no half-written report, ever."""
    data = text.encode("utf-8")
    if path.exists() and not path.is_file():  # a device such as /dev/null or /dev/full: write in place
        try:
            with open(path, "wb") as fh:
                fh.write(data)
                fh.flush()
        except OSError as exc:
            raise InputError(path, f"cannot write: {exc.strerror or exc}") from None
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    except OSError as exc:
        raise InputError(path, f"cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InputError(path, f"cannot write: {exc.strerror or exc}") from None


def cmd_rules() -> int:
    from gpuadvise.rules import all_rules

    for r in all_rules():
        print(f"{r.code}  {r.name:<24} {r.title}")
    print("\n`gpuadvise explain CODE` shows what a rule detects, why it matters, the fix and its thresholds.")
    return EXIT_OK


def cmd_explain(key: str) -> int:
    from gpuadvise.rules import all_rules, find_rule

    rule = find_rule(key)
    if rule is None:
        known = ", ".join(r.name for r in all_rules())
        raise InputError(None, f"unknown rule {key!r}; known rules: {known}")
    print(f"{rule.code} {rule.name} (topic: {rule.topic})\n")
    print(rule.docs)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

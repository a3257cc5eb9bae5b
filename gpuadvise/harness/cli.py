"""`gpuadvise profile [options] [--] script.py [args…]` / `gpuadvise profile [options] -m module [args…]`.

The script runs in a child Python process (the bootstrap), so a crash, `os._exit` or a signal in the
training job cannot take the analysis down with it, and the profiler never touches this process. The
child inherits stdin/stdout/stderr and the working directory; this process forwards SIGTERM, waits,
exits with the child's status, and then reads the run folder to print the top findings.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .runfolder import jobfolder, layout
from .windows.triggers import signal_number

PREFIX = "gpuadvise> "


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuadvise profile",
        usage="gpuadvise profile [options] [--] script.py [args ...]\n       gpuadvise profile [options] -m module [args ...]",
        description="Run an unmodified training script under torch.profiler, write a run folder, print the top findings.",
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m does")
    p.add_argument("-o", "--output", metavar="DIR", help="run folder (default: a new ./gpuadvise-runs/<script>-<time>/)")
    p.add_argument("--force", action="store_true", help="reuse an existing run folder, replacing its files")
    # Defaults: 9 unprofiled steps before the window (step 0 is the script's setup; the median skips
    # steps 1-2 and the probe step), so run.json can tell the real step time from the recorded one.
    p.add_argument("--wait", type=int, default=10,
                   help="steps before the warm-up, timed but not profiled (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps, traced but discarded (default 2)")
    p.add_argument("--active", "--steps", dest="active", type=int, default=3, help="steps recorded (default 3)")
    p.add_argument("--stop-after-capture", action="store_true",
                   help="end the script as soon as the steps are captured (the steps before the window are "
                        "then the only unprofiled ones)")
    p.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=False,
                   help="record Python stacks (source lines in findings; slows the recorded steps; default off)")
    p.add_argument("--record-shapes", action=argparse.BooleanOptionalAction, default=False,
                   help="record every op's input shapes in the window (slows the recorded steps; default off: "
                        "matmul shapes come from the shape probe)")
    p.add_argument("--shapes-probe", action=argparse.BooleanOptionalAction, default=True,
                   help="record shapes in one separate step before the warm-up and add the matmul shapes to the "
                        "trace (default on; needs --wait 2 and --warmup 1 or more, else the window records shapes)")
    p.add_argument("--profile-memory", action=argparse.BooleanOptionalAction, default=False,
                   help="record tensor allocations in the trace (slows the recorded steps; default off)")
    p.add_argument("--memory-history", action=argparse.BooleanOptionalAction, default=True,
                   help="on a GPU, record CUDA memory history for --memory-steps steps after the window and dump "
                        "a snapshot (default on)")
    p.add_argument("--memory-steps", type=int, default=2, help="steps of CUDA memory history (default 2)")
    p.add_argument("--max-entries", type=int, default=100_000, help="memory history entries kept (default 100000)")
    long = p.add_argument_group("long runs", "record more windows while the script runs (docs/long-runs.md)")
    long.add_argument("--on-signal", action="store_true",
                      help="record a window from the next step each time the process gets the signal (--signal, "
                           "default SIGUSR2) or `gpuadvise trigger RUN` asks")
    long.add_argument("--signal", default="USR2", metavar="NAME",
                      help="the signal --on-signal listens for (default USR2; USR1 is Lightning's SLURM requeue, "
                           "USR2 submitit's)")
    long.add_argument("--when-slower", type=float, metavar="PCT",
                      help="record a window when the median of the last --slower-steps steps is PCT %% above the "
                           "early median, or on the next of steps PCT %% slower that recur every N steps")
    long.add_argument("--slower-steps", type=int, default=20, metavar="K",
                      help="steps in each median --when-slower compares (default 20)")
    long.add_argument("--every", type=int, metavar="N", help="record a window every N steps after the first")
    long.add_argument("--max-windows", type=int, default=10, metavar="N",
                      help="windows --every and --when-slower may add (default 10; signalled ones are not counted)")
    p.add_argument("--report", metavar="FILE",
                   help="also write the full report here (format from the extension: .md, .html, .json, .txt)")
    p.add_argument("--perfetto", metavar="FILE",
                   help="also write the trace with a 'gpuadvise' track of the findings (open it in Perfetto "
                        "or chrome://tracing)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary at the end")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script.py and its arguments")
    return p


def parse(argv: list[str]):
    parser = build_parser()
    # Our options end at the script: everything from the first non-option word on belongs to it.
    ours, rest = _split(argv)
    args = parser.parse_args(ours)
    if args.module:
        target = ["-m", args.module] + rest
    else:
        if not rest:
            parser.error("no script given (gpuadvise profile [options] script.py [args ...])")
        target = rest
    for name in ("wait", "warmup", "active", "memory_steps"):
        least = 1 if name in ("active", "memory_steps") else 0
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be {'at least 1' if least else 'zero or more'}")
    if args.when_slower is not None and not args.when_slower > 0:
        parser.error("--when-slower must be a percentage above 0")
    if args.slower_steps < 5:
        parser.error("--slower-steps must be at least 5")
    if args.every is not None and args.every <= args.warmup + args.active:
        parser.error(f"--every must be more than a window's --warmup + --active ({args.warmup + args.active} steps)")
    if args.max_windows < 1:
        parser.error("--max-windows must be at least 1")
    try:
        signal_number(args.signal)
    except ValueError as exc:
        parser.error(f"--signal: {exc}")
    return args, target


_VALUED = {"-o", "--output", "--report", "--perfetto", "--wait", "--warmup", "--active", "--steps", "--max-entries",
           "--memory-steps", "-m", "--signal", "--when-slower", "--slower-steps", "--every", "--max-windows"}


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    ours: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return ours, argv[i + 1:]
        if a == "-m":
            if i + 1 >= len(argv):
                return ours + [a], []
            return ours + [a, argv[i + 1]], argv[i + 2:]
        if not a.startswith("-") or a == "-":
            return ours, argv[i:]
        ours.append(a)
        if a in _VALUED and "=" not in a:
            if i + 1 < len(argv):
                ours.append(argv[i + 1])
            i += 2
            continue
        i += 1
    return ours, []


def main(argv: list[str]) -> int:
    args, target = parse(argv)
    if not args.module:
        script = Path(target[0])
        if not script.is_file():
            print(f"gpuadvise: error: {script}: no such script", file=sys.stderr)
            return 2
    report_fmt = _check_outputs(args)  # a bad --report/--perfetto path fails before the script runs
    job = jobfolder.job_env()  # under torchrun: one folder and one report for the job (runfolder/jobfolder.py)
    if args.output:
        out = Path(args.output)
    elif job is not None:
        out = jobfolder.job_run_dir(args.module or target[0])
    else:
        out = layout.new_run_dir(args.module or target[0])
    r = layout.rank()
    speaks = not args.quiet and (job is None or job.reports)  # a job's other ranks print nothing of ours
    mine = [out / layout.trace_name(r), out / layout.old_trace_name(r), out / layout.run_json_name(r)]
    if any(p.exists() for p in mine) and not args.force:
        print(f"gpuadvise: error: {out}: run folder already holds a capture; use --force to replace it or -o for another",
              file=sys.stderr)
        return 2
    if args.force:
        for p in mine + layout.later_traces(out, r) + [out / layout.snapshot_name(r), out / layout.log_name(r), out / layout.steps_name(r)]:
            if p.exists():
                p.unlink()
    made = not out.exists() or (job is not None and not args.output and _only_mark(out))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"gpuadvise: error: {out}: cannot create the run folder: {exc.strerror or exc}", file=sys.stderr)
        return 2
    started = time.time()
    run = {
        "command": ["gpuadvise", "profile"] + argv,
        "script": args.module and f"-m {args.module}" or target[0],
        "argv": target,
        "cwd": os.getcwd(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
    }
    config = {
        "out": str(out.resolve()), "wait": args.wait, "warmup": args.warmup, "active": args.active,
        "stop_after_capture": args.stop_after_capture, "with_stack": args.with_stack, "record_shapes": args.record_shapes,
        "shapes_probe": args.shapes_probe, "profile_memory": args.profile_memory, "memory_history": args.memory_history,
        "memory_steps": args.memory_steps, "max_entries": args.max_entries,
        "on_signal": args.on_signal, "signal": args.signal, "when_slower": args.when_slower,
        "slower_steps": args.slower_steps, "every": args.every, "max_windows": args.max_windows,
        "run": dict(run, launcher_pid=os.getpid()), "rank_argv": rank_argv(args, out.resolve()),
    }
    fd, config_path = tempfile.mkstemp(prefix="gpuadvise-profile-", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(config, fh)
    if speaks:
        ranks = f" on {job.world_size} ranks" if job is not None and job.world_size > 1 else ""
        print(f"{PREFIX}profiling {shlex.join(target)}{ranks} (steps: wait {args.wait}, warm-up {args.warmup}, "
              f"record {args.active}) → {out}", file=sys.stderr, flush=True)
    forward = [signal_number(args.signal)] if args.on_signal else []
    code = _run_child([sys.executable, "-m", "gpuadvise.harness.session.bootstrap", config_path] + target, forward)
    if not (out / layout.run_json_name(r)).exists():
        # the script never started (python -m found no module): leave nothing behind
        if made:
            _remove_empty(out)
        if speaks:
            print(f"{PREFIX}the script did not start (exit code {code}); no run folder written", file=sys.stderr)
        return code
    _finish_run_json(out, r, code, started)
    if job is not None:
        return _finish_job(out, job, args, report_fmt, code)
    reports = None if args.quiet else _summary(out, r)
    if (args.report or args.perfetto) and (out / layout.trace_name(r)).exists():
        _write_extras(out, args, report_fmt, reports)
    return _exit_as(code)  # a script that died by a signal: die the same way, as the unwrapped script would


def _finish_job(out: Path, job, args, report_fmt, code: int) -> int:
    """Under a launcher: the reporting rank waits for the others and prints the one report of the job;
    the other ranks print nothing (one line per other node naming its folder) and exit as their script
    did (runfolder/jobfolder.py)."""
    if not job.reports:
        if job.names_its_folder and not args.quiet:
            print(f"{PREFIX}ranks {min(job.node_ranks())}–{max(job.node_ranks())} wrote to {out} (rank 0 prints "
                  f"the report; a job on several nodes: gpuadvise analyze FOLDER FOLDER …)", file=sys.stderr)
        return _exit_as(code)
    waited = time.monotonic()
    statuses, pending = jobfolder.wait_for_ranks(out, job, code)
    waited = time.monotonic() - waited
    if not args.quiet:
        for line in jobfolder.status_lines(statuses, pending, waited if pending else None):
            print(f"{PREFIX}{line}", file=sys.stderr)
    captured = [s.rank for s in statuses if s.trace]
    if code < 0:  # stopped by a signal (the launcher ends every rank once one fails): no analysis under its deadline
        if not args.quiet:
            print(f"{PREFIX}" + (f"the traces of rank{'s' if len(captured) > 1 else ''} {', '.join(map(str, captured))} "
                                 f"are complete: gpuadvise analyze {shlex.quote(str(out))}" if captured
                                 else "no rank's trace is complete"), file=sys.stderr)
        return _exit_as(code)
    reports = None if args.quiet else _summary(out, job.rank, job=True)
    if (args.report or args.perfetto) and captured:
        _write_extras(out, args, report_fmt, reports)
    return _exit_as(code)


def _exit_as(code: int) -> int:
    """The script's own exit: its code, or the signal that killed it (as the unwrapped script would die)."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _only_mark(folder: Path) -> bool:
    try:
        return [p.name for p in folder.iterdir()] == [jobfolder.JOB_MARK]
    except OSError:
        return False


def rank_argv(args, out: Path) -> list[str]:
    """The options for `gpuadvise profile` in a process the script itself starts for another rank
    (Lightning's Trainer re-runs the script once per extra device): the same window, later windows and
    folder, no summary, no --report/--perfetto (they are this process's)."""
    argv = ["-q", "-o", str(out), "--wait", str(args.wait), "--warmup", str(args.warmup), "--active", str(args.active),
            "--memory-steps", str(args.memory_steps), "--max-entries", str(args.max_entries)]
    for name in ("with_stack", "record_shapes", "shapes_probe", "profile_memory", "memory_history"):
        argv.append(f"--{'' if getattr(args, name) else 'no-'}{name.replace('_', '-')}")
    if args.on_signal:
        argv += ["--on-signal", "--signal", args.signal]
    if args.when_slower is not None:
        argv += ["--when-slower", str(args.when_slower), "--slower-steps", str(args.slower_steps)]
    if args.every is not None:
        argv += ["--every", str(args.every)]
    argv += ["--max-windows", str(args.max_windows)]
    return argv + (["--force"] if args.force else []) + (["--stop-after-capture"] if args.stop_after_capture else [])


def _run_child(cmd: list[str], also_forward: list[int] = ()) -> int:
    """Run the child, passing on SIGTERM, SIGHUP and `also_forward` (the --on-signal signal)."""
    child = subprocess.Popen(cmd)
    forwarded = {}

    def forward(signum, frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    # Ctrl-C reaches the child directly (same process group); we only wait for it to finish.
    forwarded[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP, *also_forward):
        forwarded[sig] = signal.signal(sig, forward)
    try:
        return child.wait()
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)


def _check_outputs(args) -> str | None:
    """Check --report/--perfetto before the run (minutes of training lost to a typo otherwise)."""
    from gpuadvise.analyzer.report.output import check_writable

    fmt = None  # an InputError here is one line and exit 2 (gpuadvise.cli.run_guarded)
    if args.report:
        fmt = report_format(Path(args.report))
        check_writable(Path(args.report))
    if args.perfetto:
        check_writable(Path(args.perfetto))
    return fmt


def report_format(path: Path) -> str:
    """The report format a file name asks for (the format registry's extensions); an unknown or missing
    extension is refused, listing the known ones."""
    from gpuadvise.analyzer.errors import InputError
    from gpuadvise.analyzer.report import formats

    suffix = path.suffix.lower()
    for f in formats.REGISTRY.values():
        if suffix and suffix in f.extensions:
            return f.name
    known = ", ".join(e for f in formats.REGISTRY.values() for e in f.extensions)
    raise InputError(path, f"unknown report extension {suffix or '(none)'!r} (known: {known})")


def _write_extras(out: Path, args, fmt: str | None, reports=None) -> None:
    """--report and --perfetto: the same analysis as `gpuadvise analyze RUN -o FILE [--perfetto FILE]`
    (the summary's own analysis when there was one: a big trace is not analysed twice)."""
    from gpuadvise.analyzer.errors import InputError

    try:
        if reports is None:
            from gpuadvise.analyzer import run as analysis

            reports = analysis.analyze([str(out)])
        if args.report:
            from gpuadvise.analyzer.report import formats
            from gpuadvise.analyzer.report.output import write_atomic

            path = Path(args.report)
            for p, text in formats.files(reports, fmt, path):  # a markdown report's charts first
                write_atomic(p, text)
            if not args.quiet:
                print(f"{PREFIX}report:      {path}", file=sys.stderr)
        if args.perfetto:
            from gpuadvise.analyzer import run as analysis

            analysis.write_perfetto(reports, Path(args.perfetto))
            if not args.quiet:
                print(f"{PREFIX}timeline:    {args.perfetto} (open in https://ui.perfetto.dev or chrome://tracing)",
                      file=sys.stderr)
    except InputError as exc:
        print(f"{PREFIX}could not write it: {exc}; the run folder is intact", file=sys.stderr)
    except Exception as exc:  # the run folder is intact; `gpuadvise analyze RUN -o FILE` can redo it
        print(f"{PREFIX}writing the report failed ({type(exc).__name__}: {exc}); the run folder is intact",
              file=sys.stderr)


def _remove_empty(folder: Path) -> None:
    try:
        if _only_mark(folder):  # the job's claim on the folder (runfolder/jobfolder.py): nothing of the user's
            (folder / jobfolder.JOB_MARK).unlink()
        folder.rmdir()  # only if empty: never delete anything the user put there
        if folder.parent.name == layout.RUNS_DIR:
            folder.parent.rmdir()
    except OSError:
        pass


def no_trace_reason(run: dict, code: int) -> str:
    """What happened, in the user's terms, when a run left no trace."""
    capture = run.get("capture") or {}
    window = capture.get("window") or {}
    needed = sum(int(window.get(k) or 0) for k in ("wait", "warmup", "active"))
    need = (f"the window needs {needed} (wait {window.get('wait')} + warm-up {window.get('warmup')} + "
            f"record {window.get('active')})")
    steps = int(capture.get("steps_stepped") or 0)
    if str(capture.get("state", "")).startswith("failed"):
        return f"profiling {capture['state'][len('failed: '):]}: {capture.get('error', 'unknown error')}"
    if code in (130, -signal.SIGINT):
        return f"interrupted at step {steps}; {need}"
    if code < 0:
        return f"the script was killed by {signal.Signals(-code).name} at step {steps}; {need}"
    if code != 0 and steps == 0:
        return f"the script failed before its first step (exit code {code})"
    if code != 0:
        return f"the script failed at step {steps} (exit code {code}); {need}"
    if steps == 0:
        return ("no training step was seen (no optimizer.step(), DataLoader batch, backward() or CUDA graph "
                "replay): call gpuadvise.step() once per iteration")
    return f"the script ran {steps} steps and {need}: lower --wait/--warmup/--active"


def _finish_run_json(out: Path, r, code: int, started: float) -> None:
    path = out / layout.run_json_name(r)
    data = layout.read_json(path)
    data["exit_code"] = code
    if code < 0:
        data["exit_signal"] = signal.Signals(-code).name
    data["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    data["duration_s"] = round(time.time() - started, 3)
    capture = data.setdefault("capture", {"state": "not started: the script ended before the profiler could start"})
    if capture.get("state") in ("waiting for steps", "not started"):
        capture["state"] = "incomplete: the script ended before the window completed"
    if not (out / layout.trace_name(r)).exists():
        capture["reason"] = no_trace_reason(data, code)  # `gpuadvise analyze RUN` says the same
    try:
        layout.write_json_atomic(path, data)
    except OSError as exc:
        print(f"{PREFIX}could not write {path}: {exc}", file=sys.stderr)


def _summary(out: Path, r, job: bool = False):
    """Print the top findings (of every rank's trace in the folder for a job); returns the analysis (None
    when there was none)."""
    trace = out / layout.trace_name(r)
    run = layout.read_json(out / layout.run_json_name(r))
    status = run.get("capture", {})
    if not trace.exists() and not (job and layout.rank_traces(out)):
        _step_times_line(run.get("steps") or {})
        print(f"{PREFIX}no trace captured: {status.get('reason') or status.get('state', 'unknown')}", file=sys.stderr)
        return None
    reports = None
    try:
        from gpuadvise.analyzer import run as analysis
        from gpuadvise.analyzer.report.text import render

        reports = analysis.analyze([str(out)])
        text = render(reports, top=3, prefix=PREFIX)
    except Exception as exc:  # the run folder is intact; analysis can be rerun
        _step_times_line(run.get("steps") or {})
        print(f"{PREFIX}analysis failed ({type(exc).__name__}: {exc}); the run folder is intact", file=sys.stderr)
    else:
        # the header below states the recorded step and the profiler's overhead (from the trace, the figure the
        # analysis calibrates with): this line keeps to the unprofiled time, so the ratio is printed once
        _step_times_line(run.get("steps") or {}, recorded=not _header_has_overhead(reports))
        print(text, end="", file=sys.stderr)
    print(f"{PREFIX}full report: gpuadvise analyze {shlex.quote(str(out))} --format md", file=sys.stderr)
    print(f"{PREFIX}browse it:   gpuadvise view {shlex.quote(str(out))}", file=sys.stderr)
    return reports


def _steps(n) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _header_has_overhead(reports) -> bool:
    return any(getattr(getattr(t, "figures", None), "profiler_overhead_x", None) is not None for t in reports or [])


def _step_times_line(steps: dict, recorded: bool = True) -> None:
    """One line: the real step time, and (`recorded`: when no report header states it) the recorded one
    next to it, so the user knows how far the trace is off."""
    u, p, x = steps.get("unprofiled_median_ms"), steps.get("profiled_median_ms"), steps.get("overhead_x")
    if u is None:
        return
    clock = "GPU" if steps.get("clock") == "cuda_event" else "wall"
    line = f"{PREFIX}step time ({clock} clock): {u:.2f} ms unprofiled (median of {_steps(steps.get('unprofiled_n'))})"
    if recorded and p is not None and x is not None:
        line += f", {p:.2f} ms while recorded ({x:.2f}× the unprofiled step)"
    print(line, file=sys.stderr)

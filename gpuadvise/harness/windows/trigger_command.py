"""`gpuadvise trigger RUN [--file] [--wait SECONDS]`: ask a running `gpuadvise profile --on-signal` job for a
window now, by its run folder (no hunting for pids).

It reads the run folder's run.json (run.rankN.json under torchrun): which signal the job listens for and
the pid and host of each training process. It signals the lowest rank running on this machine; that rank
writes the request into the run folder and every rank records the same steps (requests.py). Where no
process can be signalled (another machine, `--file`, a platform without the signal) it writes the
request itself: the first rank that reads it picks the step. `--wait` waits until the window is written.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from gpuadvise.analyzer.errors import InputError

from ..runfolder import layout
from . import requests

PREFIX = "gpuadvise> "


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuadvise trigger",
                                description="Ask a running `gpuadvise profile --on-signal` job to record a window now.")
    p.add_argument("run", metavar="RUN", help="the job's run folder")
    p.add_argument("--file", action="store_true",
                   help="write the request into the run folder instead of signalling (another machine, no signals)")
    p.add_argument("--wait", type=float, metavar="SECONDS",
                   help="wait up to SECONDS for the window to be written, and say where it is")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    run = Path(args.run)
    records = _records(run)
    live = [r for r in records if "exit_code" not in r and "script_exit_code" not in r]
    if not live:
        code = records[0].get("exit_code", records[0].get("script_exit_code"))
        raise InputError(run, f"the run has ended (exit code {code}): there is nothing left to record")
    triggers = (live[0].get("capture") or {}).get("triggers") or {}
    name = triggers.get("on_signal")
    if not name:
        raise InputError(run, "the run was not started with --on-signal, so it does not listen for requests "
                              "(gpuadvise profile --on-signal …)")
    before = _captured(run)
    target = None if args.file else _signal_target(live)
    if target is not None:
        rank, pid = target
        try:
            os.kill(pid, signal.Signals[name])
        except (OSError, KeyError) as exc:
            raise InputError(run, f"cannot signal pid {pid} ({exc}); use --file") from None
        who = f"rank {rank} (pid {pid})" if rank is not None else f"pid {pid}"
        print(f"{PREFIX}sent {name} to {who}: every rank records a window from a few steps on", file=sys.stderr)
    else:
        requests.append(run, {"id": requests.new_id(), "step": None, "trigger": "trigger file",
                              "detail": f"gpuadvise trigger on {socket.gethostname()}", "by": "gpuadvise trigger",
                              "at": round(time.time(), 3)})
        print(f"{PREFIX}wrote a request into {run / requests.REQUESTS}: the first rank to read it (within "
              f"{requests.POLL_EVERY} steps) picks the step every rank records", file=sys.stderr)
    if args.wait is None:
        return 0
    return _wait(run, before, args.wait)


def _records(run: Path) -> list[dict]:
    if not run.is_dir():
        raise InputError(run, "no such run folder")
    records = []
    for p in sorted(run.glob("run*.json")):
        if p.name == layout.run_json_name(None) or p.name.startswith("run.rank"):
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError) as exc:
                raise InputError(p, f"unreadable: {exc}") from None
            if isinstance(data, dict):
                records.append(data)
    if not records:
        raise InputError(run, "no run.json: not a run folder of `gpuadvise profile`")
    records.sort(key=lambda r: r.get("rank") if isinstance(r.get("rank"), int) else -1)
    return records


def _signal_target(records: list[dict]) -> tuple[int | None, int] | None:
    """The lowest rank running on this machine, as (rank, pid); None when none can be signalled."""
    host = socket.gethostname()
    for r in records:
        pid = r.get("pid")
        if r.get("hostname") != host or not isinstance(pid, int):
            continue
        try:
            os.kill(pid, 0)
        except OSError:
            continue
        return r.get("rank"), pid
    return None


def _captured(run: Path) -> set[tuple]:
    """(rank, window) pairs written so far."""
    out = set()
    for p in run.glob("run*.json"):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        for w in (data.get("capture") or {}).get("windows") or []:
            if isinstance(w, dict) and w.get("state") == "captured":
                out.add((data.get("rank"), w.get("index"), w.get("trace")))
    return out


def _wait(run: Path, before: set, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        new = sorted((t for t in _captured(run) - before if (t[1] or 0) > 1),
                     key=lambda t: (t[0] if t[0] is not None else -1, t[1]))
        if new:
            for rank, index, trace in new:
                print(f"{PREFIX}captured window {index}" + (f" on rank {rank}" if rank is not None else "")
                      + f" → {run / str(trace)}", file=sys.stderr)
            return 0
        time.sleep(0.2)
    print(f"{PREFIX}no window written within {seconds:g} s (the job writes one when its steps are recorded; "
          f"check {run / layout.run_json_name(None)})", file=sys.stderr)
    return 1

"""The `profile` tool: `gpuadvise profile` on a script in the server's working folder, as its own
process (the user's script must never write to the server's stdout, which is the protocol's wire, nor
take the server down). Its output lines become progress messages, and the last of them come back with
the result; a cancelled call ends it, the training script included (its process group)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import anyio

from gpuadvise.analyzer.errors import InputError
from gpuadvise.harness.runfolder.layout import new_run_dir

log = logging.getLogger("gpuadvise.mcp")

TAIL_LINES = 30  # the last lines of the run's output returned with the result
STOP_GRACE_S = 5.0  # after SIGTERM, before SIGKILL


def script_in_working_folder(script: str) -> Path:
    """The script the user named, which must be a file inside the working folder (where the server was
    started): the tool runs nothing else."""
    here = Path.cwd().resolve()
    path = (here / script).resolve()
    if not path.is_file():
        raise InputError(script, "no such script")
    if here != path and here not in path.parents:
        raise InputError(script, f"not inside the working folder {here}: the profile tool runs only scripts there")
    return path


def command(script: Path, args: list[str], out: Path, steps: int, wait: int | None, warmup: int | None,
            stop_after_capture: bool, with_stack: bool) -> list[str]:
    """The `gpuadvise profile` command line: quiet (the server analyses the run folder itself), into `out`."""
    cmd = [sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", str(out), "--active", str(steps)]
    if wait is not None:
        cmd += ["--wait", str(wait)]
    if warmup is not None:
        cmd += ["--warmup", str(warmup)]
    if stop_after_capture:
        cmd.append("--stop-after-capture")
    if with_stack:
        cmd.append("--with-stack")
    return cmd + ["--", str(script.relative_to(Path.cwd().resolve())), *args]


async def profile(script: Path, args: list[str], options: dict, report) -> dict:
    """Run `gpuadvise profile` and wait for it; `report(elapsed_s, line)` follows its output. Returns the
    run folder, the exit code and the output's last lines."""
    out = new_run_dir(script.name)
    cmd = command(script, args, out, **options)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    started = time.monotonic()
    log.info("running gpuadvise %s", " ".join(cmd[3:]))
    process = await anyio.open_process(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       cwd=os.getcwd(), start_new_session=True)
    try:
        pending = b""
        async for chunk in process.stdout:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                tail.append(line)
                await report(time.monotonic() - started, line[:200])
        if pending:
            tail.append(pending.decode("utf-8", "replace"))
        code = await process.wait()
    except BaseException as exc:  # the call was cancelled (or the server is going): the run goes with it
        with anyio.CancelScope(shield=True):
            await _stop(process)
        why = "the call was cancelled" if isinstance(exc, anyio.get_cancelled_exc_class()) else type(exc).__name__
        log.info("stopped profiling %s: %s", script.name, why)
        raise
    return {"run_folder": str(out), "exit_code": code, "seconds": round(time.monotonic() - started, 1),
            "output_tail": list(tail)}


async def _stop(process) -> None:
    """End the profile and the script it runs (one process group): SIGTERM, a grace period for the
    profile to exit, then SIGKILL to whatever of the group is left."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with anyio.move_on_after(STOP_GRACE_S):
        await process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    await process.wait()

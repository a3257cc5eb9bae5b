"""A job, not a rank: `gpuadvise profile` under torchrun (or any launcher that sets RANK / WORLD_SIZE /
LOCAL_RANK) writes one run folder for the job and prints one report.

- Every rank runs the same `gpuadvise profile` command and counts the same steps (SPMD), so every
  rank records the same step numbers; each writes its own trace, run.json and snapshot
  (`trace.rank3.pt.trace.json.gz`, layout.py).
- The folder: `-o DIR` (all ranks, all nodes if DIR is on a shared filesystem), else one folder per node,
  chosen by every rank of the node alike (`job_run_dir`) without talking to the others: the candidates are
  the same on every rank, and the first rank to claim one writes the job's id into it (an exclusive
  create), so the node's other ranks join it and another job started in the same second moves on.
- One report: the rank that reports (global rank 0) waits, after its own script ended, until every rank
  of its folder has finished (its run.json has an exit code), at most `GPUADVISE_JOB_WAIT` seconds
  (default 60), then analyses the folder once. The other ranks print nothing beyond what their script
  prints, except one line on each other node naming its folder. Ranks wait for nothing: a rank that
  died never holds the job up.
- A rank that failed is named: the report says which rank failed, how (exit code, signal) and at
  which step, and whether its capture is complete. When the reporting rank was itself stopped by a
  signal (the launcher ends every rank once one fails) it prints that, with the command that analyses
  the folder, instead of analysing under the launcher's kill deadline; when its own script failed it does
  not wait long for ranks that may be blocked on it.
Coordination needs nothing but the run folder: no network beyond what the launcher already set up.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from . import layout

WAIT_S = 60.0  # how long the reporting rank waits for the others (GPUADVISE_JOB_WAIT)
WAIT_AFTER_OWN_FAILURE_S = 3.0  # when its own script failed, the others may be blocked on it
JOB_MARK = ".gpuadvise-job"


@dataclass(frozen=True)
class JobEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    node: int | None  # GROUP_RANK (torchrun): which node of the job

    @property
    def reports(self) -> bool:
        """Whether this rank prints the job's report."""
        return self.rank == 0

    @property
    def names_its_folder(self) -> bool:
        """The one rank of another node that says where its node's ranks wrote (rank 0 reports)."""
        return self.rank != 0 and self.local_rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size) if self.local_world_size else 1

    def node_ranks(self) -> set[int]:
        """The global ranks on this node, as torchrun numbers them (node × local world size + local rank)."""
        if not self.local_world_size:
            return {self.rank}
        first = self.rank - self.local_rank
        return set(range(first, first + self.local_world_size))


def job_env(environ=None) -> JobEnv | None:
    """The launcher's view of this process, None outside a multi-process launch."""
    env = os.environ if environ is None else environ
    rank, world = _int(env.get("RANK")), _int(env.get("WORLD_SIZE"))
    if rank is None or world is None or world < 1:
        return None
    local = _int(env.get("LOCAL_RANK"))
    return JobEnv(rank=rank, world_size=world, local_rank=local if local is not None else rank,
                  local_world_size=_int(env.get("LOCAL_WORLD_SIZE")), node=_int(env.get("GROUP_RANK")))


def _int(value) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------------
# One folder per node, without talking


def job_id() -> str:
    """The same on every rank this launcher started on this node: host, launcher process and its start."""
    ppid = os.getppid()
    return f"{socket.gethostname()}:{ppid}:{_start_ticks(ppid)}"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]  # field 22: start time, clock ticks after boot
    except (OSError, IndexError):
        return "?"


def launcher_started() -> float:
    """When the launcher (this process's parent) started, as time.time(); now if unknown."""
    try:
        ticks = int(_start_ticks(os.getppid()))
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, StopIteration):
        return time.time()


def job_run_dir(script: str, base: Path | None = None, ident: str | None = None, started: float | None = None) -> Path:
    """./gpuadvise-runs/<script>-<launcher start>[-N]: the folder this node's ranks share (module docstring)."""
    base = base or Path(layout.RUNS_DIR)
    ident = ident or job_id()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started if started is not None else launcher_started()))
    stem = Path(script).stem or "run"
    n = 1
    while True:
        candidate = base / (f"{stem}-{stamp}" if n == 1 else f"{stem}-{stamp}-{n}")
        if _claim(candidate, ident):
            return candidate
        n += 1


def _claim(folder: Path, ident: str) -> bool:
    """Whether `folder` is this job's: claimed now, or already by another rank of this job."""
    mark = folder / JOB_MARK
    if any(folder.glob("run*.json")) and not mark.exists():
        return False  # a capture from before: not this job's
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        for _ in range(50):  # the claiming rank may not have written its id yet
            try:
                text = mark.read_text()
            except OSError:
                text = ""
            if text:
                return text.strip() == ident
            time.sleep(0.01)
        return False
    except OSError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(ident + "\n")
    return True


# ----------------------------------------------------------------------------------------------------
# The reporting rank waits for the others


@dataclass
class RankStatus:
    rank: int
    finished: bool
    exit_code: int | None
    signal: str | None
    state: str  # run.json's capture state
    steps: int
    trace: bool

    @property
    def failed(self) -> bool:
        return self.finished and self.exit_code not in (0, None)

    def describe(self) -> str:
        capture = "its trace is complete" if self.trace else f"no trace ({self.state})"
        if self.signal:
            return f"rank {self.rank} was stopped by {self.signal} at step {self.steps}; {capture}"
        return f"rank {self.rank} failed (exit code {self.exit_code}) at step {self.steps}; {capture}"


def expected_ranks(out: Path, env: JobEnv) -> set[int]:
    """The ranks whose files go to this folder: the whole job on one node; on several nodes this node's
    ranks and any other rank already writing here (a shared -o folder)."""
    if env.world_size == (env.local_world_size or env.world_size):
        return set(range(env.world_size))
    return env.node_ranks() | set(ranks_in(out))


def ranks_in(out: Path) -> list[int]:
    found = []
    for p in out.glob("run*.json"):
        if p.name == "run.json":
            found.append(0)
        elif p.name.startswith("run.rank") and p.name[len("run.rank"):-len(".json")].isdigit():
            found.append(int(p.name[len("run.rank"):-len(".json")]))
    return sorted(found)


def status_of(out: Path, rank: int) -> RankStatus:
    data = layout.read_json(out / layout.run_json_name(rank))
    capture = data.get("capture") or {}
    return RankStatus(rank=rank, finished="exit_code" in data, exit_code=data.get("exit_code"),
                      signal=data.get("exit_signal"), state=str(capture.get("state", "not started")),
                      steps=int(capture.get("steps_stepped") or 0), trace=(out / layout.trace_name(rank)).exists())


def wait_for_ranks(out: Path, env: JobEnv, own_code: int, timeout: float | None = None,
                   poll: float = 0.2) -> tuple[list[RankStatus], list[int]]:
    """Wait until every expected rank has finished (bounded); returns their statuses and the ranks that
    had not finished when the wait ended."""
    if timeout is None:
        try:
            timeout = float(os.environ.get("GPUADVISE_JOB_WAIT", WAIT_S))
        except ValueError:
            timeout = WAIT_S
    if own_code != 0:
        timeout = min(timeout, WAIT_AFTER_OWN_FAILURE_S)
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        ranks = sorted(expected_ranks(out, env))
        statuses = [status_of(out, r) for r in ranks]
        pending = [s.rank for s in statuses if not s.finished]
        if not pending or time.monotonic() >= deadline:
            return statuses, pending
        time.sleep(poll)


def status_lines(statuses: list[RankStatus], pending: list[int], waited: float | None = None) -> list[str]:
    """What the report says about the job's ranks before its findings: the ones that failed (those that
    exited on their own first: a launcher stops every other rank with a signal once one fails) or never
    finished; nothing when every rank ended well."""
    failed = sorted((s for s in statuses if s.failed), key=lambda s: (s.signal is not None, s.rank))
    lines = [s.describe() for s in failed]
    if pending:
        which = ", ".join(str(r) for r in pending)
        lines.append(f"rank{'s' if len(pending) > 1 else ''} {which} had not finished"
                     + (f" after {waited:.0f} s" if waited else "") + "; analysed the ranks that had")
    return lines

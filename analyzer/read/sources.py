"""What a PATH on the command line means: a trace, a folder of per-rank traces, or a run folder.

A `torch.profiler.tensorboard_trace_handler` log folder holds its traces one or two levels down
(`log/<run>/<worker>.<time>.pt.trace.json[.gz]`): a folder with no trace of its own is searched
below (MAX_DEPTH levels). The handler writes one file per capture, so `schedule(repeat=N)` leaves
N files of one worker with increasing times: those are marked as captures of one worker
(`Source.capture`), not ranks.

A `gpuadvise profile` run folder of a long run holds several windows of one process: `trace.pt.trace.json.gz`
(window 1) and `trace.wN.pt.trace.json.gz` (`trace.rankR.wN…` under torchrun), listed in run.json's
`capture.windows`. They are marked as captures of that process (`Capture.window` true), each analysed
with its own step times (`runfacts.window_facts`), and the rank's step record (`steps.jsonl`,
`Source.record`) comes with them for the run-level analysis.

A folder may hold more JSON than traces: the user's own reports (`gpuadvise analyze RUN -o
RUN/report.json`), run records, notes. Inside a folder, a JSON file that is not a trace is skipped with
a note; named on its own it is an error. A run record named on its own (`RUN/run.json`) stands for its
run folder.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.model import runfacts

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


@dataclass
class Source:
    path: Path
    kind: str  # "trace" or "snapshot"
    rank: int | None = None
    facts: dict = field(default_factory=dict)
    snapshot: Path | None = None  # a trace's allocator snapshot from the same run (run folder)
    capture: "Capture | None" = None  # one of several captures of one worker (tensorboard_trace_handler, windows)
    record: Path | None = None  # the run's step record (run folder: steps.jsonl of the trace's rank)


@dataclass(frozen=True)
class Capture:
    worker: str  # the handler's worker name (hostname_pid by default), or the run folder and rank
    index: int  # 1-based, in the order the captures were written (a run folder: the window's number)
    count: int  # captures of this worker in the input
    window: bool = False  # a window of a `gpuadvise profile` run folder (not a repeated handler capture)


_RUN_JSON = re.compile(r"^run(\.rank\d+)?\.json$")  # run.json, and run.rankN.json for ranks other than 0
_WINDOW = re.compile(r"\.w(\d+)\.pt\.trace\.json(\.gz)?$")  # trace.w2.pt.trace.json.gz: a run folder's later window


def window_from_name(name: str) -> int:
    """A run folder trace's window (1 unless named `….wN.pt.trace.json[.gz]`)."""
    m = _WINDOW.search(name)
    return int(m.group(1)) if m else 1


def is_trace_name(p: Path) -> bool:
    return p.name.endswith(TRACE_SUFFIXES) and not _RUN_JSON.match(p.name)


class Sources(list):
    """The sources of `resolve`, with notes on what was skipped (`.notes`)."""

    def __init__(self, items=(), notes=()):
        super().__init__(items)
        self.notes = list(notes)


MAX_DEPTH = 3  # log/<run>/<worker folder>/ is as deep as profiler logs go in practice

# tensorboard_trace_handler's file name: <worker>.<time in ms or ns>.pt.trace.json[.gz]
_HANDLER_NAME = re.compile(r"^(?P<worker>.+)\.(?P<time>\d{9,})\.pt\.trace\.json(\.gz)?$")


def resolve(paths: list[str]) -> Sources:
    out = _resolve(paths)
    mark_captures(out)
    return out


def mark_captures(sources: list[Source]) -> None:
    """Several files of one worker in one folder, named by the handler with increasing times, are
    repeated captures of one process (`schedule(repeat=N)`), not ranks of a job."""
    groups: dict[tuple, list[tuple[int, Source]]] = {}
    for src in sources:
        m = _HANDLER_NAME.match(src.path.name) if src.kind == "trace" else None
        if m:
            groups.setdefault((src.path.parent, m["worker"]), []).append((int(m["time"]), src))
    for (_, worker), members in groups.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda ts: ts[0])
        for i, (_, src) in enumerate(members, start=1):
            src.capture = Capture(worker=worker, index=i, count=len(members))


def _resolve(paths: list[str]) -> Sources:
    out = Sources()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(p, "no such file or folder")
        if p.is_file() and _RUN_JSON.match(p.name):
            p = p.parent  # a run record stands for the run folder it describes
        if p.is_dir():
            out.extend(_folder_or_below(p, out.notes))
        elif p.name.endswith(SNAPSHOT_SUFFIXES):
            out.append(Source(p, "snapshot"))
        else:
            out.append(Source(p, "trace", rank=rank_from_name(p.name)))
    return out


def _folder_or_below(d: Path, notes: list[str]) -> list[Source]:
    """The folder's own traces; where it has none, those of the folders below it (a profiler log)."""
    try:
        return _folder(d, notes)
    except InputError as exc:
        if not exc.problem.startswith("folder holds no"):
            raise  # a run folder without a trace says why; unreadable is unreadable
        found = _below(d, notes, MAX_DEPTH)
        if not found:
            raise
        return found


def _below(d: Path, notes: list[str], depth: int) -> list[Source]:
    if depth == 0:
        return []
    try:
        subs = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    out: list[Source] = []
    for sub in subs:
        try:
            out.extend(_folder(sub, notes))
        except InputError as exc:
            if not exc.problem.startswith("folder holds no"):
                raise
            out.extend(_below(sub, notes, depth - 1))
    return out


def _folder(d: Path, notes: list[str] | None = None) -> list[Source]:
    try:
        facts_by_file = {p.name: _read_run_json(p) for p in sorted(d.glob("run*.json")) if _RUN_JSON.match(p.name)}
        files = sorted(p for p in d.iterdir() if p.is_file())
    except PermissionError:
        raise InputError(d, "permission denied") from None
    except OSError as exc:
        raise InputError(d, f"cannot read the folder: {exc.strerror or exc}") from None
    traces = []
    for p in (p for p in files if is_trace_name(p)):
        why = not_a_trace(p)
        if why is None:
            traces.append(p)
        elif notes is not None:
            notes.append(f"skipped {p}: {why}")
    snaps = [p for p in files if p.name.endswith(SNAPSHOT_SUFFIXES)]
    if not traces and not snaps:
        raise InputError(d, _why_empty(facts_by_file))

    def facts(rank):
        # gpuadvise profile writes run.json for rank 0 (or no rank) and run.rankN.json for the others
        own = facts_by_file.get(f"run.rank{rank}.json") if rank not in (None, 0) else None
        return own if own is not None else facts_by_file.get("run.json", {})

    out = []
    for p in traces:
        rank, window = rank_from_name(p.name), window_from_name(p.name)
        out.append(Source(p, "trace", rank=rank, facts=runfacts.window_facts(facts(rank), window),
                          record=_record(d, rank)))
    out.sort(key=lambda src: (src.rank if src.rank is not None else -1, window_from_name(src.path.name)))
    _mark_windows(d, out)
    loose = [p for p in snaps if not _attach(p, out)]
    out += [Source(p, "snapshot", rank=rank_from_name(p.name), facts=facts(rank_from_name(p.name))) for p in loose]
    return out


def _record(d: Path, rank: int | None) -> Path | None:
    """The rank's step record in a run folder (steps.jsonl, steps.rankR.jsonl), when there is one."""
    p = d / (f"steps.rank{rank}.jsonl" if rank is not None else "steps.jsonl")
    return p if p.is_file() else None


def _mark_windows(d: Path, traces: list[Source]) -> None:
    """A rank with several windows in a run folder: captures of one process, numbered by window."""
    by_rank: dict = {}
    for src in traces:
        by_rank.setdefault(src.rank, []).append(src)
    for rank, members in by_rank.items():
        if len(members) < 2:
            continue
        worker = f"{d.name}" + (f" rank {rank}" if rank is not None else "")
        for src in members:
            src.capture = Capture(worker=worker, index=window_from_name(src.path.name), count=len(members), window=True)


def _why_empty(facts_by_file: dict) -> str:
    if not facts_by_file:
        return "folder holds no .json/.json.gz trace"
    capture = next(iter(facts_by_file.values())).get("capture")
    capture = capture if isinstance(capture, dict) else {}
    # what `gpuadvise profile` recorded about the missing trace, in the words it printed then
    reason = capture.get("reason") or capture.get("state")
    return f"run folder has no trace: {reason}" if isinstance(reason, str) and reason else "run folder has no trace"


SNIFF_BYTES = 256 << 10  # enough to see a trace's "traceEvents" key or a report's header


def not_a_trace(p: Path) -> str | None:
    """Why a folder's JSON file is certainly not a trace (None: it may be one, the loader decides).

    Reads at most SNIFF_BYTES (decompressed): a gpuadvise report says so in its first bytes, and a small
    JSON file read to its end without a "traceEvents" key is something else. A large file is left to the
    loader: its key may come after a long header."""
    try:
        opener = gzip.open if p.name.endswith(".gz") else open
        with opener(p, "rb") as f:
            head = f.read(SNIFF_BYTES + 1)
    except (OSError, EOFError, ValueError):
        return None  # unreadable or damaged: the loader gives the precise error
    text = head.lstrip()
    if re.match(rb'\{\s*"gpuadvise"\s*:\s*\{\s*"timeline_of"', text):
        return "a gpuadvise --perfetto timeline (a copy of a trace with the findings added)"
    if text.startswith(b"[") or b'"traceEvents"' in head:
        return None
    if re.match(rb'\{\s*"tool"\s*:\s*"gpuadvise"', text):
        return "a gpuadvise report, not a trace"
    if len(head) <= SNIFF_BYTES:
        return "JSON without a 'traceEvents' list, not a profiler trace"
    return None


def _read_run_json(run: Path) -> dict:
    try:
        facts = json.loads(run.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(run, f"run folder's {run.name} is unreadable: {exc}") from None
    if not isinstance(facts, dict):
        raise InputError(run, f"{run.name} is not a JSON object")
    # facts are hints for the rules: keep only well-formed entries, never fail a rule over them
    for key in ("dataloaders", "optimizers", "wrappers", "autocast", "compile"):
        entries = facts.get(key)
        facts[key] = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    for entry in facts["dataloaders"] + facts["wrappers"]:
        if "created_at" in entry and not isinstance(entry["created_at"], str):
            entry["created_at"] = str(entry["created_at"])
    return facts


def _attach(snap: Path, traces: list[Source]) -> bool:
    """A run folder's memory.rankN.pickle belongs to trace.rankN.json.gz (memory.pickle to the one trace):
    it is analysed with that trace rather than reported on its own."""
    rank = rank_from_name(snap.name)
    # a long run's snapshot follows window 1 (CUDA memory history runs right after it)
    same = [t for t in traces if t.rank == rank and t.snapshot is None and window_from_name(t.path.name) == 1]
    if len(same) != 1 and len(traces) == 1 and traces[0].snapshot is None and window_from_name(traces[0].path.name) == 1:
        same = traces  # one trace, one snapshot: the same run whatever the names say
    if len(same) != 1:
        return False
    same[0].snapshot = snap
    return True


_RANK = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)


def rank_from_name(name: str) -> int | None:
    m = _RANK.search(name)
    return int(m.group(1)) if m else None


def refuse_overwriting_inputs(out: Path, paths: list[str]) -> None:
    """Never write a report over a file being analysed. A folder's earlier report (or any JSON that is
    not a trace) is not an input: writing `-o RUN/report.json` again replaces it."""
    if not out.exists():
        return
    target = out.resolve()
    for src in resolve(paths):
        if any(q is not None and q.exists() and q.resolve() == target for q in (src.path, src.snapshot)):
            raise InputError(out, "the output would overwrite an input trace; choose another -o")

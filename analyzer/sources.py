"""What a PATH on the command line means: a trace, a folder of per-rank traces, or a run folder."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError

TRACE_SUFFIXES = (".json", ".json.gz", ".gz")
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


@dataclass
class Source:
    path: Path
    kind: str  # "trace" or "snapshot"
    rank: int | None = None
    facts: dict = field(default_factory=dict)


def is_trace_name(p: Path) -> bool:
    return p.name.endswith(TRACE_SUFFIXES) and p.name != "run.json"


def resolve(paths: list[str]) -> list[Source]:
    out: list[Source] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InputError(p, "no such file or folder")
        if p.is_dir():
            out.extend(_folder(p))
        elif p.name.endswith(SNAPSHOT_SUFFIXES):
            out.append(Source(p, "snapshot"))
        else:
            out.append(Source(p, "trace", rank=rank_from_name(p.name)))
    return out


def _folder(d: Path) -> list[Source]:
    run = d / "run.json"
    facts: dict = {}
    if run.is_file():
        try:
            facts = json.loads(run.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(run, f"run folder's run.json is unreadable: {exc}") from None
        if not isinstance(facts, dict):
            raise InputError(run, "run.json is not a JSON object")
    files = sorted(p for p in d.iterdir() if p.is_file())
    traces = [p for p in files if is_trace_name(p)]
    snaps = [p for p in files if p.name.endswith(SNAPSHOT_SUFFIXES)]
    if not traces and not snaps:
        what = "run folder has no trace" if run.is_file() else "folder holds no .json/.json.gz trace"
        raise InputError(d, what)
    out = [Source(p, "trace", rank=rank_from_name(p.name), facts=facts) for p in traces]
    out += [Source(p, "snapshot", rank=rank_from_name(p.name), facts=facts) for p in snaps]
    return out


_RANK = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)


def rank_from_name(name: str) -> int | None:
    m = _RANK.search(name)
    return int(m.group(1)) if m else None

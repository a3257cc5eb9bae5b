"""The run folder `gpuadvise profile` writes: names, atomic writes, rank-aware file names."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

RUNS_DIR = "gpuadvise-runs"


def rank() -> int | None:
    for var in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def suffix(r: int | None) -> str:
    return f".rank{r}" if r is not None else ""


def trace_name(r: int | None) -> str:
    return f"trace{suffix(r)}.json.gz"


def snapshot_name(r: int | None) -> str:
    return f"memory{suffix(r)}.pickle"


def run_json_name(r: int | None) -> str:
    return f"run{suffix(r)}.json" if r not in (None, 0) else "run.json"


def new_run_dir(script: str, base: Path | None = None) -> Path:
    """A fresh ./gpuadvise-runs/<script>-<timestamp>[-N] folder; never an existing one."""
    base = base or Path(RUNS_DIR)
    stem = Path(script).stem or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = base / f"{stem}-{stamp}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stem}-{stamp}-{n}"
    return candidate


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, default=str)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a run folder is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}

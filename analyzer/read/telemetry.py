"""Read a run folder's GPU telemetry (`telemetry.jsonl` beside `steps.jsonl`, `telemetry.rank3.jsonl` beside
`steps.rank3.jsonl`; the format is in gpuadvise/harness/steps/telemetry.py) into a `model.telemetry.Telemetry`.

The capture appends a line a second until the script ends and a kill can cut the last one: a line that
is not JSON is skipped and counted, never fatal. A file with another header is bad input; no file is
no telemetry (a run on a CPU, or without the `nvml` extra).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.model.telemetry import Telemetry

FORMAT = "gpuadvise telemetry"
MAX_LINES = 10_000_000  # a sample a second: four months
FIELDS = ("util_pct", "sm_clock_mhz", "mem_used_bytes", "power_w", "temp_c")


def telemetry_beside(step_record: Path) -> Path:
    """The telemetry file written beside a step record."""
    name = step_record.name
    return step_record.with_name("telemetry" + name[len("steps"):] if name.startswith("steps") else "telemetry.jsonl")


def load_telemetry(path: Path) -> Telemetry:
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(path, f"cannot read the GPU telemetry: {exc.strerror or exc}") from None
    rows: dict[str, list] = {k: [] for k in ("t", "step") + FIELDS}
    reasons: list[list[str]] = []
    damaged = 0
    with fh:
        header = json_line(fh.readline())
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise InputError(path, "not a gpuadvise telemetry file (no header line)")
        device = header.get("device") if isinstance(header.get("device"), dict) else {}
        for i, line in enumerate(fh):
            if i >= MAX_LINES:
                raise InputError(path, f"GPU telemetry has more than {MAX_LINES} lines")
            entry = json_line(line)
            if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or not is_finite_number(entry.get("t")):
                damaged += 1 if line.strip() else 0
                continue
            rows["t"].append(float(entry["t"]))
            rows["step"].append(entry["step"])
            for k in FIELDS:
                rows[k].append(float(entry[k]) if is_finite_number(entry.get(k)) else math.nan)
            r = entry.get("reasons")
            reasons.append([str(x) for x in r] if isinstance(r, list) else [])
    return Telemetry(source=str(path), device=device, t=np.array(rows["t"]), step=np.array(rows["step"], dtype=np.int64),
                     **{k: np.array(rows[k], dtype=float) for k in FIELDS}, reasons=reasons, damaged_lines=damaged)


def json_line(line: str):
    """One JSON Lines entry, or None where the line is damaged (the step record's reader uses it too)."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def is_finite_number(v) -> bool:
    """A JSON number that is neither a bool nor NaN/±Infinity."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

"""The GPU telemetry of each rank of a job (`telemetry.rank3.jsonl` beside rank 3's trace, as `gpuadvise
profile` writes it under torchrun; read/telemetry.py), for the job-level rules (a straggler's clocks
against the other ranks')."""

from __future__ import annotations

from pathlib import Path

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.read.telemetry import load_telemetry


def rank_telemetry(reports) -> dict:
    """rank → its `Telemetry`, for the ranks whose run folder holds one (a damaged file is left out: the
    telemetry only adds to a finding)."""
    out = {}
    for r in reports:
        if r.rank is None or not r.source:
            continue
        path = Path(r.source).parent / f"telemetry.rank{r.rank}.jsonl"
        if path.is_file():
            try:
                out[r.rank] = load_telemetry(path)
            except InputError:
                pass
    return out

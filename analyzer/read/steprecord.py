"""Read a run folder's step record (`steps.jsonl`, written while the script ran; the format is in
gpuadvise/harness/steps/record.py) into a `model.steprecord.StepRecord`.

The file is appended to until the script ends, and a crash can cut its last line: a line that is not
JSON is skipped and counted (`damaged_lines`), never fatal. A file that is not a step record at all
(another header) is bad input.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.model.steprecord import Bucket, StepRecord

from .telemetry import is_finite_number, json_line, load_telemetry, telemetry_beside

FORMAT = "gpuadvise step record"
MAX_LINES = 2_000_000  # a record of a billion steps is ~10 000 lines: more is not one


def load_step_record(path: Path) -> StepRecord:
    try:
        fh = open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(path, f"cannot read the step record: {exc.strerror or exc}") from None
    numbers: list[int] = []
    phases: list[str] = []
    cpu: list[float] = []
    gpu: list[float] = []
    buckets: list[Bucket] = []
    mem: list[list] = []
    workers: list[tuple[int, int]] = []
    damaged = 0
    any_gpu = False
    with fh:
        header = json_line(fh.readline())
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise InputError(path, "not a gpuadvise step record (no header line)")
        exact = int(header.get("exact_steps") or 0)
        for i, line in enumerate(fh):
            if i >= MAX_LINES:
                raise InputError(path, f"step record has more than {MAX_LINES} lines")
            entry = json_line(line)
            if not isinstance(entry, dict):
                damaged += 1 if line.strip() else 0
                continue
            for row in entry.get("workers") or []:
                if isinstance(row, list) and len(row) == 2 and all(isinstance(v, int) and v >= 0 for v in row):
                    workers.append((row[0], row[1]))
            for row in entry.get("mem") or []:
                if isinstance(row, list) and len(row) == 4 and isinstance(row[0], int):
                    mem.append([row[0]] + [_num(v) for v in row[1:]])
            if "first" in entry:
                first, ph, c = entry.get("first"), entry.get("phase"), entry.get("cpu")
                g = entry.get("gpu")
                if not isinstance(first, int) or not isinstance(ph, str) or not isinstance(c, list) or len(c) != len(ph):
                    damaged += 1
                    continue
                if not isinstance(g, list) or len(g) != len(c):
                    g = [None] * len(c)
                any_gpu = any_gpu or any(v is not None for v in g)
                numbers.extend(range(first, first + len(c)))
                phases.extend(ph)
                cpu.extend(_num(v) for v in c)
                gpu.extend(_num(v) for v in g)
            elif "bucket" in entry:
                b = _bucket(entry)
                if b is None:
                    damaged += 1
                else:
                    buckets.append(b)
                    any_gpu = any_gpu or "gpu" in entry
    cpu_ms = np.array(cpu, dtype=float)
    gpu_ms = np.array(gpu, dtype=float)
    order = np.argsort(np.array(numbers, dtype=np.int64), kind="stable")
    mem_arr = np.array(sorted(mem, key=lambda r: r[0]), dtype=float).reshape(-1, 4)
    return StepRecord(
        source=str(path), clock="cuda_event" if any_gpu else "cpu", exact_steps=exact,
        number=np.array(numbers, dtype=np.int64)[order], phase=np.array(phases, dtype="<U1")[order],
        ms=(gpu_ms if any_gpu else cpu_ms)[order], cpu_ms=cpu_ms[order], buckets=sorted(buckets, key=lambda b: b.first),
        mem_step=mem_arr[:, 0].astype(np.int64), mem_rss=mem_arr[:, 1], mem_allocated=mem_arr[:, 2],
        mem_reserved=mem_arr[:, 3], damaged_lines=damaged, telemetry=_telemetry(Path(path)),
        worker_starts=sorted(workers))


def _telemetry(path: Path):
    """The GPU telemetry sampled beside the record, when the run sampled it."""
    beside = telemetry_beside(path)
    return load_telemetry(beside) if beside.is_file() else None


def _num(v) -> float:
    return float(v) if is_finite_number(v) else float("nan")


def _bucket(entry: dict) -> Bucket | None:
    span = entry.get("bucket")
    if not (isinstance(span, list) and len(span) == 2 and all(isinstance(v, int) for v in span)):
        return None
    stats = entry.get("gpu") if isinstance(entry.get("gpu"), list) else entry.get("cpu")
    med, lo, hi = ([_num(v) for v in stats] + [float("nan")] * 3)[:3] if isinstance(stats, list) else (float("nan"),) * 3
    max_step = entry.get("max_step")
    return Bucket(first=span[0], last=span[1], n=int(entry.get("n") or 0), median_ms=None if math.isnan(med) else med,
                  min_ms=None if math.isnan(lo) else lo, max_ms=None if math.isnan(hi) else hi,
                  max_step=max_step if isinstance(max_step, int) else None)

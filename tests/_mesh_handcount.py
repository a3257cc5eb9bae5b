"""A hand count of a gloo mesh job's exposed communication per group, straight from each rank's raw trace
JSON, with none of gpuadvise's code: the check on what `gpuadvise analyze` reports per process group
(tests/test_mesh_torchrun.py, bench/mesh_job.py).

Per rank and ProfilerStep: each `gloo:*` span belongs to the latest `c10d::` call the training thread made
before it began (that call's start is when the rank arrived); it is FSDP's (the mesh's "dp" group) when
that call was made inside an `FSDP::` annotation, else tensor parallel's ("tp"). A group's exposed time
in a step is the union of its collectives' [call start, span end] minus the training thread's own work:
its `cpu_op` events, leaving out the collectives' own (`c10d::`, `_c10d_functional::`,
`record_param_comms`) and any op that holds one inside it.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path


def _union(spans: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _less(spans: list[list[float]], cuts: list[list[float]]) -> float:
    return sum((b - a) - sum(max(0.0, min(b, d) - max(a, c)) for c, d in cuts) for a, b in spans)


def _is_collective(name: str) -> bool:
    return name.startswith(("c10d::", "_c10d_functional::", "record_param_comms", "gloo:"))


def exposed_ms(path: Path) -> dict[str, float]:
    """{"dp": ms, "tp": ms}: the median over the rank's steps of each group's exposed time."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    main = steps[0]["tid"]
    calls = sorted((e for e in events if e["tid"] == main and e["name"].startswith("c10d::")), key=lambda e: e["ts"])
    spans = sorted((e for e in events if e["name"].startswith("gloo:")), key=lambda e: e["ts"])
    fsdp = [e for e in events if e["tid"] == main and e["name"].startswith("FSDP::")]
    ops = [e for e in events if e["tid"] == main and e.get("cat") == "cpu_op"]
    marks = [e["ts"] for e in ops if _is_collective(e["name"])]
    work = _union([(e["ts"], e["ts"] + e["dur"]) for e in ops if not _is_collective(e["name"])
                   and not any(e["ts"] <= t < e["ts"] + e["dur"] for t in marks)])
    collectives = []
    for s in spans:
        call = [c for c in calls if c["ts"] <= s["ts"]][-1]
        group = "dp" if any(f["ts"] <= call["ts"] <= f["ts"] + f["dur"] for f in fsdp) else "tp"
        collectives.append((call["ts"], s["ts"] + s["dur"], group))
    per_step: dict[str, list[float]] = {"dp": [], "tp": []}
    for step in steps:
        lo, hi = step["ts"], step["ts"] + step["dur"]
        for group, values in per_step.items():
            mine = _union([(a, b) for a, b, g in collectives if g == group and lo <= a < hi])
            values.append(_less(mine, work))
    return {g: statistics.median(v) / 1e3 for g, v in per_step.items()}

"""The trace's own facts → `TraceMeta`: devices, rank and world size, tool versions, profiler flags and
the platform (CUDA or ROCm).

Read from the document's header keys, which the careful path and the streamed path find in different
ways, so both hand the decoded header here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from . import events as ev
from gpuadvise.analyzer.model.collectives import parse_ranks
from gpuadvise.analyzer.model.trace import Device, TraceMeta

def meta_from_header(h: ev.Header, path: Path) -> TraceMeta:
    meta = TraceMeta(path=str(path))
    props = h.deviceProperties if isinstance(h.deviceProperties, list) else h.computeProperties
    if isinstance(props, list):
        for i, p in enumerate(props):
            if not isinstance(p, dict):
                continue
            meta.devices.append(Device(
                id=_int(p.get("id"), i),
                name=str(p.get("name") or ""),
                compute_major=_int(p.get("computeMajor"), None),
                compute_minor=_int(p.get("computeMinor"), None),
                total_memory=_int(p.get("totalGlobalMem"), None),
                num_sms=_int(p.get("numSms"), None),
            ))
    if isinstance(h.distributedInfo, dict):
        meta.rank = _int(h.distributedInfo.get("rank"), None)
        meta.world_size = _int(h.distributedInfo.get("world_size"), None)
        backend = h.distributedInfo.get("backend")
        meta.backend = backend if isinstance(backend, str) and backend else None
        meta.process_groups = process_groups(h.distributedInfo.get("pg_config"))
    for key in ("schemaVersion", "cupti_version", "cuda_runtime_version", "cuda_driver_version",
                "hip_runtime_version", "roctracer_version"):
        value = getattr(h, key)
        if isinstance(value, (int, float, str)):
            meta.versions[key] = value
    for key in ("record_shapes", "profile_memory", "with_stack"):
        value = getattr(h, key)
        if isinstance(value, (int, bool)):
            meta.flags[key] = bool(value)
    if "hip_runtime_version" in meta.versions or "roctracer_version" in meta.versions:
        meta.platform = "rocm"
    elif "cuda_runtime_version" in meta.versions or "cupti_version" in meta.versions:
        meta.platform = "cuda"
    return meta


def process_groups(config) -> list[dict]:
    """distributedInfo's `pg_config` (one entry per process group the rank is in) as
    {"name", "desc", "ranks", "backend"}; entries without a name or ranks are left out."""
    entries = config.values() if isinstance(config, dict) else config if isinstance(config, list) else []
    out = []
    for e in entries:
        if not isinstance(e, dict):
            continue
        name, ranks = e.get("pg_name"), parse_ranks(e.get("ranks"))
        if name is None or not ranks:
            continue
        out.append({"name": str(name), "desc": str(e.get("pg_desc") or ""), "ranks": ranks,
                    "backend": str(e.get("backend_config") or "")})
    return out


def _int(value, default):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return default
    return default



def platform_from_names(meta: TraceMeta, runtime: pd.DataFrame) -> None:
    if meta.platform != "unknown" or runtime.empty:
        return
    names = runtime["name"].cat.categories
    if any(str(n).startswith("hip") for n in names):
        meta.platform = "rocm"
    elif any(str(n).startswith("cu") for n in names):
        meta.platform = "cuda"

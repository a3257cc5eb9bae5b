"""The run folder's files, as the capture writes them: the gzipped trace (with the probe's shapes merged
in), the CUDA memory snapshot, and run.json.

Each file is written to a temporary name and renamed, so a run folder never holds half a file even when
the script is killed. Kept apart from the session, which decides *when* to write; here is only *how*.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import tempfile
from pathlib import Path

from ..facts import compiled, general, shapes
from ..facts import distributed as distfacts
from ..frameworks import loop
from . import layout


def write_trace(prof, out: Path, rank, probe_events: list | None, active: int, status: dict, window: int = 1) -> Path:
    """Export window `window`'s trace to `out`/trace….json.gz; returns its path. Raises when it cannot be
    written, after removing its temporary files. `status` gets the shape merge's report (`shapes`)."""
    out.mkdir(parents=True, exist_ok=True)
    final = out / layout.trace_name(rank, window)
    tmp_json = out / f".{final.name}.json.tmp"
    tmp_gz = out / f".{final.name}.tmp"
    try:
        prof.export_chrome_trace(str(tmp_json))
        with gzip.open(tmp_gz, "wb", compresslevel=6) as dst:
            _copy_trace(tmp_json, dst, out, probe_events, active, status)
        os.replace(tmp_gz, final)
        os.unlink(tmp_json)
    except BaseException:
        for p in (tmp_json, tmp_gz):
            try:
                if p.exists():
                    p.unlink()
            except OSError:
                pass
        raise
    return final


def _copy_trace(src: Path, dst, out: Path, probe_events: list | None, active: int, status: dict) -> None:
    """Copy the exported trace into the gzip stream, with the probe's matmul shapes merged in."""
    if probe_events is not None:
        try:
            with tempfile.TemporaryFile(dir=out) as annotated:
                report = shapes.annotate_copy(src, annotated, probe_events, active)
                annotated.seek(0)
                shutil.copyfileobj(annotated, dst, 1 << 20)
            status["shapes"] = dict(status.get("shapes") or {}, **report)
            return
        except Exception as exc:  # shapes are a bonus: the plain trace is still written
            status["shapes"] = dict(status.get("shapes") or {}, state=f"merge failed: {type(exc).__name__}: {exc}")
    with open(src, "rb") as fh:
        shutil.copyfileobj(fh, dst, 1 << 20)


def dump_memory_snapshot(torch, out: Path, rank) -> str:
    """Dump the CUDA memory history recorded so far; returns the snapshot's file name."""
    final = out / layout.snapshot_name(rank)
    tmp = out / f".{final.name}.tmp"
    torch.cuda.memory._dump_snapshot(str(tmp))
    os.replace(tmp, final)
    return final.name


def memory_stats(torch) -> dict:
    """`torch.cuda.memory_stats()` counters, without the per-pool detail nobody reads."""
    return {k: v for k, v in torch.cuda.memory_stats().items()
            if isinstance(v, (int, float)) and not k.startswith(("active.", "inactive_split."))}


def write_run_json(out: Path, rank, config: dict, capture: dict, steps: dict, torch, exit_code=None) -> None:
    """Merge this rank's capture, step times and facts into its run.json (the CLI wrote the rest)."""
    path = out / layout.run_json_name(rank)
    data = layout.read_json(path)
    data.update(config.get("run", {}))
    data["rank"] = rank
    data["pid"] = os.getpid()  # the training process: `gpuadvise trigger` signals it
    data["hostname"] = socket.gethostname()
    data["capture"] = capture
    recorded = [s for s, p in zip(steps["step_sources"], steps["phase"]) if p == "active"]
    steps["source"] = (recorded or steps["step_sources"] or [None])[-1]
    data["steps"] = steps
    if torch is not None:
        try:
            data["environment"] = general.environment(torch)
            data["settings"] = general.backend_flags(torch)
        except Exception:
            pass
    f = general.facts()
    data.update({k: [dict((kk, vv) for kk, vv in d.items() if kk != "id") for d in v] for k, v in f.items()})
    if torch is not None:
        try:
            job = distfacts.summary(torch)  # None outside a job without DDP/FSDP/DeepSpeed
        except Exception:
            job = None
        if job:
            data["distributed"] = job
    framework = loop.summary()  # None unless a training framework ran the loop
    if framework is not None:
        data["framework"] = framework
    compile_facts = compiled.summary()  # None unless the script called torch.compile
    if compile_facts is not None:
        data["compiled"] = compile_facts
    if exit_code is not None:
        data["script_exit_code"] = exit_code
    layout.write_json_atomic(path, data)

"""A cache of the parsed model, so re-opening a big trace takes a second instead of a full parse.

The cache is an uncompressed `.npz` of plain numpy columns plus a JSON header: it is loaded with
`allow_pickle=False`, so a planted cache file is data, never code. It sits next to the trace
(`.<name>.gpuadvise-cache.npz`) when that folder is writable, else under `$XDG_CACHE_HOME/gpuadvise`
(default `~/.cache/gpuadvise`). It is keyed by the trace's absolute path, size, mtime and the cache
format version; any mismatch means a fresh parse. Salvaged (truncated) traces are never cached.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from gpuadvise.analyzer.filemode import publish
from gpuadvise.analyzer.model.trace import Device, TraceMeta, TraceModel

FORMAT = 7  # 2: cpu ops keep their autograd sequence number (`seq`); 3: the `comms` table; 4: `input_concrete`;
# 5: the SDPA call's and its math backend's shapes (flopops.ATTENTION_CALLS); 6: the comms' group description,
# ranks and Comms Id, the kernels' CUDA-graph node, the process groups of the trace's header; 7: the shapes of
# the c10d calls that say their group's size (collectives.SIZED_CALLS)
MIN_BYTES = 16 << 20  # smaller traces parse in well under a second: not worth a file
TABLES = ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations", "comms")


def enabled() -> bool:
    return not os.environ.get("GPUADVISE_NO_CACHE")


def _key(trace: Path) -> str:
    st = trace.stat()
    raw = f"{trace.resolve()}|{st.st_size}|{st.st_mtime_ns}|{FORMAT}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _locations(trace: Path, key: str) -> list[Path]:
    beside = trace.parent / f".{trace.name}.gpuadvise-cache.npz"
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuadvise" / f"{key}.npz"
    return [beside, home]


def load(trace: Path) -> TraceModel | None:
    """The cached model for this exact file, or None."""
    try:
        key = _key(trace)
    except OSError:
        return None
    for path in _locations(trace, key):
        if not path.is_file():
            continue
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(bytes(z["__header__"]).decode())
                if header.get("key") != key or header.get("format") != FORMAT:
                    continue
                return _model(header, z)
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError):
            continue  # unreadable or foreign: parse the trace again
    return None


def save(trace: Path, model: TraceModel) -> Path | None:
    """Write the cache; quietly does nothing where no location is writable."""
    if model.meta.truncated:
        return None
    try:
        if trace.stat().st_size < MIN_BYTES:
            return None
        key = _key(trace)
    except OSError:
        return None
    arrays, columns = {}, {}
    for table in TABLES:
        df = getattr(model, table)
        columns[table] = []
        for col in df.columns:
            name = f"{table}/{col}"
            values = df[col]
            if isinstance(values.dtype, pd.CategoricalDtype):
                arrays[name] = values.cat.codes.to_numpy()
                columns[table].append({"name": col, "categories": [str(c) for c in values.cat.categories]})
            else:
                arrays[name] = values.to_numpy()
                columns[table].append({"name": col})
    header = {"key": key, "format": FORMAT, "columns": columns, "meta": _meta_to_json(model.meta)}
    arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    for path in _locations(trace, key):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as fh:
                publish(fh.fileno())  # readable as the trace beside it is, under the user's umask
                np.savez(fh, **arrays)
            os.replace(tmp, path)
            return path
        except OSError:
            try:
                os.unlink(tmp)  # noqa: F821 - defined when mkstemp succeeded
            except (OSError, NameError):
                pass
            continue
    return None


def _meta_to_json(meta: TraceMeta) -> dict:
    d = dataclasses.asdict(meta)
    d["thread_names"] = [[k[0], k[1], v] for k, v in meta.thread_names.items()]
    d["process_names"] = [[k, v] for k, v in meta.process_names.items()]
    return d


def _meta_from_json(d: dict) -> TraceMeta:
    d = dict(d)
    d["devices"] = [Device(**x) for x in d.get("devices", [])]
    d["thread_names"] = {(a, b): v for a, b, v in d.get("thread_names", [])}
    d["process_names"] = {a: v for a, v in d.get("process_names", [])}
    known = {f.name for f in dataclasses.fields(TraceMeta)}
    return TraceMeta(**{k: v for k, v in d.items() if k in known})


def _model(header: dict, z) -> TraceModel:
    frames = {}
    for table in TABLES:
        cols = {}
        for spec in header["columns"][table]:
            values = z[f"{table}/{spec['name']}"]
            if "categories" in spec:
                values = pd.Categorical.from_codes(values, categories=spec["categories"])
            cols[spec["name"]] = values
        frames[table] = pd.DataFrame(cols, copy=False)  # a block per column, as the reader builds them
    return TraceModel(meta=_meta_from_json(header["meta"]), **frames)

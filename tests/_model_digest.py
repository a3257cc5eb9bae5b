"""A stable digest of what the trace reader produces: every table of a `TraceModel` (column names,
dtypes, values; categorical columns by their categories and values) and its `TraceMeta`.

The reader's contract is this digest: a faster reader must give the same one for every trace. The
goldens in tests/golden_models/reader_models.json are made by `python tests/_model_digest.py --update`.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

TABLES = ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations", "comms")
GOLDEN = Path(__file__).resolve().parent / "golden_models" / "reader_models.json"  # beside tests/golden (reports), apart from it


def _column(h, name: str, col: pd.Series) -> None:
    h.update(f"|{name}:{col.dtype}|".encode())
    if isinstance(col.dtype, pd.CategoricalDtype):
        h.update(json.dumps(list(col.cat.categories), ensure_ascii=False).encode())
        h.update(np.ascontiguousarray(col.cat.codes.to_numpy(np.int64)).tobytes())
    elif col.dtype == object:
        h.update(json.dumps(col.tolist(), ensure_ascii=False, default=str).encode())
    else:
        h.update(np.ascontiguousarray(col.to_numpy()).tobytes())


def model_digest(model) -> str:
    """sha256 over every table (in order, with its index length) and the meta (path left out)."""
    h = hashlib.sha256()
    for table in TABLES:
        df = getattr(model, table)
        h.update(f"#{table}:{len(df)}:{list(df.columns)}".encode())
        for name in df.columns:
            _column(h, name, df[name])
    meta = dataclasses.asdict(model.meta)
    meta.pop("path", None)
    for key, value in meta.items():  # thread_names is keyed by (pid, tid) tuples: written item by item
        items = sorted(value.items(), key=repr) if isinstance(value, dict) else value
        h.update(f"|{key}=".encode() + json.dumps(items, default=str).encode())
    return h.hexdigest()


def trace_digest(path: Path) -> str:
    from gpuadvise.analyzer.read.loader import load_trace

    return model_digest(load_trace(path, cache=False))


def _input_sha(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return hashlib.sha256(data).hexdigest()[:16]


def fixture_traces(folder: Path) -> dict[str, Path]:
    """Every rule's positive()/negative() trace fixture and every mechanism fixture, written to `folder`."""
    import inspect

    from gpuadvise.fixtures import mechanisms
    from gpuadvise.fixtures.builder import TraceBuilder
    from gpuadvise.rules import all_rules

    made = {}
    for rule in all_rules():
        for kind in ("positive", "negative"):
            try:
                b = getattr(rule, kind)()
            except Exception:  # noqa: BLE001 - a fixture that needs arguments or a run folder: not a trace
                continue
            if isinstance(b, TraceBuilder):
                made[f"rule:{rule.name}:{kind}"] = b.write(folder / f"{rule.name}-{kind}.json")
    for name, fn in inspect.getmembers(mechanisms, inspect.isfunction):
        if fn.__module__ == mechanisms.__name__ and not name.startswith("_"):
            try:
                b = fn()
            except TypeError:
                continue
            if isinstance(b, TraceBuilder):
                made[f"mechanism:{name}"] = b.write(folder / f"mech-{name}.json")
    return made


def corpus_traces() -> dict[str, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _corpus_support import TRACES, corpus_files

    return {f"corpus:{f}": TRACES / f for f in corpus_files() if not f.endswith((".pickle", ".pkl"))}


def digests() -> dict[str, dict]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in {**corpus_traces(), **fixture_traces(Path(tmp))}.items():
            try:
                digest = trace_digest(path)
            except Exception as e:  # noqa: BLE001 - a file the reader refuses: its one-line error is the answer
                digest = f"error: {type(e).__name__}: {e}".replace(str(path), "FILE")
            out[name] = {"input": _input_sha(path), "model": digest}
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    got = digests()
    if "--update" in sys.argv:
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} digests to {GOLDEN}")
    else:
        want = json.loads(GOLDEN.read_text())
        bad = [k for k in got if k in want and want[k]["input"] == got[k]["input"] and want[k]["model"] != got[k]["model"]]
        print(f"{len(got)} traces, {len(bad)} differ: {bad}")

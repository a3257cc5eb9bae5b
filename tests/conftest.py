"""Shared helpers: turn a TraceBuilder (or a hand-written trace) into a loaded model through the real loader."""

from __future__ import annotations

import json

import pytest

from gpuadvise.analyzer.read.loader import load_trace


@pytest.fixture
def load_built(tmp_path):
    """load_built(builder_or_dict, name="trace.json.gz") → TraceModel, written to disk and read back."""
    counter = iter(range(10**6))

    def _load(trace, name: str | None = None):
        path = tmp_path / (name or f"trace{next(counter)}.json.gz")
        if hasattr(trace, "write"):
            trace.write(path)
        else:
            data = json.dumps(trace).encode()
            if path.name.endswith(".gz"):
                import gzip

                data = gzip.compress(data)
            path.write_bytes(data)
        return load_trace(path)

    return _load


@pytest.fixture(autouse=True)
def _no_model_cache(monkeypatch):
    """Tests parse every trace for real (subprocesses inherit this); tests/test_cache.py opts back in."""
    monkeypatch.setenv("GPUADVISE_NO_CACHE", "1")

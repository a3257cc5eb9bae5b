"""Shared helpers: turn a TraceBuilder (or a hand-written trace) into a loaded model through the real loader;
one-thread ops in every test's subprocesses; the `thorough` Hypothesis profile."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import settings

# Every test's subprocesses (a profiled training script, a spawned DataLoader worker) run single-threaded
# ops: pytest-xdist already keeps every core busy with a test each, and a pool of OpenMP threads per child
# only spins on the cores the other tests need (examples/train_small_ops.py, 30 steps: 13.7 s of CPU with
# 2 threads, 3.6 s with 1, on the two-core machine under load). Set when pytest loads this file, before a test
# imports torch; a value set outside stays.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# `--hypothesis-profile=thorough`: ten times the examples of every property test (tests/_hypothesis_support.py).
settings.register_profile("thorough", max_examples=10 * settings.get_profile("default").max_examples)

from gpuadvise.analyzer.read.loader import load_trace  # noqa: E402


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist with `--dist loadgroup` (the README's test command), the tests of a module that
    share a module-scoped fixture (a profiled run, analysed traces) run on one worker, so that the fixture
    runs once rather than once per worker; every other test goes wherever a worker is free. A test that
    names its own xdist_group keeps it."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixtures a test uses
        defs = info.name2fixturedefs.values() if info else ()
        if any(d and d[-1].scope == "module" for d in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

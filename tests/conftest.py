"""Shared helpers: turn a TraceBuilder (or a hand-written trace) into a loaded model through the real loader;
one-thread ops in every test's subprocesses; the `thorough` Hypothesis profile."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from hypothesis import settings

# Every test's subprocesses (a profiled training script, a spawned DataLoader worker) run single-threaded
# ops: pytest-xdist already keeps every core busy with a test each, and a pool of OpenMP threads per child
# only spins on the cores the other tests need (examples/train_small_ops.py, 30 steps: 13.7 s of CPU with
# 2 threads, 3.6 s with 1, on the two-core machine under load). Set when pytest loads this file, before a test
# imports torch; a value set outside stays.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# A suite started in the background by a script (`cmd &` without job control) inherits SIGINT ignored,
# and so would every Python the tests start: the Ctrl-C tests' scripts would never see their Ctrl-C. The
# tests' children get the disposition a terminal gives.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# `--hypothesis-profile=thorough`: ten times the examples of every property test (tests/_hypothesis_support.py).
settings.register_profile("thorough", max_examples=10 * settings.get_profile("default").max_examples)

from gpuadvise.analyzer.read.loader import load_trace  # noqa: E402


# Each Python the tests start (a profiled script, `gpuadvise analyze`, a torchrun rank) imports gpuadvise. Where
# PYTHONDONTWRITEBYTECODE is set (this workplace's machines and CI set it) Python never keeps what it compiles, so
# every one of them compiles the package's modules again: 0.2 s of CPU a process (`gpuadvise analyze` of a small
# trace: 0.74 s, 0.53 s with them compiled), on a suite that starts hundreds. The suite compiles them once, into
# the __pycache__ folders beside them that any Python run without the variable writes (.gitignore'd); installed
# packages were compiled when pip installed them. (PYTHONPYCACHEPREFIX would keep the checkout clean but sends
# every import, numpy's and torch's included, to a folder that has none of theirs: slower, not faster.)
def pytest_configure(config):
    if hasattr(config, "workerinput") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return  # an xdist worker: the controller compiled them before it started the workers
    import compileall
    import importlib.util

    for package in ("gpuadvise", "gpuadvise.analyzer", "gpuadvise.rules", "gpuadvise.fixtures"):
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(folder, quiet=2)


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
    share a module-scoped fixture (a profiled run, analysed traces), directly or through other fixtures,
    run on one worker, so that the fixture runs once rather than once per worker; tests of the same module
    whose module-scoped fixtures are disjoint (a Trainer run and a Lightning run) form separate groups and
    may run on both workers; every other test goes wherever a worker is free. A test that names its own
    xdist_group keeps it."""
    parent: dict = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    grouped = []
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixtures a test uses
        module = item.nodeid.split("::")[0]
        shared = sorted((module, name) for name, d in (info.name2fixturedefs.items() if info else ())
                        if d and d[-1].scope == "module")
        if shared:
            for other in shared[1:]:
                parent[root(other)] = root(shared[0])
            grouped.append((item, shared[0]))
    for item, key in grouped:
        module, fixture = root(key)
        item.add_marker(pytest.mark.xdist_group(f"{module}:{fixture}"))


# -- the `slow` mark ----------------------------------------------------------------------------------
# `python -m pytest -m "not slow"` is the quick subset (docs/contributing.md). A test that starts a Python (the
# real command, a training script: a second or several each) must be marked slow, or it fails here: an
# audit hook counts the Pythons that subprocess starts, from the test's setup (its module-scoped fixtures
# included) to its teardown.
_PYTHONS_STARTED = [0]
_STARTED_BEFORE = pytest.StashKey[int]()


def _count_pythons(event: str, args: tuple) -> None:
    if event != "subprocess.Popen":
        return
    try:  # an exception here would break the Popen call itself
        executable, argv = args[0], args[1]
        first = os.fsdecode(executable or (argv if isinstance(argv, (str, bytes)) else list(argv)[0]))
    except Exception:
        return
    if first == sys.executable or os.path.basename(first).startswith("python"):
        _PYTHONS_STARTED[0] += 1


sys.addaudithook(_count_pythons)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_STARTED_BEFORE] = _PYTHONS_STARTED[0]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    started = _PYTHONS_STARTED[0] - item.stash.get(_STARTED_BEFORE, _PYTHONS_STARTED[0])
    if started and item.get_closest_marker("slow") is None:
        pytest.fail(f"{item.nodeid} starts {started} Python process(es): mark it @pytest.mark.slow "
                    "(docs/contributing.md)", pytrace=False)


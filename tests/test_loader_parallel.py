"""The two-process decode of big traces gives exactly the model the one-process decode gives."""

import pandas as pd
import pytest

from gpuadvise.analyzer.read import chunks, forked, loader, parallel
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import find_rule

TABLES = ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations", "comms")


def _legacy_threads(path):
    """A trace whose tids are strings ("stream 7", "thread main"), so string codes must be re-mapped."""
    import json

    b = find_rule("dataloader-stall").positive()
    for step in range(6):
        b.memory(1 << 20, (step + 1) << 20, 8 << 20)
    d = b.to_dict()
    for e in d["traceEvents"]:
        if e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime"):
            e["tid"] = "thread main"
    path.write_text(json.dumps(d))
    return path


def _load(path, workers, monkeypatch):
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", str(workers))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 4096)
    # The loader never forks a process that runs threads; an idle one an earlier test left in this
    # worker (Dask's offload pool, after tests/test_ranks.py) must not make this a one-process load.
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    used = []
    real = parallel.build_parallel
    monkeypatch.setattr(parallel, "build_parallel", lambda *a: used.append(real(*a)) or used[-1])
    model = loader.load_trace(path)
    assert used == ([True] if workers > 1 else []), "the forked worker did not deliver its half"
    return model


@pytest.mark.parametrize("make", ["builder", "legacy"])
def test_parallel_decode_equals_serial(tmp_path, monkeypatch, make):
    path = tmp_path / "t.json"
    if make == "builder":
        b = TraceBuilder()
        for _ in range(5):
            with b.step():
                with b.op("aten::mm", **{"Input type": ["float", "float"], "Input Dims": [[8, 8], [8, 8]]}):
                    for _ in range(30):
                        b.kernel("ampere_sgemm_64x64_nn", 50)
                b.item()
        b.finish()
        b.write(path)
    else:
        _legacy_threads(path)
    serial = _load(path, 1, monkeypatch)
    parallel = _load(path, 2, monkeypatch)
    for table in TABLES:
        a, b_ = getattr(serial, table), getattr(parallel, table)
        assert len(a) == len(b_) > 0 or len(a) == len(b_) == 0, table
        cols = [c for c in a.columns]
        sa = a.sort_values(["ts"] + (["dur"] if "dur" in cols else []), kind="stable", ignore_index=True)
        sb = b_.sort_values(["ts"] + (["dur"] if "dur" in cols else []), kind="stable", ignore_index=True)
        for col in cols:
            left, right = sa[col], sb[col]
            if isinstance(left.dtype, pd.CategoricalDtype):
                left, right = left.astype(str), right.astype(str)
            pd.testing.assert_series_equal(left, right, check_names=False, obj=f"{table}.{col}")
    assert serial.meta.events_total == parallel.meta.events_total
    assert serial.meta.thread_names == parallel.meta.thread_names


def test_a_reader_beside_other_threads_forks_only_when_its_caller_vouches_for_them(tmp_path, monkeypatch):
    """`gpuadvise view` reads in a worker thread beside Textual's: without `beside_threads` the reader
    never forks a process that runs other threads (one decoding process); inside it, the second core
    decodes half and the model is the same."""
    import threading

    from gpuadvise.analyzer import run

    path = _legacy_threads(tmp_path / "t.json")
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "2")
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 4096)
    forks = []
    real = forked.Forked.__init__
    monkeypatch.setattr(forked.Forked, "__init__", lambda self, work: forks.append(1) or real(self, work))
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, daemon=True)  # a thread of the interface, say
    other.start()
    try:
        alone = loader.load_trace(path)
        assert forks == []
        with run.beside_threads():
            beside = loader.load_trace(path)
        assert forks == [1]
        assert forked.can_fork() is False  # the vouch ends with the block
    finally:
        idle.set()
        other.join()
    assert alone.meta.events_total == beside.meta.events_total
    for table in TABLES:
        a, b = getattr(alone, table), getattr(beside, table)
        assert len(a) == len(b), table
        key = ["ts"] + (["dur"] if "dur" in a.columns else [])
        pd.testing.assert_frame_equal(a.sort_values(key, kind="stable", ignore_index=True).astype(str),
                                      b.sort_values(key, kind="stable", ignore_index=True).astype(str), obj=table)

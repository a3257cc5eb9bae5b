"""The parsed-model cache: same model back, invalidated by any change, never code, never in the way."""

import os
import time

import numpy as np
import pandas as pd
import pytest

from gpuadvise.analyzer.read import cache
from gpuadvise.analyzer.read import loader
from gpuadvise.rules import find_rule


@pytest.fixture
def trace(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUADVISE_NO_CACHE", raising=False)
    monkeypatch.setattr(cache, "MIN_BYTES", 0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "t.json"
    find_rule("dataloader-stall").positive().write(path)
    return path


def _same(a, b):
    for table in cache.TABLES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table), check_categorical=False)
    assert a.meta == b.meta


def test_second_load_comes_from_the_cache_and_equals_the_parse(trace, monkeypatch):
    first = loader.load_trace(trace)
    assert (trace.parent / f".{trace.name}.gpuadvise-cache.npz").is_file()
    parsed = []
    monkeypatch.setattr(loader, "_load_uncached", lambda *a: parsed.append(1))
    again = loader.load_trace(trace)
    assert parsed == []  # served from the cache
    _same(first, again)


def test_a_changed_trace_is_parsed_again(trace, monkeypatch):
    loader.load_trace(trace)
    data = trace.read_text().replace("ampere_tf32_s1688gemm_64x64_nn", "ampere_tf32_s1688gemm_64x64_tn")
    time.sleep(0.01)
    trace.write_text(data)
    model = loader.load_trace(trace)
    assert "ampere_tf32_s1688gemm_64x64_tn" in set(model.kernels["name"].astype(str))


def test_no_cache_env_bypasses_it(trace, monkeypatch):
    monkeypatch.setenv("GPUADVISE_NO_CACHE", "1")
    loader.load_trace(trace)
    assert not (trace.parent / f".{trace.name}.gpuadvise-cache.npz").exists()


def test_read_only_folder_falls_back_to_the_user_cache(trace, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    os.chmod(trace.parent, 0o555)
    try:
        loader.load_trace(trace)
        assert list((tmp_path / "xdg" / "gpuadvise").glob("*.npz"))
    finally:
        os.chmod(trace.parent, 0o755)


def test_a_planted_or_corrupt_cache_is_ignored(trace):
    target = trace.parent / f".{trace.name}.gpuadvise-cache.npz"
    target.write_bytes(b"garbage, not an npz")
    model = loader.load_trace(trace)  # parses, then replaces the bad cache
    assert len(model.kernels) > 0
    with np.load(target, allow_pickle=False) as z:
        assert "__header__" in z
    # an npz whose arrays need pickle (object dtype) is refused, not executed
    np.savez(target, __header__=np.array([object()], dtype=object))
    assert len(loader.load_trace(trace).kernels) > 0

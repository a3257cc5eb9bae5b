"""The reader's two ways through a chunk build the same model: msgspec structs, and the compiled scanner's
flat columns (rows.py). Here the scanner's output is emulated from msgspec's decode of the same bytes
(tests/_scan_emulator.py), so the scanned path is checked on every machine, built scanner or not; with the
real scanner, tests/test_reader_golden.py and tests/test_jsonscan.py check the rest."""

from __future__ import annotations

import json

import pytest

from _corpus_support import TRACES
from _model_digest import GOLDEN, _input_sha, fixture_traces, trace_digest
from _scan_emulator import emulated_scan

from gpuadvise.analyzer.read import rows

GOLDENS: dict = json.loads(GOLDEN.read_text())


@pytest.fixture
def emulated(monkeypatch):
    """Every chunk read the scanned way, from the emulator; counts the chunks it answered."""
    answered = []

    def scan(buf):
        out = emulated_scan(buf)
        answered.append(out is not None)
        return out

    monkeypatch.setattr(rows, "_scan", scan)
    monkeypatch.setattr(rows, "SCAN", True)
    return answered


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory):
    return fixture_traces(tmp_path_factory.mktemp("scanned-fixtures"))


def test_scanned_chunks_give_every_fixtures_golden_model(fixture_files, emulated):
    compared = 0
    for key, path in fixture_files.items():
        want = GOLDENS.get(key)
        if want is None or _input_sha(path) != want["input"]:
            continue
        assert trace_digest(path) == want["model"], f"the scanned path's model of {key} differs"
        compared += 1
    assert compared > 50 and any(emulated)


@pytest.mark.slow
@pytest.mark.skipif(rows._scan is not None, reason="the scanner is built: test_reader_golden reads the corpus through it")
def test_scanned_chunks_give_every_corpus_traces_golden_model(emulated):
    keys = sorted(k for k in GOLDENS if k.startswith("corpus:"))
    compared = 0
    for key in keys:
        path = TRACES / key.split(":", 1)[1]
        if not path.is_file():
            continue
        assert trace_digest(path) == GOLDENS[key]["model"], f"the scanned path's model of {key} differs"
        compared += 1
    if not compared:
        pytest.skip(f"trace corpus not found at {TRACES}")
    assert sum(emulated) > len(emulated) // 2  # the scanned path did the reading, not the struct fallback

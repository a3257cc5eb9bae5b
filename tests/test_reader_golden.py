"""The reader gives the same model as before for every trace we have: the corpus (each file's tables, dtypes,
values and meta, digested by tests/_model_digest.py) and every rule's and mechanism's fixture trace.

The goldens (tests/golden_models/reader_models.json) were made with the reader before it became columnar; a change to
the reader that alters any table of any of these traces fails here. A fixture whose trace bytes changed since
(another rule's fixture edited) is skipped with the command that refreshes its golden.
"""

from __future__ import annotations

import json

import pytest

from _corpus_support import TRACES, XDIST_GROUP, analysed
from _model_digest import GOLDEN, _input_sha, fixture_traces, model_digest, trace_digest

GOLDENS: dict = json.loads(GOLDEN.read_text())
CORPUS = sorted(k for k in GOLDENS if k.startswith("corpus:"))
FIXTURES = sorted(k for k in GOLDENS if not k.startswith("corpus:"))
REFRESH = "python tests/_model_digest.py --update (after checking the reader did not change it)"


@pytest.mark.slow
@pytest.mark.xdist_group(XDIST_GROUP)  # shares test_corpus's / test_consistency's analyses: no second read
@pytest.mark.parametrize("key", CORPUS)
def test_corpus_trace_reads_into_the_same_model(key):
    path = TRACES / key.split(":", 1)[1]
    if not path.is_file():
        pytest.skip(f"trace corpus not found at {TRACES}")
    want = GOLDENS[key]
    assert _input_sha(path) == want["input"], f"{path} is not the file the golden was made from"
    reports = analysed(str(path))
    model = reports[0].model if reports and reports[0].model is not None else None
    got = model_digest(model) if model is not None else trace_digest(path)
    assert got == want["model"], f"the reader's model of {key} changed"


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory):
    return fixture_traces(tmp_path_factory.mktemp("reader-fixtures"))


@pytest.mark.parametrize("key", FIXTURES)
def test_fixture_trace_reads_into_the_same_model(key, fixture_files):
    path = fixture_files.get(key)
    if path is None:
        pytest.skip(f"{key} is no longer a trace fixture; {REFRESH}")
    want = GOLDENS[key]
    if _input_sha(path) != want["input"]:
        pytest.skip(f"{key}'s trace changed since the golden was made; {REFRESH}")
    assert trace_digest(path) == want["model"], f"the reader's model of {key} changed"


def test_a_changed_table_changes_the_digest(fixture_files):
    """The digest sees a single value, a dtype and a category change (it could not pass a broken reader)."""
    from gpuadvise.analyzer.read.loader import load_trace

    model = next(m for m in (load_trace(p, cache=False) for p in fixture_files.values()) if len(m.gpu))
    before = model_digest(model)
    model.gpu.loc[0, "dur"] += 1.0
    after_value = model_digest(model)
    model.gpu.loc[0, "dur"] -= 1.0
    assert model_digest(model) == before
    model.gpu["stream"] = model.gpu["stream"].astype("int32")
    after_dtype = model_digest(model)
    assert len({before, after_value, after_dtype}) == 3

"""docs/rule-api.md is the rule-facing API: every table it documents (model frames, metrics tables,
the what-if replay's frames, Scenario's knobs, Evidence's fields, the run-fact accessors) must list
exactly what the code has. Real tables come from a fixture trace built with the TraceBuilder."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pandas as pd
import pytest

from gpuadvise.analyzer.measure.basics import metrics as measure_metrics
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

DOC = Path(__file__).resolve().parents[1] / "docs" / "rule-api.md"
README = Path(__file__).resolve().parents[1] / "README.md"
SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MODEL_TABLES = ("gpu", "runtime", "cpu", "python", "memory", "syncs", "comms")
METRICS_TABLES = ("per_step", "idle_breakdown", "kernels", "ops", "copies", "copy_summary", "syncs", "launches",
                  "dataloader")


def _first_column(block: str) -> list[str]:
    """The backticked first cells of the first markdown table in `block`."""
    lines = block.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        m = re.match(r"\|\s*`([^`(]+)", ln)
        assert m, f"docs/rule-api.md: a row without a `name` in its first cell: {ln}"
        rows.append(m.group(1))
    return rows


def _doc_tables() -> dict[str, list[str]]:
    """Each `### \\`table\\`` heading's documented columns, and the first table of each numbered section."""
    text = DOC.read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r"^###? (?:`([\w.]+)`|(\d+)\. [^\n]*)\n(.*?)(?=^##|\Z)", text, flags=re.S | re.M):
        key = m.group(1) or f"section {m.group(2)}"
        if "|" in m.group(3):
            out[key] = _first_column(m.group(3))
    return out


@pytest.fixture(scope="module")
def documented():
    return _doc_tables()


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    """A trace with something in every table: steps, DataLoader waits, copies, kernels, collectives,
    `.item()` syncs, stream syncs and memory events."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            b.cpu(SINGLE, 2_000)
            b.copy()
            for _ in range(5):
                b.kernel("ampere_sgemm_128x64_nn", 300)
            b.comm(200)
            b.item()
            b.memory(1 << 20, allocated=8 << 20, reserved=16 << 20)
            b.sync()
    b.finish()
    from gpuadvise.analyzer.read.loader import load_trace

    path = b.write(tmp_path_factory.mktemp("rule-api") / "trace.json.gz")
    model = load_trace(path)
    return Analysis(model, measure_metrics.compute(model))


def _cols(df: pd.DataFrame) -> list[str]:
    return list(df.columns)


def _same(doc: list[str], real: list[str], what: str) -> None:
    assert len(doc) == len(set(doc)), f"{what}: documented twice: {[c for c in doc if doc.count(c) > 1]}"
    missing, extra = sorted(set(real) - set(doc)), sorted(set(doc) - set(real))
    assert not missing and not extra, f"docs/rule-api.md {what}: undocumented {missing}, documented but absent {extra}"


@pytest.mark.parametrize("table", MODEL_TABLES)
def test_model_tables_are_documented(documented, analysis, table):
    df = getattr(analysis.model, table)
    if table in ("gpu", "runtime", "cpu", "memory", "comms"):
        assert len(df), f"the fixture has no model.{table} rows"
    _same(documented[f"model.{table}"], _cols(df), f"model.{table}")


def test_gpu_annotations_have_the_sync_columns(analysis):
    """The doc says so in a sentence instead of a second table."""
    assert _cols(analysis.model.gpu_annotations) == _cols(analysis.model.syncs)


@pytest.mark.parametrize("table", METRICS_TABLES)
def test_metrics_tables_are_documented(documented, analysis, table):
    df = getattr(analysis.metrics, table)
    assert len(df), f"the fixture has no metrics.{table} rows: it would not show the columns of a full table"
    _same(documented[f"metrics.{table}"], _cols(df), f"metrics.{table}")


def test_temporal_keys_are_documented(documented, analysis):
    _same(documented["metrics.temporal"], list(analysis.metrics.temporal), "metrics.temporal")


@pytest.mark.parametrize("table", METRICS_TABLES)
def test_tables_without_gpu_work_keep_their_columns(tmp_path, documented, table):
    """'A table may be empty, never missing': a CPU-only trace gives the same documented columns."""
    from gpuadvise.analyzer.read.loader import load_trace

    b = TraceBuilder()
    with b.step():
        b.cpu("aten::add", 100)
    b.finish()
    model = load_trace(b.write(tmp_path / "cpu.json.gz"))
    _same(documented[f"metrics.{table}"], _cols(getattr(measure_metrics.compute(model), table)), f"metrics.{table} (no GPU)")


@pytest.mark.parametrize("frame", ["calls", "ops"])
def test_replay_frames_scenario_callables_receive_are_documented(documented, analysis, frame):
    replay = analysis.replay
    assert replay is not None and len(getattr(replay, frame))
    _same(documented[f"replay.{frame}"], _cols(getattr(replay, frame)), f"replay.{frame}")


def test_scenario_knobs_are_documented(documented):
    _same(documented["section 5"], [f.name for f in dataclasses.fields(Scenario)], "Scenario knobs")


def test_evidence_fields_are_documented(documented):
    _same(documented["section 8"], [f.name for f in dataclasses.fields(Evidence)], "Evidence fields")


def test_run_fact_accessors_are_documented(documented):
    public = [n for n, f in inspect.getmembers(runfacts, inspect.isfunction)
              if not n.startswith("_") and f.__module__ == runfacts.__name__]
    _same(documented["section 7"], public, "run facts accessors")


def test_run_analysis_fields_are_documented(documented):
    from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis

    public = [n for n in dir(RunAnalysis) if not n.startswith("_") and n != "has"]
    public += [f.name for f in dataclasses.fields(RunAnalysis)]
    _same(documented["section 9"], sorted(set(public)), "RunAnalysis fields")


def test_analysis_fields_are_documented(documented, analysis):
    public = [n for n in dir(analysis) if not n.startswith("_") and n != "has"]
    _same(documented["section 2"], public, "Analysis fields")


def test_readme_links_the_rule_api():
    assert "(docs/rule-api.md)" in README.read_text(encoding="utf-8")

"""gpuadvise on the real traces of the shared corpus (`../shared/traces`, or $GPUADVISE_TRACES).

- every trace and memory snapshot, holdout included, analyses cleanly in all three formats;
- on the open corpus (not holdout), the topics listed in `../shared/checks/labels.json` are reported
  (`must`) or not (`must_not`);
- the DataLoader finding's predicted saving on the kineto ResNet-50 `num_workers=0` trace is within
  25 % of what `num_workers=4` really saved (measured from the paired trace);
- a trace with no GPU events never gets a low-GPU-utilization verdict.

Each file is analysed once per test process, in-process, and shared with test_consistency.py
(tests/_corpus_support.py). Without the corpus the whole module is skipped.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest

from _cli_support import run_cli
from _corpus_support import SNAPSHOT_NAMES, TRACES, XDIST_GROUP, analysed, corpus_files

pytestmark = [pytest.mark.xdist_group(XDIST_GROUP), pytest.mark.slow]  # the whole corpus, and the real command

if not TRACES.is_dir():
    pytest.skip(f"trace corpus not found at {TRACES} (set GPUADVISE_TRACES to its folder)", allow_module_level=True)

LABELS_FILE = TRACES.parent / "checks" / "labels.json"
TRACE_NAMES = (".json", ".json.gz")

NW0 = "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW4 = "kineto/tb_plugin/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
PREDICTION_TOLERANCE = 0.25  # relative


FILES = corpus_files()
OPEN = [f for f in FILES if not f.startswith("holdout/")]
OPEN_TRACES = [f for f in OPEN if f.endswith(TRACE_NAMES)]
LABELS: dict = json.loads(LABELS_FILE.read_text())["cases"] if LABELS_FILE.is_file() else {}

_RENDERED: dict[str, dict] = {}


def report(rel: str) -> dict:
    """One corpus file's analysis (shared, tests/_corpus_support.py) rendered in the three formats, and its notes."""
    if rel not in _RENDERED:
        from gpuadvise.analyzer.report import render

        reports = list(analysed(str(TRACES / rel)))
        out = {fmt: render(reports, fmt) for fmt in ("text", "md", "json")}
        out["doc"] = json.loads(out["json"])
        out["notes"] = [n for r in reports for n in r.notes]
        _RENDERED[rel] = out
    return _RENDERED[rel]


def topics(rel: str) -> set[str]:
    return {f["topic"] for f in report(rel)["doc"]["findings"]}


# A GPU event as torch.profiler writes it (legacy 2021 traces capitalise the category).
_GPU_EVENT = re.compile(rb'"cat"\s*:\s*"(?:kernel|Kernel|gpu_memcpy|Memcpy|gpu_memset|Memset)"')


def has_gpu_events(rel: str) -> bool:
    """Read from the file itself, not through gpuadvise's loader."""
    path = TRACES / rel
    data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    return _GPU_EVENT.search(data) is not None


# ---------------------------------------------------------------------------------------------------


def test_corpus_is_there():
    assert OPEN_TRACES, f"no traces under {TRACES}"
    assert any(f.endswith(SNAPSHOT_NAMES) for f in FILES), "the corpus has memory snapshots"


@pytest.mark.parametrize("rel", FILES)
def test_analyses_in_every_format(rel):
    r = report(rel)
    assert r["md"].startswith("# gpuadvise report\n")
    doc = r["doc"]
    assert doc["tool"] == "gpuadvise"
    assert doc["summary"]["traces"] == 1
    assert isinstance(doc["findings"], list)
    assert r["text"].strip()
    for fmt in ("text", "md", "json"):
        assert "Traceback" not in r[fmt]
    crashed = [n for n in r["notes"] if re.match(r"rule \S+ \(.*\) failed", n)]
    assert not crashed, f"a rule crashed on {rel}: {crashed}"
    for f in doc["findings"]:
        assert 0 <= f["impact"]["est_step_saving_pct"] <= 100, (f["rule"], f["impact"])


def _smallest_trace() -> str:
    return min(OPEN_TRACES, key=lambda f: (TRACES / f).stat().st_size)


@pytest.mark.parametrize("fmt", ["text", "md", "json"])
def test_console_command_on_a_real_trace(tmp_path, fmt):
    """One real subprocess per format (the in-process runs above cover every file)."""
    rel = _smallest_trace()
    run = run_cli("analyze", TRACES / rel, "--format", fmt, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert run.stderr == ""
    if fmt == "json":
        assert json.loads(run.stdout)["tool"] == "gpuadvise"
    elif fmt == "md":
        assert run.stdout.startswith("# gpuadvise report")
    else:
        assert rel.rsplit("/", 1)[-1] in run.stdout


def test_snapshot_through_the_console_command(tmp_path):
    snaps = [f for f in OPEN if f.endswith(SNAPSHOT_NAMES)]
    if not snaps:
        pytest.skip("no memory snapshot in the corpus")
    run = run_cli("analyze", TRACES / snaps[0], "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert json.loads(run.stdout)["traces"][0]["kind"] == "snapshot"


# ---------------------------------------------------------------------------------------------------
# labels


def test_labels_name_corpus_files():
    if not LABELS:
        pytest.skip(f"no labels at {LABELS_FILE}")
    missing = sorted(set(LABELS) - set(OPEN))
    assert not missing, f"labels.json names files that are not in the open corpus: {missing}"


@pytest.mark.parametrize("rel", sorted(LABELS) or ["<no labels>"])
def test_labelled_topics(rel):
    if not LABELS:
        pytest.skip(f"no labels at {LABELS_FILE}")
    if not (TRACES / rel).is_file():
        pytest.fail(f"labelled file {rel} is not in the corpus")
    case = LABELS[rel]
    must, must_not = set(case.get("must", [])), set(case.get("must_not", []))
    found = topics(rel)
    assert not must - found, f"{rel}: missed {sorted(must - found)}; reported {sorted(found)}"
    assert not must_not & found, f"{rel}: must not report {sorted(must_not & found)}"


# ---------------------------------------------------------------------------------------------------
# the prediction against a real fix


def test_dataloader_saving_matches_the_num_workers_4_run():
    from gpuadvise.analyzer.read.loader import load_trace
    from gpuadvise.analyzer.measure.basics.metrics import compute

    for rel in (NW0, NW4):
        if not (TRACES / rel).is_file():
            pytest.skip(f"{rel} not in the corpus")
    median_nw0 = compute(load_trace(TRACES / NW0)).median_step_us
    median_nw4 = compute(load_trace(TRACES / NW4)).median_step_us
    assert median_nw0 > 0 and median_nw4 > 0
    actual = 1 - median_nw4 / median_nw0
    assert actual > 0.1, f"num_workers=4 should have been clearly faster (saved {actual:.1%})"

    dl = [f for f in report(NW0)["doc"]["findings"] if f["topic"] == "dataloader-stall"]
    assert len(dl) == 1, "the num_workers=0 trace must get one dataloader-stall finding"
    predicted = dl[0]["impact"]["est_step_saving_pct"] / 100
    assert abs(predicted - actual) <= PREDICTION_TOLERANCE * actual, (
        f"predicted {predicted:.1%} saved, num_workers=4 really saved {actual:.1%} "
        f"(median step {median_nw0 / 1e3:.1f} → {median_nw4 / 1e3:.1f} ms)")


# ---------------------------------------------------------------------------------------------------


def test_no_utilization_verdict_without_gpu_events():
    no_gpu = [rel for rel in OPEN_TRACES if not has_gpu_events(rel)]
    assert no_gpu, "the open corpus should hold traces without GPU events (CUPTI off, range-profiler mode)"
    wrong = {rel: sorted(topics(rel)) for rel in no_gpu if "low-gpu-utilization" in topics(rel)}
    assert not wrong, f"traces with no GPU events got a low-gpu-utilization verdict: {wrong}"
    silent = [rel for rel in no_gpu if "capture-problem" not in topics(rel)]
    assert not silent, f"traces with no GPU events should get capture-problem: {silent}"


# ---------------------------------------------------------------------------------------------------
# transformer steps: how attention ran, and activation checkpointing


def test_attention_is_told_to_fuse_only_where_it_ran_unfused():
    """Every open trace with attention: a trace whose attention ran only on fused kernels (flash, cuDNN,
    memory-efficient: the H100 runs, the TraceLens Qwen and BERT traces) gets no unfused-attention finding;
    one whose attention a Hugging Face model ran eagerly (matmul → softmax → matmul) gets it, with the
    model's own switch as the fix."""
    from gpuadvise.analyzer.measure.efficiency import attention

    fused_only, unfused = [], []
    for rel in OPEN_TRACES:
        r = next(iter(analysed(str(TRACES / rel))), None)
        if r is None or r.model is None or r.metrics is None:
            continue
        found = attention.find(r.model, r.metrics.launches)
        if found is None:
            assert "unfused-attention" not in topics(rel), rel
            continue
        if found.unfused.empty:
            fused_only.append(rel)
            assert "unfused-attention" not in topics(rel), rel
        elif "unfused-attention" in topics(rel):
            unfused.append(rel)
            f = next(f for f in report(rel)["doc"]["findings"] if f["topic"] == "unfused-attention")
            if set(found.unfused["library"]) == {"transformers"}:
                assert 'attn_implementation="sdpa"' in f["recommendation"], rel
    assert len(fused_only) >= 4 and unfused, (fused_only, unfused)


def test_no_open_trace_is_told_of_a_recompute_it_did_not_run():
    from gpuadvise.analyzer.measure.efficiency import recompute

    for rel in OPEN_TRACES:
        r = next(iter(analysed(str(TRACES / rel))), None)
        if r is None or r.model is None:
            continue
        if recompute.find(r.model) is None:
            assert "unneeded-recompute" not in topics(rel), rel

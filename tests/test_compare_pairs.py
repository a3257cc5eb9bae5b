"""`gpuadvise compare` on the real H100 before/after run folders (`../shared/traces/h100`, see its
README and pairs.json); skipped without them.

How steps and savings are computed is still changing, so these tests check structure and consistency,
not today's numbers: the resolved / new / still-there split agrees with each run's own findings, each
resolved finding's predicted saving is the one BEFORE's own report gives, the measured change is
1 − after/before of the step figures the comparison reports, the run.json differences are the ones in
the two run.json files, and the markdown and HTML show the same figures.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from _cli_support import REPO, call_main
from _compare_support import Page, md_table, self_contained, svg_texts, unescape_md

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
H100 = TRACES / "h100"
if not (H100 / "pairs.json").is_file():
    pytest.skip(f"H100 pairs not found at {H100} (set GPUADVISE_TRACES to the corpus folder)", allow_module_level=True)
# the real H100 run folders; on one xdist worker, which analyses each folder once (`side`)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("compare-pairs")]

from gpuadvise.analyzer.compare import diff as cm  # noqa: E402
from gpuadvise.analyzer.compare.load import load_side  # noqa: E402
from gpuadvise.analyzer.compare.side import Side  # noqa: E402
from gpuadvise.analyzer.report import compare as rc  # noqa: E402

PAIRS = json.loads((H100 / "pairs.json").read_text())["pairs"]


def has_trace(folder: str) -> bool:
    return any(p.name.startswith("trace") for p in (H100 / folder).iterdir())


COMPARABLE = sorted(k for k, p in PAIRS.items() if has_trace(p["before"]) and has_trace(p["after"]))
NO_TRACE = sorted(k for k, p in PAIRS.items() if not has_trace(p["after"]))

_SIDES: dict[str, Side] = {}


def side(folder: str) -> Side:
    """Each run folder analysed once per session (tf32-before is in two pairs)."""
    if folder not in _SIDES:
        _SIDES[folder] = load_side(str(H100 / folder), jobs=1)
    return _SIDES[folder]


def pair(name: str) -> tuple[Side, Side, dict]:
    p = PAIRS[name]
    b, a = side(p["before"]), side(p["after"])
    return b, a, cm.compare(b, a)


def test_the_corpus_has_comparable_pairs():
    assert len(COMPARABLE) >= 10


@pytest.mark.parametrize("name", COMPARABLE)
def test_classification_agrees_with_each_sides_own_findings(name):
    b, a, cmp = pair(name)
    rb = {f.rule for f in b.summary.findings}
    ra = {f.rule for f in a.summary.findings}
    f = cmp["findings"]
    only_b = {e["rule"] for e in f["resolved"]} | {e["rule"] for e in f["unchecked"] if e["before"]}
    only_a = {e["rule"] for e in f["new"]} | {e["rule"] for e in f["unchecked"] if e["after"]}
    assert only_b == rb - ra
    assert only_a == ra - rb
    assert {e["rule"] for e in f["still_there"]} == rb & ra
    for e in f["unchecked"]:
        assert e["note"].startswith("not checked on")


@pytest.mark.parametrize("name", COMPARABLE)
def test_predicted_is_befores_own_and_measured_is_one_minus_after_over_before(name):
    b, a, cmp = pair(name)
    st = cmp["step_time"]
    assert st["figure"] in ("profiled", "unprofiled")
    key = "median_step_ms" if st["figure"] == "profiled" else "unprofiled_median_step_ms"
    assert (st["before_ms"], st["after_ms"]) == (cmp["before"][key], cmp["after"][key])
    assert st["saving_pct"] == pytest.approx(100 * (1 - st["after_ms"] / st["before_ms"]), abs=0.005)
    if cmp["before"].get("unprofiled_median_step_ms") and cmp["after"].get("unprofiled_median_step_ms"):
        assert st["figure"] == "unprofiled"  # when both runs recorded it, the unprofiled figure is the measure
    lead = {}
    for f in b.summary.findings:
        lead.setdefault(f.rule, f)
    # every BEFORE finding's prediction: the resolved ones first, then those still there
    f = cmp["findings"]
    assert [(p["rule"], p["status"]) for p in cmp["predictions"]] == (
        [(e["rule"], "resolved") for e in f["resolved"]] + [(e["rule"], "still there") for e in f["still_there"]])
    for p in cmp["predictions"]:
        assert p["predicted_pct"] == lead[p["rule"]].impact.est_step_saving_pct
        assert p["measured_saving_pct"] == st["saving_pct"]
    md = rc.render_markdown(cmp)
    for p in cmp["predictions"]:
        assert f"{p['topic']} predicted {rc.predicted(p)} (" in md
        assert rc.md_text(rc.prediction_sentence(p, st)) in md


@pytest.mark.parametrize("name", COMPARABLE)
def test_run_json_differences_are_those_of_the_two_files(name):
    b, a, cmp = pair(name)
    fb = json.loads((H100 / PAIRS[name]["before"] / "run.json").read_text())
    fa = json.loads((H100 / PAIRS[name]["after"] / "run.json").read_text())
    env = {r["key"]: (r["before"], r["after"]) for r in cmp["environment"]}
    assert env["argv"] == (" ".join(fb["argv"][1:]), " ".join(fa["argv"][1:]))
    for i, (db, da) in enumerate(zip(fb["dataloaders"], fa["dataloaders"])):
        for k in db.keys() - {"created_at"}:
            assert (f"dataloader[{i}].{k}" in env) == (db[k] != da.get(k))
    for k, v in fb["settings"].items():
        assert (f"settings.{k}" in env) == (v != fa["settings"].get(k))
    for i, (ob, oa) in enumerate(zip(fb["optimizers"], fa["optimizers"])):
        for k in ob.keys() - {"id"}:
            assert (f"optimizer[{i}].{k}" in env) == (ob[k] != oa.get(k))
    # one GPU, one setup: nothing about the device or the profiler may be flagged
    assert not [w for w in cmp["warnings"] if "device" in w or "profiler was set up" in w or "scripts" in w]


def test_the_loader_fix_is_listed_with_its_settings():
    _, _, cmp = pair("loader")
    env = {r["key"]: (r["before"], r["after"]) for r in cmp["environment"]}
    assert env["dataloader[0].num_workers"] == (0, 8)


def test_a_pair_without_an_after_trace_is_bad_input(capsys):
    if not NO_TRACE:
        pytest.skip("every pair has both traces")
    p = PAIRS[NO_TRACE[0]]  # launch-after: a CUDA-graph loop that never stepped the profiler
    rc_, out, err = call_main(capsys, "compare", H100 / p["before"], H100 / p["after"])
    assert rc_ == 2 and out == ""
    assert "no trace" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["healthy", "loader"])
def test_regression_gate_follows_the_reported_change(capsys, name):
    p = PAIRS[name]
    rc_, out, err = call_main(capsys, "compare", H100 / p["before"], H100 / p["after"], "--format", "json",
                              "--fail-on-regression", "0")
    doc = json.loads(out)
    slower = doc["step_time"]["change_pct"] > 0
    assert rc_ == (1 if slower else 0), err
    assert doc["gate"]["regressed"] is slower


def test_markdown_charts_and_html_agree_on_a_real_pair(capsys, tmp_path):
    p = PAIRS["optimizer"]
    b, a = H100 / p["before"], H100 / p["after"]
    rc_, _, err = call_main(capsys, "compare", b, a, "-o", tmp_path / "opt.md")
    assert rc_ == 0, err
    rc_, _, err = call_main(capsys, "compare", b, a, "-o", tmp_path / "opt.html")
    assert rc_ == 0, err
    md = (tmp_path / "opt.md").read_text()
    page = Page((tmp_path / "opt.html").read_text())
    self_contained(page)
    charts = sorted(tmp_path.glob("opt-*.svg"))
    assert charts and all(f"]({c.name})" in md for c in charts)
    svgs = {c.name: svg_texts(c.read_text()) for c in charts}
    assert sorted(map(tuple, page.svgs)) == sorted(map(tuple, svgs.values()))
    rows = {r[0]: r for r in md_table(md, "## Step time")}
    steps = svgs["opt-steps.svg"]
    assert steps[steps.index("BEFORE profiled") + 1].startswith(rows["Median step, profiled (ms)"][1] + " ms")
    assert steps[steps.index("AFTER profiled") + 1].startswith(rows["Median step, profiled (ms)"][2] + " ms")
    want = [[unescape_md(c) for c in row] for row in md_table(md, "## Step time")]
    assert any(t[1:] == want for t in page.tables)
    assert re.search(r"the step got \d+\.\d % (faster|slower)", md)

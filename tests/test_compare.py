"""`gpuadvise compare` on builder run folders (tests/_compare_support.py): the comparison model
(step time, findings resolved / new / still there / not checked, predicted vs measured, kernels, run
facts, warnings), its CI gate and exit codes, and its reports: text, JSON, markdown with SVG charts
beside it, and the self-contained HTML page, whose charts and tables must show the markdown's numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from _cli_support import call_main
from _compare_support import (A100, Page, md_table, run_folder, run_json, sections_with_tables, self_contained,
                              svg_texts, unescape_md, with_figures)
from gpuadvise.analyzer.compare import diff as cm
from gpuadvise.analyzer.compare.gate import apply_gate
from gpuadvise.analyzer.compare.load import load_side
from gpuadvise.analyzer.compare.side import Side
from gpuadvise.analyzer.model.findings import Finding
from gpuadvise.analyzer.report import compare as rc

# ----------------------------------------------------------------------------------------------------
# Fixtures: each run folder written and analysed once


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {v: run_folder(root, v) for v in ("stall", "fixed", "clean", "slow")}


@pytest.fixture(scope="module")
def sides(runs) -> dict[str, Side]:
    return {name: load_side(str(path)) for name, path in runs.items()}


@pytest.fixture(scope="module")
def fix(sides) -> dict:
    """stall → fixed: the DataLoader wait is gone."""
    return cm.compare(sides["stall"], sides["fixed"])


@pytest.fixture(scope="module")
def regress(sides) -> dict:
    """clean → slow: fp32 SIMT GEMMs, twice as long."""
    return cm.compare(sides["clean"], sides["slow"])


def rules(side: Side) -> set[str]:
    return {f.rule for f in side.summary.findings}


def lead(side: Side, rule: str) -> Finding:
    """The side's own finding of `rule` that leads its report (the biggest saving first)."""
    return next(f for f in side.summary.findings if f.rule == rule)


# ----------------------------------------------------------------------------------------------------
# The model


def test_findings_are_matched_by_rule_consistently_with_each_sides_own_findings(sides, fix, regress):
    for cmp, b, a in ((fix, sides["stall"], sides["fixed"]), (regress, sides["clean"], sides["slow"])):
        f = cmp["findings"]
        got = {k: {e["rule"] for e in f[k]} for k in f}
        assert got["resolved"] | {e["rule"] for e in f["unchecked"] if e["before"]} == rules(b) - rules(a)
        assert got["new"] | {e["rule"] for e in f["unchecked"] if e["after"]} == rules(a) - rules(b)
        assert got["still_there"] == rules(b) & rules(a)
        assert got["unchecked"] == set()  # both sides of both pairs are plain traces: every rule ran on both


def test_the_fix_resolves_the_stall_and_the_regression_is_a_new_finding(fix, regress):
    assert "dataloader-stall" in {e["topic"] for e in fix["findings"]["resolved"]}
    assert "dataloader-stall" not in {e["topic"] for e in fix["findings"]["new"] + fix["findings"]["still_there"]}
    assert [e["topic"] for e in regress["findings"]["new"]] == ["no-tensor-cores"]
    assert regress["findings"]["resolved"] == []


def test_still_there_shows_how_its_numbers_moved(sides, fix):
    still = {e["rule"]: e for e in fix["findings"]["still_there"]}
    assert still, "the .item() sync is in both runs: something must still be there"
    for rule, e in still.items():
        b, a = lead(sides["stall"], rule), lead(sides["fixed"], rule)
        assert e["before"]["est_step_saving_pct"] == b.impact.est_step_saving_pct
        assert e["after"]["est_step_saving_pct"] == a.impact.est_step_saving_pct
        assert (e["before"]["severity"], e["after"]["severity"]) == (b.severity, a.severity)
        for n in e["numbers"]:
            assert n["before"] == b.evidence.numbers[n["key"]]
            assert n["after"] == a.evidence.numbers[n["key"]]


def test_each_resolved_finding_pairs_its_prediction_with_the_measured_change(sides, fix):
    st = fix["step_time"]
    assert st["figure"] == "profiled"  # the builder runs have no unprofiled step times
    b, a = fix["before"]["median_step_ms"], fix["after"]["median_step_ms"]
    assert (st["before_ms"], st["after_ms"]) == (b, a)
    assert st["saving_pct"] == pytest.approx(100 * (1 - a / b), abs=0.005)
    assert st["change_pct"] == pytest.approx(-st["saving_pct"], abs=0.005)
    assert b == sides["stall"].head.figures.median_step_ms
    # every finding of BEFORE beside the measured change: the resolved ones, then those still there
    assert [p["rule"] for p in fix["predictions"]] == [e["rule"] for e in fix["findings"]["resolved"]] + [
        e["rule"] for e in fix["findings"]["still_there"]]
    for p in fix["predictions"]:
        assert p["predicted_pct"] == lead(sides["stall"], p["rule"]).impact.est_step_saving_pct
        assert p["measured_saving_pct"] == st["saving_pct"]
        assert (not p["changed"] or p["applied"]) and not p["worse"]


def test_step_spread_comes_from_the_profiled_steps(sides, fix):
    b = fix["before"]
    steps = sides["stall"].steps_ms
    assert b["steps"] == len(steps) == 4
    assert (b["min_step_ms"], b["max_step_ms"]) == (min(steps), max(steps))
    assert b["min_step_ms"] <= b["median_step_ms"] <= b["max_step_ms"]


def test_unprofiled_figures_are_preferred_when_both_runs_have_them_and_said(sides):
    before = with_figures(sides["stall"], unprofiled_median_step_ms=25.0)
    after = with_figures(sides["fixed"], unprofiled_median_step_ms=20.0)
    st = cm.compare(before, after)["step_time"]
    assert (st["figure"], st["before_ms"], st["after_ms"], st["saving_pct"]) == ("unprofiled", 25.0, 20.0, 20.0)
    md = rc.render_markdown(cm.compare(before, after))
    assert "unprofiled median step" in md and "the step got 20.0 % faster" in md

    after = with_figures(after, unprofiled_median_step_ms=None)  # one side only: like for like is profiled
    cmp = cm.compare(before, after)
    assert cmp["step_time"]["figure"] == "profiled"
    assert any("only BEFORE has an unprofiled step time" in w for w in cmp["warnings"])


def test_a_fix_that_made_the_step_slower_is_named_beside_its_prediction(sides):
    """The stall's fix (num_workers 0 → 8 in run.json, the finding resolved) with an unprofiled step that got
    twice as long: the comparison says which fix made training slower, with what it predicted; a finding
    that went without its fix's facts changing (host-sync here) is shown with its prediction, not blamed."""
    before = with_figures(sides["stall"], unprofiled_median_step_ms=3.96)
    after = with_figures(sides["fixed"], unprofiled_median_step_ms=8.31)
    cmp = cm.compare(before, after)
    by_topic = {p["topic"]: p for p in cmp["predictions"]}
    stall = by_topic["dataloader-stall"]
    assert stall["applied"] and stall["worse"] and stall["status"] == "resolved"
    assert {c["key"] for c in stall["changed"]} >= {"dataloader[0].num_workers"}
    assert not by_topic["host-sync"]["worse"] and not by_topic["host-sync"]["applied"]
    text, md = rc.render_text(cmp), rc.render_markdown(cmp)
    for out in (text, md):
        assert "the step got 109.8 % slower" in out
        verdict = next(line for line in out.splitlines() if line.lstrip("*").startswith("The step got 109.8 % slower"))
        assert f"dataloader-stall's fix (predicted to save {rc.predicted(stall)})" in verdict
        assert "made training slower" in verdict and "host-sync" not in verdict
        assert "dataloader[0].num_workers 0 → 8" in out
    assert "this fix made training slower" in md.split("## Predicted vs measured", 1)[1]


def test_kernels_that_changed_most_are_per_step_and_sorted(regress):
    rows = regress["kernels"]
    assert rows, "the GEMMs changed kernel"
    changes = [abs(r["change_ms_per_step"]) for r in rows]
    assert changes == sorted(changes, reverse=True)
    by_name = {r["name"]: r for r in rows}
    assert by_name["ampere_sgemm_128x64_nn"]["status"] == "new"
    assert by_name["ampere_sgemm_128x64_nn"]["after_count_per_step"] == 40  # 40 GEMMs in each of 4 steps
    assert by_name["ampere_tf32_s1688gemm_64x64_nn"]["status"] == "gone"
    for r in rows:
        assert r["change_ms_per_step"] == pytest.approx(r["after_ms_per_step"] - r["before_ms_per_step"], abs=0.0015)


def test_environment_lists_what_differs_in_run_json_and_nothing_else(fix, regress):
    env = {r["key"]: (r["before"], r["after"]) for r in fix["environment"]}
    assert env["dataloader[0].num_workers"] == (0, 8)
    assert env["dataloader[0].pin_memory"] == (False, True)
    assert "dataloader[0].created_at" not in env and "optimizer[0].id" not in env  # differ in any two runs
    assert "environment.torch" not in env  # the same in both
    assert {r["key"]: (r["before"], r["after"]) for r in regress["environment"]}["settings.matmul_allow_tf32"] == (True, False)


def test_same_setup_has_no_warnings(fix):
    assert fix["warnings"] == []


def test_a_device_or_script_mismatch_is_said_first(tmp_path):
    b = run_folder(tmp_path, "clean", name="a100")
    a = run_folder(tmp_path, "clean", name="h100", device="NVIDIA H100 80GB HBM3",
                   facts=run_json(8, device="NVIDIA H100 80GB HBM3", script="train_v2.py"))
    cmp = cm.compare(load_side(str(b)), load_side(str(a)))
    assert any("different devices" in w and A100 in w and "H100" in w for w in cmp["warnings"])
    assert any("different scripts" in w and "train_v2.py" in w for w in cmp["warnings"])
    md = rc.render_markdown(cmp)
    first_section = md.index("## ")
    assert md.index("different devices") < first_section and md.index("different scripts") < first_section
    text = rc.render_text(cmp)
    assert text.index("warning: different devices") < text.index("Median step")


def test_a_memory_finding_without_the_snapshot_on_the_other_side_is_not_called_resolved(tmp_path):
    from gpuadvise.rules import find_rule

    before = run_folder(tmp_path, "clean", name="with-snapshot")
    find_rule("memory-fragmentation").positive().write(before / "memory.pickle")
    after = run_folder(tmp_path, "clean", name="no-snapshot")
    sb, sa = load_side(str(before)), load_side(str(after))
    assert "GA120" in rules(sb)
    cmp = cm.compare(sb, sa)
    unchecked = {e["rule"]: e for e in cmp["findings"]["unchecked"]}
    assert "GA120" in unchecked and "allocator snapshot" in unchecked["GA120"]["note"]
    assert "GA120" not in {e["rule"] for e in cmp["findings"]["resolved"]}
    assert any("only BEFORE has an allocator snapshot" in w for w in cmp["warnings"])


# ----------------------------------------------------------------------------------------------------
# The gate and exit codes


def test_compare_exits_0_and_prints_the_verdict(capsys, runs):
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"])
    assert rc_ == 0, err
    assert re.search(r"The step got \d+\.\d % faster", out)
    assert "dataloader-stall predicted" in out


@pytest.mark.parametrize("pct, code", [("5", 1), ("5%", 1), ("150", 0)])
def test_fail_on_regression(capsys, runs, pct, code):
    rc_, out, err = call_main(capsys, "compare", runs["clean"], runs["slow"], "--fail-on-regression", pct, "-f", "json")
    doc = json.loads(out)
    slower = doc["step_time"]["change_pct"]
    assert 5 < slower < 150, "the slow loop's GEMMs take twice as long: about +99 %"
    assert rc_ == code, err
    assert doc["gate"]["regressed"] is (code == 1) and doc["gate"]["failed"] is (code == 1)
    if code:
        assert "slower" in err and len(err.strip().splitlines()) == 1


def test_a_faster_step_passes_the_regression_gate(capsys, runs):
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "--fail-on-regression", "0")
    assert rc_ == 0, err
    assert "CI gate passed" in out


@pytest.mark.parametrize("fail_on, code", [("high", 1), ("low", 1), ("no-tensor-cores", 1), ("GA106", 1),
                                           ("dataloader-stall", 0), ("host-sync,launch-bound", 0)])
def test_fail_on_new_findings(capsys, runs, fail_on, code):
    rc_, out, err = call_main(capsys, "compare", runs["clean"], runs["slow"], "--fail-on", fail_on)
    assert rc_ == code, err
    if code:
        assert "GA106" in err


def test_fail_on_ignores_findings_that_were_already_there(capsys, runs):
    # the fixed run still has a finding, but it was there before: not new, no failure
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "--fail-on", "info", "-f", "json")
    doc = json.loads(out)
    assert doc["findings"]["still_there"] and not doc["findings"]["new"]
    assert rc_ == 0, err


@pytest.mark.parametrize("args, words", [
    (["--fail-on", "bogus"], ["bogus", "high", "dataloader-stall"]),
    (["--fail-on-regression", "abc"], ["--fail-on-regression"]),
    (["--fail-on-regression", "-3"], ["--fail-on-regression"]),
])
def test_bad_gate_values_are_one_line_errors(capsys, runs, args, words):
    rc_, out, err = call_main(capsys, "compare", runs["clean"], runs["slow"], *args)
    assert rc_ == 2
    assert out == "" and len(err.strip().splitlines()) == 1
    assert all(w in err for w in words)


def test_bad_paths_exit_2_in_one_line(capsys, runs, tmp_path):
    (tmp_path / "empty-run").mkdir()
    (tmp_path / "empty-run" / "run.json").write_text("{}")
    for args in ([runs["clean"], tmp_path / "missing"], [tmp_path / "empty-run", runs["clean"]]):
        rc_, out, err = call_main(capsys, "compare", *args)
        assert rc_ == 2, err
        assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith("gpuadvise: error:")


def test_a_bug_exits_3_in_one_line(capsys, runs, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.delenv("GPUADVISE_DEBUG", raising=False)
    monkeypatch.setattr(cm, "compare", broken)
    rc_, out, err = call_main(capsys, "compare", runs["clean"], runs["slow"])
    assert rc_ == 3
    assert "internal error" in err and "boom" in err and len(err.strip().splitlines()) == 1


def test_the_gate_needs_step_times(sides):
    from gpuadvise.analyzer.errors import InputError

    no_steps = with_figures(sides["clean"], steps=0)
    cmp = cm.compare(no_steps, sides["slow"])
    assert cmp["step_time"]["saving_pct"] is None and "no step time" in cmp["warnings"][0]
    with pytest.raises(InputError):
        apply_gate(cmp, None, 5.0)


# ----------------------------------------------------------------------------------------------------
# Reports: text, JSON, markdown + SVG, HTML


def test_json_is_the_comparison(capsys, runs, fix):
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "--format", "json")
    assert rc_ == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "compare" and set(doc["findings"]) == {"resolved", "new", "still_there", "unchecked"}
    assert doc["step_time"] == fix["step_time"] and doc["predictions"] == fix["predictions"]
    assert "gate" not in doc  # no gate asked for


def test_markdown_on_stdout_writes_no_files(capsys, runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "--format", "md")
    assert rc_ == 0, err
    assert out.startswith("# gpuadvise compare") and "![" not in out
    assert list(tmp_path.iterdir()) == []


def test_markdown_file_has_svg_charts_beside_it_with_the_same_numbers(capsys, runs, tmp_path, sides):
    out_md = tmp_path / "cmp.md"
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "-o", out_md)
    assert rc_ == 0, err
    md = out_md.read_text()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["cmp-breakdown.svg", "cmp-predictions.svg", "cmp-steps.svg", "cmp.md"]
    for n in names[:-1]:
        assert f"]({n})" in md

    step = {r[0]: r for r in md_table(md, "## Step time")}
    texts = svg_texts((tmp_path / "cmp-steps.svg").read_text())
    for side, col in (("BEFORE", 1), ("AFTER", 2)):
        label = texts.index(f"{side} profiled")
        assert texts[label + 1] == f"{step['Median step, profiled (ms)'][col]} ms ({step['Fastest – slowest step (ms)'][col]})"

    split = {r[0]: r for r in md_table(md, "## Median step split")}
    texts = svg_texts((tmp_path / "cmp-breakdown.svg").read_text())
    assert [t for t in texts if t.endswith(" ms")] == [f"{split['step'][1]} ms", f"{split['step'][2]} ms"]

    preds = md_table(md, "## Predicted vs measured")
    texts = svg_texts((tmp_path / "cmp-predictions.svg").read_text())
    for row in preds:  # finding, on AFTER, predicted on BEFORE, measured
        rule = unescape_md(row[0].split()[0])
        assert texts[texts.index(f"{rule} {row[0].split()[1]} predicted") + 1] == row[2]
        impact = lead(sides["stall"], rule).impact
        assert row[2] == ("up to " if impact.upper_bound else "") + f"{impact.est_step_saving_pct:.1f} %"
    measured = re.search(r"the step got (\d+\.\d) % faster", preds[0][3]).group(1)
    assert texts[texts.index("measured") + 1] == f"{measured} % faster"


def test_html_is_one_self_contained_page_with_the_markdowns_numbers(capsys, runs, tmp_path):
    rc_, md, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "--format", "md")
    assert rc_ == 0, err
    out_html = tmp_path / "cmp.html"
    rc_, out, err = call_main(capsys, "compare", runs["stall"], runs["fixed"], "-o", out_html)
    assert rc_ == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp.html"]  # one file, nothing beside it
    page = Page(out_html.read_text())
    self_contained(page)
    assert len(page.svgs) == 3
    # every table of the markdown is in the page, cell for cell
    headings = sections_with_tables(md)
    assert {"## Step time", "## Median step split", "## Predicted vs measured", "## What differs between the runs"} <= set(headings)
    for heading in headings:
        want = [[unescape_md(c) for c in row] for row in md_table(md, heading)]
        assert any(table[1:] == want for table in page.tables), heading
    # and the charts are the ones written beside a markdown report
    call_main(capsys, "compare", runs["stall"], runs["fixed"], "-o", tmp_path / "r.md")
    for name, texts in zip(("steps", "breakdown", "predictions"), page.svgs):
        assert texts == svg_texts((tmp_path / f"r-{name}.svg").read_text())


def test_trace_text_is_escaped_in_markdown_html_and_svg(tmp_path):
    hostile = "<script>alert(1)</script>|*x*\x1b[31m"
    b = run_folder(tmp_path, "clean")
    a = run_folder(tmp_path, "clean", name="hostile", extra_kernel=hostile)
    cmp = cm.compare(load_side(str(b)), load_side(str(a)))
    assert any(r["name"] == hostile for r in cmp["kernels"])
    html = rc.render_html(cmp)
    page = Page(html)
    self_contained(page)
    assert "<script>alert(1)</script>|*x*" in "".join(page.text)  # shown as text, never as a tag
    assert "\x1b" not in html
    md = rc.render_markdown(cmp)
    assert "\x1b" not in md
    from markdown_it import MarkdownIt

    # rendered even by a renderer that passes raw HTML through, the name stays text (it is in a code span)
    as_rendered = Page(MarkdownIt("commonmark", {"html": True}).enable("table").render(md))
    assert "script" not in as_rendered.tags and "<script>alert(1)</script>" in "".join(as_rendered.text)
    for c in rc.charts(cmp):
        svg_texts(c.svg)  # well-formed
    assert "\x1b" not in rc.render_text(cmp)


def test_plain_traces_compare_without_run_facts(tmp_path):
    from _compare_support import training

    b = training(stall_us=20_000).write(tmp_path / "before.json.gz")
    a = training().write(tmp_path / "after.json.gz")
    cmp = cm.compare(load_side(str(b)), load_side(str(a)))
    assert cmp["warnings"] == []
    assert cmp["environment"] == []  # no run.json on either side: nothing to say, and nothing invented
    assert "dataloader-stall" in {e["topic"] for e in cmp["findings"]["resolved"]}


def test_folders_of_rank_traces_compare_by_the_slowest_rank(tmp_path):
    from _cli_support import write_rank_folder

    b = write_rank_folder(tmp_path / "balanced", stall_us=(0.0, 0.0))
    a = write_rank_folder(tmp_path / "straggler", stall_us=(0.0, 4_000.0))
    sb, sa = load_side(str(b), jobs=1), load_side(str(a), jobs=1)
    cmp = cm.compare(sb, sa)
    assert cmp["after"]["traces"] == 2 and cmp["after"]["rank"] == 1  # the straggler sets the job's pace
    assert cmp["after"]["median_step_ms"] == max(t.figures.median_step_ms for t in sa.summary.traces)
    assert "straggler" in {e["topic"] for e in cmp["findings"]["new"]}
    assert "slowest, rank 1" in rc.render_markdown(cmp) and "slowest, rank 1" in rc.render_text(cmp)

"""`gpuadvise analyze`: the `--fail-on` gate (exit 1, apart from bad input 2), the SVG charts written
beside a markdown report, and `--format html`, whose tables and charts must show the markdown's numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from _cli_support import call_main, write_rank_folder
from _compare_support import Page, md_table, sections_with_tables, self_contained, svg_texts, training, unescape_md


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    return {"stall": training(stall_us=20_000, item=True).write(root / "stall.json"),
            "fixed": training(item=True).write(root / "fixed.json"),
            "clean": training().write(root / "clean.json")}


def findings(capsys, path) -> list[dict]:
    rc, out, err = call_main(capsys, "analyze", path, "--format", "json")
    assert rc == 0, err
    return json.loads(out)["findings"]


# ----------------------------------------------------------------------------------------------------
# --fail-on


@pytest.mark.parametrize("fail_on", ["high", "medium", "low", "info", "dataloader-stall", "host-sync,launch-bound",
                                     "GA102", "pageable-memcpy", "no-tensor-cores", "HIGH"])
@pytest.mark.parametrize("trace", ["stall", "fixed", "clean"])
def test_fail_on_exits_1_exactly_when_such_a_finding_is_reported(capsys, traces, trace, fail_on):
    order = ["high", "medium", "low", "info"]
    words = [w.lower() for w in fail_on.split(",")]

    def matches(f):
        at_or_above = [w for w in words if w in order]
        return (any(order.index(f["severity"]) <= order.index(w) for w in at_or_above)
                or f["topic"] in words or f["rule"].lower() in words)

    expected = 1 if any(matches(f) for f in findings(capsys, traces[trace])) else 0
    rc, out, err = call_main(capsys, "analyze", traces[trace], "--fail-on", fail_on)
    assert rc == expected, err
    assert out, "the report is printed whatever the gate says"
    if expected:
        assert err.startswith(f"gpuadvise: --fail-on {fail_on}:") and len(err.strip().splitlines()) == 1
    else:
        assert err == ""


def test_the_fixtures_exercise_both_outcomes(capsys, traces):
    # the parametrised test above means something only if some cases fail and some pass
    assert {f["severity"] for f in findings(capsys, traces["stall"])} >= {"high"}
    assert {f["severity"] for f in findings(capsys, traces["fixed"])} == {"low"}
    assert findings(capsys, traces["clean"]) == []


def test_fail_on_still_writes_the_report(capsys, traces, tmp_path):
    out = tmp_path / "r.json"
    rc, _, err = call_main(capsys, "analyze", traces["stall"], "--fail-on", "high", "-o", out)
    assert rc == 1
    assert json.loads(out.read_text())["findings"]


@pytest.mark.parametrize("value", ["bogus", "hgh", ",", "dataloader-stall,nope"])
def test_an_unknown_fail_on_value_is_a_one_line_error_listing_the_valid_ones(capsys, traces, value):
    rc, out, err = call_main(capsys, "analyze", traces["stall"], "--fail-on", value)
    assert rc == 2
    assert out == "" and len(err.strip().splitlines()) == 1
    assert all(w in err for w in ("high", "medium", "low", "info", "dataloader-stall", "straggler"))


# ----------------------------------------------------------------------------------------------------
# Charts beside a markdown report, and the HTML page


def test_markdown_to_stdout_is_unchanged_by_charts(capsys, traces, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = call_main(capsys, "analyze", traces["stall"], "--format", "md")
    assert rc == 0, err
    assert "![" not in out and list(tmp_path.iterdir()) == []


def test_markdown_file_gets_step_and_saving_charts_with_the_same_numbers(capsys, traces, tmp_path):
    out = tmp_path / "report.md"
    rc, _, err = call_main(capsys, "analyze", traces["stall"], "-o", out)
    assert rc == 0, err
    md = out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report-savings.svg", "report-steps.svg", "report.md"]
    assert "](report-savings.svg)" in md and "](report-steps.svg)" in md

    steps = md_table(md, "## Steps")
    texts = svg_texts((tmp_path / "report-steps.svg").read_text())
    assert len(steps) == 4
    for row in steps:  # | #3 | 32.02 | ...: the chart labels the bar "#3" and writes "32.02 ms" after it
        assert texts[texts.index(row[0]) + 1] == f"{row[1]} ms"

    summary = md_table(md, "## Summary")
    texts = svg_texts((tmp_path / "report-savings.svg").read_text())
    doc = json.loads(call_main(capsys, "analyze", traces["stall"], "--format", "json")[1])
    shown = [f for f in doc["findings"] if f["impact"]["est_step_saving_pct"] > 0]
    assert len(shown) == len([r for r in summary if r[4] not in ("0.0 %", "up to 0.0 %")])
    for f, row in zip(shown, summary):
        assert texts[texts.index(f"{f['rule']} {f['topic']}") + 1] == row[4]


def test_a_job_gets_one_step_chart_per_rank(capsys, tmp_path):
    job = write_rank_folder(tmp_path / "job", stall_us=(0.0, 4_000.0))
    out = tmp_path / "job.md"
    rc, _, err = call_main(capsys, "analyze", job, "-o", out, "-j", "1")
    assert rc == 0, err
    charts = sorted(p.name for p in tmp_path.glob("job-steps-*.svg"))
    assert charts == ["job-steps-1.svg", "job-steps-2.svg"]
    titles = [svg_texts((tmp_path / c).read_text())[0] for c in charts]
    assert titles == ["Step time split — rank 0 (ms)", "Step time split — rank 1 (ms)"]


def test_html_page_has_the_markdowns_tables_and_charts(capsys, traces, tmp_path):
    rc, md, err = call_main(capsys, "analyze", traces["stall"], "--format", "md")
    assert rc == 0, err
    call_main(capsys, "analyze", traces["stall"], "-o", tmp_path / "r.md")
    out = tmp_path / "report.html"
    rc, _, err = call_main(capsys, "analyze", traces["stall"], "-o", out)
    assert rc == 0, err
    page = Page(out.read_text())
    self_contained(page)
    headings = sections_with_tables(md)
    assert {"## Summary", "## Steps", "## Top kernels"} <= set(headings)
    for heading in headings:
        want = [[unescape_md(c) for c in row] for row in md_table(md, heading)]
        assert any(table[1:] == want for table in page.tables), heading
    assert page.svgs == [svg_texts((tmp_path / f"r-{n}.svg").read_text()) for n in ("savings", "steps")]
    assert re.search(r"<title>gpuadvise report</title>", out.read_text())


def test_html_to_stdout_by_format(capsys, traces):
    rc, out, err = call_main(capsys, "analyze", traces["clean"], "--format", "html")
    assert rc == 0, err
    self_contained(Page(out))


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_markdown_to_a_device_writes_no_chart_files_beside_it(capsys, traces, command):
    args = [traces["stall"]] if command == "analyze" else [traces["stall"], traces["fixed"]]
    rc, out, err = call_main(capsys, command, *args, "--format", "md", "-o", "/dev/null")
    strays = sorted(Path("/dev").glob("null-*.svg"))
    for p in strays:  # never leave them in /dev, even when this test fails
        p.unlink()
    assert rc == 0, err
    assert strays == []

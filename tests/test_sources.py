"""What a folder on the command line turns into: traces, their ranks, their run facts."""

import json

from gpuadvise.analyzer.read.sources import resolve
from gpuadvise.rules import find_rule


def test_multi_rank_run_folder_pairs_each_trace_with_its_own_run_json(tmp_path):
    stall = find_rule("dataloader-stall").positive()
    stall.write(tmp_path / "trace.json.gz")
    stall.write(tmp_path / "trace.rank1.json.gz")
    (tmp_path / "run.json").write_text(json.dumps({"rank": 0, "dataloaders": [{"created_at": "train.py:10"}]}))
    (tmp_path / "run.rank1.json").write_text(json.dumps({"rank": 1, "dataloaders": [{"created_at": "train.py:11"}]}))
    sources = resolve([str(tmp_path)])
    assert sorted(s.path.name for s in sources) == ["trace.json.gz", "trace.rank1.json.gz"]  # run*.json are no traces
    by_name = {s.path.name: s for s in sources}
    assert by_name["trace.rank1.json.gz"].rank == 1
    assert by_name["trace.rank1.json.gz"].facts["dataloaders"][0]["created_at"] == "train.py:11"
    assert by_name["trace.json.gz"].facts["dataloaders"][0]["created_at"] == "train.py:10"


def _run_folder(d):
    d.mkdir()
    find_rule("dataloader-stall").positive().write(d / "trace.json.gz")
    (d / "run.json").write_text(json.dumps({"dataloaders": [{"created_at": "train.py:10"}]}))
    return d


def test_reports_and_other_json_in_a_run_folder_are_skipped_with_a_note(tmp_path):
    d = _run_folder(tmp_path / "run")
    (d / "report.json").write_text(json.dumps({"tool": "gpuadvise", "version": "0", "findings": []}))
    (d / "settings.json").write_text(json.dumps({"lr": 0.1}))
    sources = resolve([str(d)])
    assert [s.path.name for s in sources] == ["trace.json.gz"]
    assert sources[0].facts["dataloaders"][0]["created_at"] == "train.py:10"
    assert any("report.json" in n and "gpuadvise report" in n for n in sources.notes)
    assert any("settings.json" in n and "traceEvents" in n for n in sources.notes)


def test_a_run_record_stands_for_its_folder(tmp_path):
    d = _run_folder(tmp_path / "run")
    by_record = resolve([str(d / "run.json")])
    by_folder = resolve([str(d)])
    assert [(s.path, s.facts) for s in by_record] == [(s.path, s.facts) for s in by_folder]


def test_analyze_run_then_analyze_it_again_with_its_report_inside(tmp_path, capsys):
    from _cli_support import call_main

    d = _run_folder(tmp_path / "run")
    rc, _, err = call_main(capsys, "analyze", d, "-o", d / "report.json")
    assert rc == 0, err
    rc, out, err = call_main(capsys, "analyze", d, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["summary"]["traces"] == 1
    assert any("report.json" in n and "skipped" in n for n in doc["traces"][0]["notes"])
    rc, _, err = call_main(capsys, "analyze", d, "-o", d / "report.json")  # the old report is replaced, not an input
    assert rc == 0, err


def test_a_non_trace_json_named_on_its_own_is_an_error(tmp_path, capsys):
    from _cli_support import call_main

    p = tmp_path / "pairs.json"
    p.write_text(json.dumps({"pairs": {}}))
    rc, out, err = call_main(capsys, "analyze", p)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "traceEvents" in err

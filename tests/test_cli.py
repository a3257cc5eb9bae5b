"""The `gpuadvise` command line: formats, output files, the JSON contract, errors a user can cause,
the rule catalog, multi-rank folders and run folders.

Happy paths run in-process (`main([...])`); everything about what a user sees when things go wrong runs
the real command in a subprocess, since only that shows tracebacks, warnings and stray output.
"""

from __future__ import annotations

import gzip
import json
import re
import os
from pathlib import Path

import pytest

from _cli_support import DATALOADER_FACTS, call_main, run_cli, write_rank_folder, write_rule_positive, write_run_folder
from gpuadvise.analyzer.model.findings import SEVERITIES
from gpuadvise.rules import all_rules

FINDING_FIELDS = ("rule", "topic", "severity", "title", "message", "evidence", "impact", "recommendation")
EVIDENCE_FIELDS = ("steps", "time_ranges_ms", "items", "sources", "numbers")


@pytest.fixture(scope="module")
def stall_trace(tmp_path_factory) -> Path:
    """dataloader-stall's positive fixture: a trace with three findings (low utilisation, DataLoader, sync)."""
    return write_rule_positive("dataloader-stall", tmp_path_factory.mktemp("stall") / "stall.json.gz")


def looks_like(fmt: str, text: str) -> None:
    """Assert that `text` is a report in format `fmt` (and not one of the others)."""
    if fmt == "json":
        doc = json.loads(text)
        assert doc["tool"] == "gpuadvise" and doc["findings"]
    elif fmt == "md":
        assert text.startswith("# gpuadvise report\n")
        assert "## Findings" in text and "| # | Finding |" in text
    else:
        assert not text.lstrip().startswith(("{", "#"))
        assert "finding" in text and "(by severity, then predicted saving)" in text
        assert "## " not in text


def single_error_line(stderr: str, *must_name: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}:\n{stderr}"
    line = lines[0]
    assert line.startswith("gpuadvise: error:"), line
    for name in must_name:
        assert name in line, f"error line does not name {name!r}: {line}"
    return line


# ---------------------------------------------------------------------------------------------------
# formats and output


@pytest.mark.parametrize("fmt", ["text", "md", "json"])
def test_analyze_writes_each_format_to_stdout(capsys, stall_trace, fmt):
    rc, out, err = call_main(capsys, "analyze", stall_trace, "--format", fmt)
    assert rc == 0, err
    assert err == ""
    looks_like(fmt, out)


def test_short_format_flag(capsys, stall_trace):
    rc, out, _ = call_main(capsys, "analyze", stall_trace, "-f", "md")
    assert rc == 0
    looks_like("md", out)


@pytest.mark.parametrize("name", ["md", "markdown"])
def test_every_command_takes_both_names_for_markdown(capsys, stall_trace, name):
    rc, out, err = call_main(capsys, "analyze", stall_trace, "--format", name)
    assert rc == 0, err
    looks_like("md", out)
    rc, out, err = call_main(capsys, "compare", stall_trace, stall_trace, "--format", name)
    assert rc == 0, err
    assert out.lstrip().startswith("#"), out[:200]
    rc, out, err = call_main(capsys, "rules", "--format", name)
    assert rc == 0, err
    assert out.startswith("| code | topic |") and "[GA102](dataloader-stall.md)" in out, out[:200]


def test_text_is_the_default_format(capsys, stall_trace):
    rc, out, err = call_main(capsys, "analyze", stall_trace)
    assert rc == 0, err
    looks_like("text", out)


@pytest.mark.parametrize("name, fmt", [("out.md", "md"), ("report.markdown", "md"), ("out.json", "json"),
                                       ("out.txt", "text"), ("OUT.MD", "md"), ("out.log", "text")])
def test_output_extension_chooses_format(capsys, tmp_path, stall_trace, name, fmt):
    out_path = tmp_path / name
    rc, out, err = call_main(capsys, "analyze", stall_trace, "-o", out_path)
    assert rc == 0, err
    assert out == "", "with -o the report goes to the file, not stdout"
    text = out_path.read_text(encoding="utf-8")
    looks_like(fmt, text)
    others = sorted(p.name for p in tmp_path.iterdir() if p.name != name)
    if fmt == "md":  # a markdown report's charts are written beside it, each one linked from it
        assert others and all(n.endswith(".svg") and f"]({n})" in text for n in others), others
    else:
        assert others == [], "temp files left beside the report"


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_an_unknown_output_extension_is_refused_not_guessed(capsys, tmp_path, stall_trace, command):
    out_path = tmp_path / "report.pdf"
    inputs = [stall_trace] if command == "analyze" else [stall_trace, stall_trace]
    rc, out, err = call_main(capsys, command, *inputs, "-o", out_path)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "report.pdf" in lines[0] and "'.pdf'" in lines[0]
    assert all(ext in lines[0] for ext in (".md", ".json", ".html", ".txt"))  # it says what would work
    assert list(tmp_path.iterdir()) == [], "nothing written"
    rc, _, err = call_main(capsys, command, *inputs, "-o", out_path, "--format", "json")
    assert rc == 0, err  # a named format writes any file name
    looks_like("json", out_path.read_text(encoding="utf-8"))


def test_explicit_format_beats_the_extension(capsys, tmp_path, stall_trace):
    out_path = tmp_path / "out.md"
    rc, _, err = call_main(capsys, "analyze", stall_trace, "--format", "json", "--output", out_path)
    assert rc == 0, err
    looks_like("json", out_path.read_text(encoding="utf-8"))


def test_output_replaces_an_existing_report(capsys, tmp_path, stall_trace):
    out_path = tmp_path / "out.json"
    out_path.write_text("old report\n")
    rc, _, err = call_main(capsys, "analyze", stall_trace, "-o", out_path)
    assert rc == 0, err
    looks_like("json", out_path.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_top_limits_the_text_findings(capsys, stall_trace):
    rc, out, _ = call_main(capsys, "analyze", stall_trace, "--top", "1")
    assert rc == 0
    assert "\n1. [" in out and "\n2. [" not in out
    assert "… and 2 more" in out


@pytest.mark.slow
def test_console_command_end_to_end(tmp_path, stall_trace):
    """The real entry point, in a subprocess: report on stdout, nothing on stderr (not a terminal)."""
    run = run_cli("analyze", stall_trace, "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert json.loads(run.stdout)["summary"]["findings"] == 3


@pytest.mark.slow
def test_console_command_exit_code_and_whole_report_after_leaving_at_once(tmp_path, stall_trace):
    """`analyze` leaves without the interpreter's teardown: the report must still be whole on a pipe, and
    the gate's exit code kept."""
    run = run_cli("analyze", stall_trace, "--format", "json", "--fail-on", "low", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert json.loads(run.stdout)["summary"]["findings"] == 3  # the whole JSON document, flushed before leaving
    assert "--fail-on low: 3 findings" in run.stderr


@pytest.mark.parametrize("argv, leaves", [(["analyze", "x.json"], True), (["analyse", "x.json"], True),
                                          (["rules"], False), (["profile", "train.py"], False), ([], False)])
def test_only_analyze_skips_the_interpreter_teardown(monkeypatch, argv, leaves):
    """`profile` runs the user's script: its atexit handlers must run, so only `analyze` leaves at once."""
    import gpuadvise.cli as cli

    monkeypatch.setattr(cli.sys, "argv", ["gpuadvise", *argv])
    monkeypatch.setattr(cli, "main", lambda a: 7)
    class Left(Exception):
        pass

    def leave(code):
        raise Left(code)

    monkeypatch.setattr(cli.os, "_exit", leave)
    with pytest.raises(Left if leaves else SystemExit) as exc:
        cli.console()
    assert (exc.value.args[0] if leaves else exc.value.code) == 7


def test_version(capsys):
    rc, out, _ = call_main(capsys, "--version")
    assert rc == 0
    assert out.startswith("gpuadvise ")


def test_no_command_prints_usage_and_fails(capsys):
    rc, out, err = call_main(capsys)
    assert rc == 2  # a bare `gpuadvise` in a script is a mistake, not a success
    assert out == ""
    assert err.startswith("usage: gpuadvise") and "analyze" in err and "explain" in err


def test_help_flag_prints_help_and_succeeds(capsys):
    rc, out, _ = call_main(capsys, "--help")
    assert rc == 0 and out.startswith("usage: gpuadvise")


def test_analyse_spelling_runs_analyze(capsys, stall_trace):
    rc, out, _ = call_main(capsys, "analyse", stall_trace, "--format", "json")
    assert rc == 0
    assert json.loads(out)["summary"]["findings"] == 3


def test_misspelt_command_suggests_the_right_one(capsys):
    rc, _, err = call_main(capsys, "anlyze", "x.json")
    assert rc == 2
    assert "did you mean 'analyze'?" in err


# ---------------------------------------------------------------------------------------------------
# the JSON contract


def test_json_summary_and_finding_fields(capsys, stall_trace):
    rc, out, _ = call_main(capsys, "analyze", stall_trace, "--format", "json")
    assert rc == 0
    doc = json.loads(out)

    s = doc["summary"]
    assert s["steps"] == 4
    assert isinstance(s["median_step_ms"], float) and s["median_step_ms"] > 0
    assert isinstance(s["gpu_busy_pct"], float) and 0 < s["gpu_busy_pct"] <= 100
    assert s["traces"] == 1 and s["findings"] == len(doc["findings"])

    assert doc["findings"], "dataloader-stall's positive fixture must produce findings"
    for f in doc["findings"]:
        for key in FINDING_FIELDS:
            assert key in f, f"finding lacks {key!r}: {sorted(f)}"
        for key in ("rule", "topic", "title", "message", "recommendation"):
            assert isinstance(f[key], str) and f[key], key
        assert f["severity"] in SEVERITIES
        assert isinstance(f["impact"]["est_step_saving_pct"], (int, float))
        assert 0 <= f["impact"]["est_step_saving_pct"] <= 100
        assert isinstance(f["impact"]["basis"], str)
        for key in EVIDENCE_FIELDS:
            assert key in f["evidence"], f"evidence lacks {key!r}"
        assert f["rank"] is None  # a single trace without distributedInfo

    # by severity, then predicted saving; a symptom's ceiling (an upper bound) does not outrank the cause that
    # explains at least half of it (findings.order)
    keys = [(SEVERITIES.index(f["severity"]), -f["impact"]["est_step_saving_pct"]) for f in doc["findings"]
            if not f["impact"]["upper_bound"]]
    assert keys == sorted(keys), "findings are ordered by severity, then predicted saving"
    assert [SEVERITIES.index(f["severity"]) for f in doc["findings"]] == sorted(
        SEVERITIES.index(f["severity"]) for f in doc["findings"])
    dl = [f for f in doc["findings"] if f["topic"] == "dataloader-stall"]
    assert len(dl) == 1 and dl[0]["rule"] == "GA102"


# ---------------------------------------------------------------------------------------------------
# errors a user can cause: exit 2, one line on stderr naming the file, no traceback


def _missing(d: Path) -> Path:
    return d / "no_such_trace.json"


def _file(name: str, content: str | bytes):
    """A maker of one bad input file: `name` holding `content` in the folder it is given."""
    def make(d: Path) -> Path:
        p = d / name
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
        return p
    return make


_empty = _file("empty.json", b"")
_blank = _file("blank.json", "  \n\t\n")
_not_json = _file("notes.json", "this is not JSON at all\n")
_not_a_trace = _file("config.json", json.dumps({"lr": 0.1, "batch_size": 64}))
_json_list_of_numbers = _file("numbers.json", "[1, 2, 3]")
_no_readable_event = _file("junk_events.json", json.dumps({"traceEvents": [1, "x", [2]]}))
_gz_not_json = _file("garbage.json.gz", gzip.compress(b"\x00\x01 binary, not JSON"))
_corrupt_gz = _file("corrupt.json.gz", b"\x1f\x8b" + b"\xff" * 64)


def _empty_folder(d: Path) -> Path:
    p = d / "empty_run"
    p.mkdir()
    (p / "notes.txt").write_text("no traces here")
    return p


def _run_folder_bad_run_json(d: Path) -> Path:
    p = d / "bad_run"
    p.mkdir()
    (p / "run.json").write_text("{not json")
    write_rule_positive("dataloader-stall", p / "trace.json")
    return p


BAD_INPUTS = {
    "missing-path": (_missing, "no_such_trace.json"),
    "empty-file": (_empty, "empty.json"),
    "whitespace-only-file": (_blank, "blank.json"),
    "not-json": (_not_json, "notes.json"),
    "json-not-a-trace": (_not_a_trace, "config.json"),
    # JSON but no event in it is an event: not a trace (an empty traceEvents list is a trace, just empty)
    "json-list-of-numbers": (_json_list_of_numbers, "numbers.json"),
    "no-readable-event": (_no_readable_event, "junk_events.json"),
    "gz-not-json": (_gz_not_json, "garbage.json.gz"),
    "corrupt-gz": (_corrupt_gz, "corrupt.json.gz"),
    "folder-without-traces": (_empty_folder, "empty_run"),
    "unreadable-run-json": (_run_folder_bad_run_json, "run.json"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.slow
def test_bad_input_is_one_clean_error_line(tmp_path, case):
    make, name = BAD_INPUTS[case]
    path = make(tmp_path)
    run = run_cli("analyze", path)
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr + run.stdout
    assert run.stdout == ""
    single_error_line(run.stderr, name)


@pytest.mark.slow
def test_explain_unknown_rule(tmp_path):
    run = run_cli("explain", "no-such-rule", cwd=tmp_path)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert run.stdout == ""
    line = single_error_line(run.stderr, "no-such-rule")
    assert "dataloader-stall" in line, "the error lists the known rules"


@pytest.mark.slow
def test_output_into_missing_folder(tmp_path, stall_trace):
    target = tmp_path / "reports" / "out.md"
    run = run_cli("analyze", stall_trace, "-o", target, cwd=tmp_path)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    single_error_line(run.stderr, "out.md")
    assert not target.parent.exists(), "the missing folder must not be created"
    assert run.stdout == ""


@pytest.mark.slow
def test_output_to_a_folder(tmp_path, stall_trace):
    run = run_cli("analyze", stall_trace, "-o", tmp_path, cwd=tmp_path)
    assert run.returncode == 2
    single_error_line(run.stderr, str(tmp_path))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("fmt", ["md", "json"])
@pytest.mark.slow
def test_output_to_a_full_device(tmp_path, stall_trace, fmt):
    run = run_cli("analyze", stall_trace, "-f", fmt, "-o", "/dev/full", cwd=tmp_path)
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr
    single_error_line(run.stderr, "/dev/full")
    assert run.stdout == ""


@pytest.mark.slow
def test_failed_analysis_leaves_existing_output_untouched(tmp_path):
    out = tmp_path / "report.md"
    out.write_text("yesterday's report\n")
    bad = _not_json(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    run = run_cli("analyze", bad, "-o", out, cwd=tmp_path)
    assert run.returncode == 2
    single_error_line(run.stderr, "notes.json")
    assert out.read_text() == "yesterday's report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "stray files left behind"


def test_failed_write_leaves_existing_output_untouched(capsys, monkeypatch, tmp_path, stall_trace):
    """A write that fails half-way (disk full at fsync) must not replace the old report or leave a temp file."""
    import gpuadvise.analyzer.report.output as cli

    out = tmp_path / "report.json"
    out.write_text("yesterday's report\n")

    def full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli.os, "fsync", full)
    rc, stdout, err = call_main(capsys, "analyze", stall_trace, "-o", out)
    monkeypatch.undo()
    assert rc == 2
    single_error_line(err, "report.json")
    assert "No space left" in err
    assert stdout == ""
    assert out.read_text() == "yesterday's report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"], "temp file left behind"


# ---------------------------------------------------------------------------------------------------
# rule catalog


def test_rules_lists_every_rule(capsys):
    rc, out, _ = call_main(capsys, "rules")
    assert rc == 0
    rules = all_rules()
    assert len(rules) >= 7
    for r in rules:
        line = next((ln for ln in out.splitlines() if ln.startswith(r.code)), None)
        assert line is not None, f"{r.code} missing from `gpuadvise rules`"
        assert r.name in line and r.title in line


@pytest.mark.slow
def test_rules_subprocess():
    run = run_cli("rules")
    assert run.returncode == 0 and run.stderr == ""
    assert all(r.code in run.stdout for r in all_rules())


@pytest.mark.parametrize("key", ["dataloader-stall", "GA102", "ga102", " Dataloader-Stall "])
def test_explain_by_name_or_code(capsys, key):
    rc, out, err = call_main(capsys, "explain", key)
    assert rc == 0, err
    assert out.startswith("GA102 dataloader-stall")
    for heading in ("## What it detects", "## Why it matters", "## Fix", "## Thresholds"):
        assert heading in out
    assert "num_workers" in out


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.name)
def test_every_rule_is_explained(capsys, rule):
    for key in (rule.code, rule.name):
        rc, out, _ = call_main(capsys, "explain", key)
        assert rc == 0
        assert f"{rule.code} {rule.name}" in out and "## Fix" in out


# ---------------------------------------------------------------------------------------------------
# folders: ranks and run folders


def test_rank_folder_findings_carry_their_rank(capsys, tmp_path):
    folder = write_rank_folder(tmp_path / "job")
    rc, out, err = call_main(capsys, "analyze", folder, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["summary"]["traces"] == 2
    assert [t["rank"] for t in doc["traces"]] == [0, 1]
    ranks = {f["rank"] for f in doc["findings"]}
    assert ranks == {0, 1}, ranks
    for f in doc["findings"]:
        assert Path(f["trace"]).name == ("trace_a.json" if f["rank"] == 0 else "trace_b.json")


def test_rank_from_file_name(capsys, tmp_path):
    """Without distributedInfo, the rank comes from the file name (rank3 / worker_5)."""
    d = tmp_path / "job"
    d.mkdir()
    write_rule_positive("host-sync", d / "rank3.trace.json")
    write_rule_positive("host-sync", d / "worker_5.pt.trace.json.gz")
    rc, out, _ = call_main(capsys, "analyze", d, "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert sorted(t["rank"] for t in doc["traces"]) == [3, 5]
    assert {f["rank"] for f in doc["findings"]} == {3, 5}


def test_rank_folder_markdown_has_a_rank_column(capsys, tmp_path):
    folder = write_rank_folder(tmp_path / "job")
    rc, out, _ = call_main(capsys, "analyze", folder, "--format", "md")
    assert rc == 0
    assert "| # | Finding | Topic | Severity | Est. saving | Rank |" in out
    assert "(rank 0)" in out and "(rank 1)" in out


def test_a_jobs_markdown_lists_a_finding_once_with_its_ranks_as_the_text_does(capsys, tmp_path):
    folder = write_rank_folder(tmp_path / "job")
    rc, out, _ = call_main(capsys, "analyze", folder, "--format", "md")
    assert rc == 0
    rc, text, _ = call_main(capsys, "analyze", folder, "--top", "99")
    assert rc == 0
    rc, js, _ = call_main(capsys, "analyze", folder, "--format", "json")
    per_rank = [(f["topic"], f["rank"]) for f in json.loads(js)["findings"]]
    twice = {t for t, r in per_rank if r is not None and sum(1 for x, _ in per_rank if x == t) > 1}
    assert twice, per_rank  # the fixture has a finding on both ranks
    headings = re.findall(r"^### \d+\. (.+)$", out, re.M)
    listed = re.findall(r"^\d+\. \[\w+\] ", text, re.M)
    assert len(headings) == len(listed) == len({t for t, _ in per_rank}), (headings, listed)
    assert "a finding on several ranks is listed once" in out and "ranks 0–1" in out


def test_two_trace_arguments(capsys, tmp_path):
    folder = write_rank_folder(tmp_path / "job")
    rc, out, _ = call_main(capsys, "analyze", folder / "trace_a.json", folder / "trace_b.json", "-f", "json")
    assert rc == 0
    assert {f["rank"] for f in json.loads(out)["findings"]} == {0, 1}


def test_run_folder_points_at_the_dataloader_line(capsys, tmp_path):
    run_dir = write_run_folder(tmp_path / "run")
    rc, out, err = call_main(capsys, "analyze", run_dir, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    dl = [f for f in doc["findings"] if f["topic"] == "dataloader-stall"]
    assert len(dl) == 1
    created_at = DATALOADER_FACTS["dataloaders"][0]["created_at"]
    assert created_at in dl[0]["evidence"]["sources"]
    assert f"created at {created_at}" in dl[0]["recommendation"]
    assert "num_workers=0" in dl[0]["recommendation"]


@pytest.mark.slow
def test_run_json_alone_is_not_a_trace(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps(DATALOADER_FACTS))
    run = run_cli("analyze", d)
    assert run.returncode == 2
    single_error_line(run.stderr, "run")


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_no_cache_is_passed_down_not_set_in_the_environment(capsys, tmp_path, monkeypatch, command):
    """--no-cache reaches the loader as cache=False: no model cache is written, and the process
    environment is left as it was (a later analysis in the same process still caches)."""
    import os

    from gpuadvise.analyzer.read import cache
    from gpuadvise.rules import find_rule

    monkeypatch.delenv("GPUADVISE_NO_CACHE", raising=False)
    monkeypatch.setattr(cache, "MIN_BYTES", 0)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "in").mkdir()
    trace = find_rule("dataloader-stall").positive().write(tmp_path / "in" / "t.json")

    def files():
        return sorted(str(p) for p in tmp_path.rglob("*") if p.is_file())

    before = files()
    inputs = [trace] if command == "analyze" else [trace, trace]
    rc, _, err = call_main(capsys, command, *inputs, "--no-cache", "-q")
    assert rc == 0, err
    assert files() == before, "--no-cache wrote a model cache"
    assert "GPUADVISE_NO_CACHE" not in os.environ
    rc, _, err = call_main(capsys, command, *inputs, "-q")
    assert rc == 0, err
    assert len(files()) > len(before), "without --no-cache the model is cached (the test can see a cache)"

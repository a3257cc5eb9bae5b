"""The rule catalog as data: the README's table is the one the rules generate (a stale table fails
here), and `gpuadvise rules --format markdown|json` give a script everything about each rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

from _cli_support import call_main
from gpuadvise.analyzer.model.findings import severity_for
from gpuadvise.rules import all_rules, catalog

README = Path(__file__).resolve().parents[1] / "README.md"


def _table(text: str) -> list[list[str]]:
    body = text.split(catalog.BEGIN, 1)[1].split(catalog.END, 1)[0]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in body.strip().splitlines()[2:]]


def test_readme_rule_table_is_up_to_date():
    text = README.read_text(encoding="utf-8")
    assert catalog.with_table(text, "README.md") == text, (
        "README.md's rule table is stale: run `gpuadvise rules --format markdown --update README.md`")


def test_readme_table_has_one_row_per_rule():
    rows = _table(README.read_text(encoding="utf-8"))
    assert [r[0] for r in rows] == [r.code for r in all_rules()]
    for row, rule in zip(rows, all_rules()):
        assert row[1] == f"`{rule.topic}`" and row[2] == rule.summary
    assert {r[3] for r in rows if r[1] in ("`straggler`", "`comm-overlap`")} == {"≥2 ranks"}


def test_update_rewrites_only_between_markers(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n\n{catalog.BEGIN}\n| old | table |\n{catalog.END}\n\noutro\n", encoding="utf-8")
    rc, out, _ = call_main(capsys, "rules", "--format", "markdown", "--update", str(doc))
    assert rc == 0 and "updated" in out
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("intro\n\n") and text.endswith("\n\noutro\n") and "| old |" not in text
    assert len(_table(text)) == len(all_rules())
    rc, out, _ = call_main(capsys, "rules", "--format", "markdown", "--update", str(doc))
    assert rc == 0 and "already up to date" in out and doc.read_text(encoding="utf-8") == text
    assert [p.name for p in tmp_path.iterdir()] == ["doc.md"], "temp file left behind"


def test_update_without_markers_is_a_one_line_error(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("no table here\n", encoding="utf-8")
    rc, _, err = call_main(capsys, "rules", "--format", "markdown", "--update", str(doc))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "doc.md" in err and "marker" in err
    assert doc.read_text(encoding="utf-8") == "no table here\n"


def test_rules_json_for_scripts(capsys):
    rc, out, _ = call_main(capsys, "rules", "--format", "json")
    assert rc == 0
    data = json.loads(out)
    assert [d["code"] for d in data] == [r.code for r in all_rules()]
    for d, rule in zip(data, all_rules()):
        assert (d["name"], d["topic"], d["title"]) == (rule.name, rule.topic, rule.title)
        assert d["requires"] == list(rule.requires)
        assert d["thresholds"] == json.loads(json.dumps(rule.thresholds))  # tuples read back as lists
        assert list(d["docs"]) == ["What it detects", "Why it matters", "Fix", "Thresholds"]
        assert "```python" in d["docs"]["Fix"]
        assert d["job_level"] == ("ranks" in rule.requires)
        sev = d["severity"]
        assert severity_for(sev["high_from_pct"]) == "high" and severity_for(sev["high_from_pct"] - 0.1) == "medium"
        assert severity_for(sev["medium_from_pct"]) == "medium" and severity_for(sev["medium_from_pct"] - 0.1) == "low"


def test_every_rule_docs_open_with_its_name_and_one_sentence():
    """The first docstring line, "name: what it finds.", is the README table's description."""
    for rule in all_rules():
        first = rule.docs.splitlines()[0]
        assert first.startswith(f"{rule.name}: "), f"{rule.name}: docs open with {first!r}"
        assert rule.summary and rule.summary.endswith(".") and "|" not in rule.summary

"""The rule catalog as data: the documentation's rule pages, its catalog table and the site's nav are
the ones the rules generate (a stale page, table or nav fails here), and `gpuadvise rules --format
markdown|json` give a script everything about each rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

from _cli_support import call_main
from gpuadvise.analyzer.model.findings import severity_for
from gpuadvise.rules import all_rules, catalog

REPO = Path(__file__).resolve().parents[1]
RULE_PAGES = REPO / "docs" / "rules"
STALE = "run `gpuadvise rules --pages docs/rules`"


def _table(text: str) -> list[list[str]]:
    body = text.split(catalog.BEGIN, 1)[1].split(catalog.END, 1)[0]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in body.strip().splitlines()[2:]]


def test_rule_pages_are_the_rules_docstrings():
    for name, text in catalog.pages().items():
        page = RULE_PAGES / name
        assert page.is_file() and page.read_text(encoding="utf-8") == text, f"docs/rules/{name} is stale: {STALE}"
    assert catalog.stale_pages(RULE_PAGES) == [], f"pages of rules that no longer exist: {STALE}"


def test_catalog_table_and_nav_are_up_to_date():
    text = (RULE_PAGES / "index.md").read_text(encoding="utf-8")
    assert catalog.with_table(text, "docs/rules/index.md") == text, f"docs/rules/index.md's table is stale: {STALE}"
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert catalog.with_nav(nav, "mkdocs.yml") == nav, f"mkdocs.yml's rule pages are stale: {STALE}"


def test_catalog_table_has_one_row_per_rule_linking_its_page():
    rows = _table((RULE_PAGES / "index.md").read_text(encoding="utf-8"))
    assert [r[0] for r in rows] == [f"[{r.code}]({r.name}.md)" for r in all_rules()]
    for row, rule in zip(rows, all_rules()):
        assert row[1] == f"`{rule.topic}`" and row[2] == rule.summary
    inputs = {r[0]: r[3] for r in rows}
    assert inputs["[GA130](straggler.md)"] == inputs["[GA131](comm-overlap.md)"] == "≥2 ranks"
    assert inputs["[GA136](exposed-comm.md)"] == "trace"  # one rank's trace read alone


def test_a_rule_page_holds_every_section_of_its_docs():
    for rule in all_rules():
        page = catalog.rule_page(rule)
        assert f"\n# {rule.code} {rule.name}\n" in page
        for heading, body in rule.sections.items():
            squeezed = re.sub(r"\n\s*\n", "\n", body)  # the page adds blank lines before lists
            assert f"## {heading}\n\n" in page and squeezed in re.sub(r"\n\s*\n", "\n", page), \
                f"{rule.name}: {heading} missing from its page"


def test_pages_writes_the_site_and_removes_pages_of_gone_rules(tmp_path, capsys):
    docs = tmp_path / "docs" / "rules"
    docs.mkdir(parents=True)
    (docs / "index.md").write_text(f"# Rules\n\n{catalog.BEGIN}\n{catalog.END}\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(f"nav:\n  - Rules:\n    {catalog.NAV_BEGIN}\n    {catalog.NAV_END}\n  - Other: x.md\n",
                                         encoding="utf-8")
    gone = docs / "old-rule.md"
    gone.write_text(catalog.PAGE_MARK.format(source="rules/old_rule.py") + "\n\n# GA999 old-rule\n", encoding="utf-8")
    handwritten = docs / "overview.md"
    handwritten.write_text("# Not generated\n", encoding="utf-8")
    rc, out, _ = call_main(capsys, "rules", "--pages", str(docs))
    assert rc == 0 and "updated" in out and "old-rule.md (removed)" in out
    assert not gone.exists() and handwritten.exists()
    assert {p.name for p in docs.glob("*.md")} == set(catalog.pages()) | {"index.md", "overview.md"}
    assert len(_table((docs / "index.md").read_text(encoding="utf-8"))) == len(all_rules())
    nav = (tmp_path / "mkdocs.yml").read_text(encoding="utf-8")
    assert "    - rules/index.md\n" in nav and nav.endswith(f"    {catalog.NAV_END}\n  - Other: x.md\n")
    assert nav.count(": rules/") == len(all_rules())
    rc, out, _ = call_main(capsys, "rules", "--pages", str(docs))
    assert rc == 0 and "already up to date" in out
    assert not [p for p in docs.iterdir() if p.name.endswith(".tmp")], "temp file left behind"


def test_pages_into_a_missing_folder_is_a_one_line_error(tmp_path, capsys):
    rc, _, err = call_main(capsys, "rules", "--pages", str(tmp_path / "nope"))
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "nope" in err


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
    """The first docstring line, "name: what it finds.", is the catalog table's description."""
    for rule in all_rules():
        first = rule.docs.splitlines()[0]
        assert first.startswith(f"{rule.name}: "), f"{rule.name}: docs open with {first!r}"
        assert rule.summary and rule.summary.endswith(".") and "|" not in rule.summary

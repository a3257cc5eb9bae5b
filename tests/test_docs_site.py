"""The documentation site builds strictly, README.md's links lead somewhere, and every page reads as one
outline (one title, no skipped heading level).

The strict build runs in-process when mkdocs is installed (the `docs` extra; CI installs it) and is
skipped otherwise, so the README's test command covers it wherever the site can be built.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

import pytest

from _docs_support import DOCS, REPO, lines, pages

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc extension makes it (mkdocs' default)."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _headings(text: str) -> list[tuple[int, str]]:
    return [(len(m.group(1)), m.group(2).strip()) for line, fence in lines(text) if fence is None
            for m in [re.match(r"^(#{1,6})\s+(.+?)\s*#*$", line)] if m]


def _build(config_file, site_dir, **overrides):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    build(load_config(config_file=str(config_file), site_dir=str(site_dir), strict=True, **overrides))


def test_the_site_builds_strictly(tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    monkeypatch.chdir(REPO)
    _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "rules" / "dataloader-stall" / "index.html").is_file()


def test_a_broken_anchor_fails_the_build_and_notes_stay_out(tmp_path, monkeypatch, caplog):
    """mkdocs.yml's own settings, on a two-page site: a link to a heading that does not exist fails the
    strict build; a broken link in docs/notes/ (fragments for the lead) does not, as it is not built."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    from mkdocs.exceptions import Abort

    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    docs = tmp_path / "docs"
    (docs / "notes").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\nSee [the options](other.md#no-such-heading).\n", encoding="utf-8")
    (docs / "other.md").write_text("# Other\n\n## Options\n", encoding="utf-8")
    (docs / "notes" / "branch.md").write_text("# A note\n\n[gone](missing.md)\n", encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="mkdocs")
    with pytest.raises(Abort):
        _build(REPO / "mkdocs.yml", tmp_path / "site", docs_dir=str(docs), nav=["index.md", "other.md"], plugins=[])
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "no-such-heading" in warnings[0], warnings


def test_readme_links_lead_to_pages_and_headings_that_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(readme):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        file = (REPO / path) if path else REPO / "README.md"
        if not file.exists():
            broken.append(target)
        elif anchor and file.is_file() and anchor not in {_slug(h) for _, h in _headings(file.read_text(encoding="utf-8"))}:
            broken.append(target)
    assert not broken, f"README.md links lead nowhere: {broken}"


def test_readme_is_a_front_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200, "README.md is the front page: the manual lives in docs/"
    linked = {t.split("#")[0] for t in LINK.findall(readme)}
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in re.findall(r":\s+([\w/-]+\.md)\s*$", nav, flags=re.M):
        if not page.startswith("rules/") or page == "rules/index.md":
            assert f"docs/{page}" in linked or page == "index.md", f"README.md does not link docs/{page}"


def test_every_page_is_one_outline():
    """One `#` title first, and no heading more than one level below the one before it."""
    problems = []
    for page in pages():
        heads = _headings(page.read_text(encoding="utf-8"))
        where = page.relative_to(REPO)
        if not heads or heads[0][0] != 1 or [lvl for lvl, _ in heads].count(1) != 1:
            problems.append(f"{where}: not one `#` title first")
        for (a, _), (b, title) in zip(heads, heads[1:]):
            if b > a + 1:
                problems.append(f"{where}: {'#' * b} {title} skips a level")
    assert not problems, "\n".join(problems)


def test_every_page_is_in_the_nav():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r"([\w/-]+\.md)\s*$", nav, flags=re.M))
    on_disk = {p.relative_to(DOCS).as_posix() for p in pages() if p.is_relative_to(DOCS)}
    assert on_disk == listed


def test_lists_start_after_a_blank_line():
    """Python-Markdown (the site's) runs a list that follows a paragraph line into the paragraph, where
    GitHub would show a list: every list starts after a blank line, a heading or another item."""
    item = re.compile(r"^(?:[-*]|\d+\.) ")
    problems = []
    for page in pages():
        prev = ""
        for line, fence in lines(page.read_text(encoding="utf-8")):
            if fence is None and item.match(line) and prev.strip() and not item.match(prev) \
                    and not prev.startswith((" ", "#", "<!--")):
                problems.append(f"{page.relative_to(REPO)}: {line[:60]!r} runs into the line before it")
            prev = line if fence is None else "code"
    assert not problems, "\n".join(problems)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_sites_home_says_what_the_readme_says():
    """docs/index.md is the README for the site: its install, quick start and report excerpt are the
    README's, with the links made relative to docs/."""
    readme = (REPO / "README.md").read_text(encoding="utf-8").replace("](docs/", "](")
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    for heading in ("Install", "Quick start", "What a report looks like", "Commands"):
        assert _section(home, heading) == _section(readme, heading), f"docs/index.md's {heading} differs from README.md's"


def test_the_readme_report_excerpt_is_what_gpuadvise_prints(capsys):
    """The README's excerpt is real output: `gpuadvise analyze` on the corpus run it names prints those
    lines, in that order (a change to the report's words shows here; paste the new output). Skipped
    without the corpus."""
    from _cli_support import call_main
    from _corpus_support import TRACES

    block = _section((REPO / "README.md").read_text(encoding="utf-8"), "What a report looks like")
    excerpt = block.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    command = excerpt[0].removeprefix("$ ").split()
    assert command[:2] == ["gpuadvise", "analyze"], excerpt[0]
    run = TRACES / Path(command[2]).relative_to("../shared/traces")
    if not run.is_dir():
        pytest.skip(f"{run} not here (the real-trace corpus)")
    rc, out, _ = call_main(capsys, "analyze", str(run), "--no-cache")  # no cache file written into the corpus
    assert rc == 0
    printed = iter(out.splitlines()[1:])  # the first line is the path as given
    for line in excerpt[2:]:
        if line != "…":
            assert any(line == p for p in printed), f"README's excerpt line not printed (in this order): {line!r}"

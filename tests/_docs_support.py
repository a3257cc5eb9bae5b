"""What the documentation tests share: the pages (README.md and docs/, without the notes engineers leave
for the lead) and a reader that tells a page's prose from its fenced code blocks."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def pages() -> list[Path]:
    found = [REPO / "README.md"] + sorted(DOCS.rglob("*.md"))
    return [p for p in found if "notes" not in p.relative_to(REPO).parts]


def lines(text: str):
    """(line, fence) for each line of a page: fence is None in prose, else the open block's marker
    (``` or ~~~, so a ``` block inside a ~~~ block stays code); the fence lines themselves are skipped."""
    fence = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and (fence is None or (m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
                                    and not line.strip()[len(m.group(1)):])):
            fence = m.group(1) if fence is None else None
            continue
        yield line, fence

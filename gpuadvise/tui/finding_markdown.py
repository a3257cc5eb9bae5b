"""A finding as Markdown for the detail pane: the report's own finding renderer (report/finding.py),
with every part under its own heading, then the rule's documentation."""

from __future__ import annotations

import re

from gpuadvise.analyzer.model.findings import Finding
from gpuadvise.analyzer.report.finding import finding_lines

JUMP_HINT = "*Press **enter** to see this in the timeline.*"


def finding_markdown(f: Finding, rule=None, can_jump: bool = True) -> str:
    e = f.evidence
    hint = JUMP_HINT if can_jump and (e.time_ranges_ms or e.steps or e.items) else None
    out = finding_lines(f, level=1, pane=True, hint=hint)
    if rule is not None:
        out += [f"## About {rule.code} `{rule.name}`", "", _docs_without_fix(rule.docs), ""]
    return "\n".join(out)


def _docs_without_fix(docs: str) -> str:
    """The rule's docs, headings moved one level down, minus its Fix section (shown above already)."""
    docs = re.sub(r"^## Fix\n.*?(?=^## |\Z)", "", docs, flags=re.S | re.M)
    return re.sub(r"^## ", "### ", docs, flags=re.M).strip()

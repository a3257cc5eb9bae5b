"""A finding as Markdown for the detail pane: the message with its numbers, the evidence, the fix
with its code, and the rule's own documentation. Trace-sourced names are escaped (analyzer.safe) so
they render as literal text, never as links, HTML or formatting."""

from __future__ import annotations

import re

from gpuadvise.analyzer.model.findings import Finding
from gpuadvise.analyzer.report.safe import md, md_cell, md_code, md_text, short, terminal


def finding_markdown(f: Finding, rule=None, can_jump: bool = True) -> str:
    e = f.evidence
    saving = f"{f.impact.est_step_saving_pct:.1f} %"
    if f.impact.upper_bound:
        saving = "up to " + saving
    rank = f" · rank {f.rank}" if f.rank is not None else ""
    out = [f"# {md(f.title)}", "",
           f"`{f.rule}` · `{f.topic}` · **{f.severity}** · est. saving **{saving}** of step time{rank}", "",
           md_text(f.message), "", "## Evidence", ""]
    if e.steps:
        more = " …" if len(e.steps) > 12 else ""
        out.append(f"- **Steps:** {', '.join('#' + str(s) for s in e.steps[:12])}{more}")
    if e.time_ranges_ms:
        ranges = ", ".join(f"{a:.2f}–{b:.2f}" for a, b in e.time_ranges_ms[:6])
        out.append(f"- **Where** (ms from trace start): {ranges}")
    if e.sources:
        out.append("- **Source:** " + ", ".join(md_code(s) for s in e.sources[:5]))
    for key, value in e.numbers.items():
        out.append(f"- {md(key.replace('_', ' '))}: {md(_fmt(value))}")
    if can_jump and (e.time_ranges_ms or e.steps or e.items):
        out.append("")
        out.append("*Press **enter** to see this in the timeline.*")
    out.append("")
    if e.items:
        keys = list(e.items[0].keys())
        out += ["| " + " | ".join(md(k) for k in keys) + " |", "|" + "---|" * len(keys)]
        for item in e.items[:15]:
            cells = [md_cell(short(str(item.get(k, "")), 90)) if k == "name" else md(_fmt(item.get(k, ""))) for k in keys]
            out.append("| " + " | ".join(cells) + " |")
        if len(e.items) > 15:
            out.append(f"\n*…and {len(e.items) - 15} more.*")
        out.append("")
    out += ["## Impact", "", md_text(f.impact.basis) or "—", "", "## Fix", "", terminal(f.recommendation), ""]
    if rule is not None:
        out += [f"## About {rule.code} `{rule.name}`", "", _docs_without_fix(rule.docs), ""]
    return "\n".join(out)


def _docs_without_fix(docs: str) -> str:
    """The rule's docs, headings moved one level down, minus its Fix section (shown above already)."""
    docs = re.sub(r"^## Fix\n.*?(?=^## |\Z)", "", docs, flags=re.S | re.M)
    return re.sub(r"^## ", "### ", docs, flags=re.M).strip()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)

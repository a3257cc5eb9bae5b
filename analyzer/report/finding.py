"""One finding as markdown: the one renderer behind the markdown/HTML report and the TUI's finding
pane, so both quote the same numbers, the same saving (with its range) and the same fix. Trace-sourced
names are escaped (report.safe): they render as literal text, never as links, HTML or formatting."""

from __future__ import annotations

from gpuadvise.analyzer.model.findings import Finding

from . import evidence
from .safe import md, md_cell, md_code, md_text, short


def finding_lines(f: Finding, prefix: str = "", *, level: int = 3, pane: bool = False, hint: str | None = None,
                  ranks: list | None = None) -> list[str]:
    """The finding under a `level` heading (its title after `prefix`, e.g. "2. "). Its evidence is in
    people's words (report/evidence.py): the steps, the time ranges beside their steps, the named numbers
    with labels and units, the offenders' table with labelled columns. `pane` (the TUI's detail pane)
    gives every part its own heading and shows more offenders; `hint` is a line after the evidence (the
    TUI's "press enter" line); `ranks`, the ranks a job's report lists it for (summary.one_per_rule)."""
    e = f.evidence
    where = f" · {ranks_words(ranks or [f.rank])}" if f.rank is not None else ""
    out = [f"{'#' * level} {prefix}{md(f.title)}", "",
           f"`{f.rule}` · `{f.topic}` · **{f.severity}** · est. saving **{saving(f)}** of step time{where}", "",
           md_text(f.message), ""]
    label = (lambda name: f"- **{name}:**") if pane else (lambda name: f"- {name}:")
    ev = []
    placed = evidence.where(e.steps, e.time_ranges_ms, e.range_steps)
    if e.steps:
        ev.append(f"{label('Steps')} {', '.join('#' + str(s) for s in e.steps[:12])}{' …' if len(e.steps) > 12 else ''}")
    if placed:
        ev.append(f"{label('Where')} " + "; ".join(md(p) for p in placed) + " (from the trace's start)")
    if e.sources:
        ev.append(f"{label('Source')} " + ", ".join(md_code(s) for s in e.sources[:5]))
    style = evidence.Style(words=md, code=md_code)
    ev += [f"- {name}: {text}" for name, text in (evidence.named(k, v, style) for k, v in e.numbers.items())]
    if pane and hint:
        ev += ["", hint]
    if ev or pane:
        out += [_section("Evidence", level, pane), ""] + ev + [""]
    if e.items:
        limit = 15 if pane else 10
        keys = list(e.items[0].keys())
        out += ["| " + " | ".join(md(evidence.column(k)) for k in keys) + " |", "|" + "---|" * len(keys)]
        for item in e.items[:limit]:
            cells = [md_cell(short(str(item.get(k, "")), 80)) if k == "name" or evidence.literal(item.get(k))
                     else md(evidence.cell(k, item.get(k))) for k in keys]
            out.append("| " + " | ".join(cells) + " |")
        if pane and len(e.items) > limit:
            out.append(f"\n*…and {len(e.items) - limit} more.*")
        out.append("")
    basis = md_text(f.impact.basis) or "—"
    job = (f"On every rank that shows it: **{f.impact.job_pct:.1f} %** of the job's step "
           f"({md_text(f.impact.job_basis or '')})") if f.impact.job_pct is not None else None
    if pane:
        out += [_section("Impact", level, pane), "", basis, ""] + ([job, ""] if job else [])
    else:
        out += [f"**Impact:** {basis}", ""] + ([job, ""] if job else [])
    out += [_section("Fix", level, pane), "", fix_markdown(f), ""]
    return out


def rank_list(ranks: list[int]) -> str:
    """0, 1, 2, 5 → "0–2, 5"."""
    runs, out = [], []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    for a, b in runs:
        out.append(str(a) if a == b else f"{a}–{b}")
    return ", ".join(out)


def ranks_words(ranks: list[int]) -> str:
    """"rank 1" / "ranks 0–3"."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"


def _section(name: str, level: int, pane: bool) -> str:
    return f"{'#' * (level + 1)} {name}" if pane else f"**{name}**"


def fix_markdown(f: Finding) -> str:
    """The advice (it may quote trace or run.json values, so it is escaped like any prose), then the
    rule's own Fix section, which is markdown written by us."""
    return (md_text(f.advice) + "\n\n" + f.fix).strip()


def saving(f: Finding) -> str:
    pct = f"{f.impact.est_step_saving_pct:.1f} %"
    r = f.impact.range_pct
    if r and r[1] - r[0] >= 1:
        pct += f" ({r[0]:.0f}–{r[1]:.0f} %)"
    return f"up to {pct}" if f.impact.upper_bound else pct


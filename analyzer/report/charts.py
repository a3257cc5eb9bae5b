"""Charts for `gpuadvise analyze`: the per-step breakdown of each trace, the predicted saving of each
finding, and a long run's step time over the whole run, as SVG files beside a markdown report (`-o
report.md` → `report-steps.svg`, `report-run.svg`, …), or inline in the HTML page (`--format html`).

Markdown on stdout gets no charts: there is no folder to put files in, and GitHub's job summary and
most markdown viewers do not render inline SVG. The tables carry the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from . import svg
from .longrun import chart_svg, shown
from gpuadvise.analyzer.model.report import TraceReport, all_findings
from .finding import saving

MAX_TRACE_CHARTS = 8  # a job of 64 ranks gets the first 8 ranks' step charts; the tables list every rank
MAX_STEPS = 50
MAX_FINDINGS = 12


@dataclass
class Chart:
    name: str  # file suffix and HTML id: "steps", "steps-2", "savings"
    alt: str
    svg: str
    anchor: str | int  # where the markdown shows it: "findings", "run-<i>" (a long run's section) or the report index


def charts(reports: list[TraceReport]) -> list[Chart]:
    out = []
    findings = [f for f in all_findings(reports) if f.impact.est_step_saving_pct > 0][:MAX_FINDINGS]
    if findings:
        multi = len(reports) > 1
        rows = [{"label": f"{f.rule} {f.topic}" + (f" rank {f.rank}" if multi and f.rank is not None else ""),
                 "value": f.impact.est_step_saving_pct, "text": saving(f),
                 "colour": "#cf222e" if f.severity == "high" else "#d4a72c" if f.severity == "medium" else "#0969da"}
                for f in findings]
        note = "Each fix's prediction on its own: predictions of different findings do not add up."
        out.append(Chart("savings", "Predicted step-time saving per finding",
                         svg.value_bars("Predicted step-time saving per finding (% of the median step)", rows, note),
                         "findings"))
    runs = getattr(reports, "long_runs", None) or []
    for i, run in enumerate(runs[:MAX_TRACE_CHARTS]):
        if not shown(run):
            continue
        who = f" — {run.folder}" + (f" rank {run.rank}" if run.rank is not None else "") if len(runs) > 1 else ""
        out.append(Chart("run" if len(runs) == 1 else f"run-{i + 1}", f"Step time over the run{who}", chart_svg(run),
                         f"run-{i}"))
    traced = [i for i, r in enumerate(reports) if r.metrics is not None and len(r.metrics.per_step)]
    for k, i in enumerate(traced[:MAX_TRACE_CHARTS]):
        r = reports[i]
        ps = r.metrics.per_step
        rows = []
        cpu = r.figures.cpu_steps if r.figures is not None else []
        kinds = svg.CPU_STEP_PARTS if cpu else svg.STEP_PARTS
        for s in cpu[:MAX_STEPS]:  # no GPU timeline: the training thread's time, its four parts
            rows.append((f"#{s.step}" if s.step >= 0 else "all",
                         [s.in_ops_ms, s.collective_wait_ms, s.loader_wait_ms, s.outside_ops_ms], f"{s.ms:.2f} ms"))
        for row in ps.head(MAX_STEPS).to_dict("records") if not cpu else []:
            ms = {key.replace("_us", ""): float(v) / 1e3 for key, v in row.items() if key.endswith("_us")}
            label = f"#{int(row['step'])}" if row["step"] >= 0 else "all"
            rows.append((label, svg.step_parts(ms), f"{ms['dur']:.2f} ms"))
        note = f"First {MAX_STEPS} of {len(ps)} steps." if len(ps) > MAX_STEPS else ""
        who = f" — rank {r.rank}" if len(reports) > 1 and r.rank is not None else (
            f" — trace {i + 1}" if len(reports) > 1 else "")
        name = "steps" if len(traced) == 1 else f"steps-{i + 1}"
        out.append(Chart(name, f"Step time split{who}", svg.stacked_bars(f"Step time split{who} (ms)", rows, note, kinds), i))
    return out


def chart_lines(cs: list[Chart], link) -> dict:
    lines: dict = {}
    for c in cs:
        lines.setdefault(c.anchor, []).extend([f"![{c.alt}]({link(c)})", ""])
    return lines


def markdown_files(reports: list[TraceReport], out: Path) -> list[tuple[Path, str]]:
    """The markdown report at `out` and its charts beside it (`<stem>-<chart>.svg`), charts first so
    the report never links to a file that is not there yet."""
    from .markdown import render

    cs = charts(reports) if charts_beside(out) else []
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    files = {c.name: out.with_name(f"{stem}-{c.name}.svg") for c in cs}
    text = render(reports, charts=chart_lines(cs, lambda c: quote(files[c.name].name)))
    return [(files[c.name], c.svg) for c in cs] + [(out, text)]


def charts_beside(out: Path) -> bool:
    """Charts go beside a report file; a device (/dev/null, /dev/stdout) or a pipe has no "beside"."""
    return not (out.exists() and not out.is_file())

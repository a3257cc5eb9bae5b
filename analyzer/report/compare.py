"""`gpuadvise compare` reports: text for the terminal, markdown for a PR or a CI job summary (charts
as SVG files beside it with `-o`), JSON, and one self-contained HTML page. All of them draw the
dict `compare.compare()` returns; every number is formatted by the helpers here, once, so the
markdown, the charts and the page show the same figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from gpuadvise.analyzer.model.report import flop_text
from . import evidence, svg
from .html import CHART_PREFIX, page
from .safe import md, md_cell, md_code, md_text, short, terminal

PART_LABELS = dict((k, v) for k, v in (("dur", "step"), ("kernel", "GPU compute"), ("comm", "communication"),
                                       ("memcpy", "memcpy"), ("memset", "memset"), ("dataloader", "DataLoader wait"),
                                       ("sync", "sync wait"), ("idle", "GPU idle")))
CLASSES = (("resolved", "Resolved"), ("new", "New"), ("still_there", "Still there"), ("unchecked", "Not checked on one side"))


# ----------------------------------------------------------------------------------------------------
# Number formats (shared by every format)


def ms(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def pct(v, sign: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:+.1f} %" if sign else f"{v:.1f} %"


def predicted(p: dict) -> str:
    return ("up to " if p.get("upper_bound") else "") + pct(p.get("predicted_pct"))


def measured(step: dict) -> str:
    """`the step got 28.2 % faster` / `… slower` / `no measured change` (the figure is said beside it)."""
    s = step.get("saving_pct")
    if s is None:
        return "not measured"
    if round(s, 1) == 0:
        return "the step time did not change (0.0 %)"
    return f"the step got {abs(s):.1f} % {'faster' if s > 0 else 'slower'}"


def signed(v, nd: int = 2) -> str:
    """+1.25 / -0.40; a change that rounds to zero is 0.00, never -0.00."""
    if v is None:
        return "–"
    return f"{0.0:.{nd}f}" if round(v, nd) == 0 else f"{v:+.{nd}f}"


def gib(n) -> str:
    return "–" if n is None else f"{n / 2**30:.2f} GiB"


def _moved(n: dict) -> str:
    """A figure both findings quote, in words: "DataLoader share 62.5 % → 10 %"."""
    label, unit = evidence.label_and_unit(n["key"])
    return f"{md(label)} {md(evidence.value(n['before'], unit))} → {md(evidence.value(n['after'], unit))}"


def _val(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v) if str(v) else '""'


def _finding_saving(side: dict | None) -> str:
    if side is None:
        return "–"
    return ("up to " if side.get("upper_bound") else "") + pct(side.get("est_step_saving_pct"))


def headline(cmp: dict) -> list[tuple[str, str, str, str]]:
    """(what, BEFORE, AFTER, change) rows of the step-time table."""
    b, a = cmp["before"], cmp["after"]
    rows = [("Median step, profiled (ms)", ms(b["median_step_ms"]), ms(a["median_step_ms"]),
             pct(_rel(b["median_step_ms"], a["median_step_ms"]), sign=True)),
            ("Fastest – slowest step (ms)", _range(b), _range(a), ""),
            ("Spread (slowest − fastest, % of median)", pct(b["spread_pct"]), pct(a["spread_pct"]), ""),
            ("Steps profiled", str(b["steps"]), str(a["steps"]), "")]
    if b.get("unprofiled_median_step_ms") is not None or a.get("unprofiled_median_step_ms") is not None:
        rows.append(("Median step, unprofiled (ms)", ms(b.get("unprofiled_median_step_ms")),
                     ms(a.get("unprofiled_median_step_ms")),
                     pct(_rel(b.get("unprofiled_median_step_ms"), a.get("unprofiled_median_step_ms")), sign=True)))
    if b.get("profiler_overhead_x") is not None or a.get("profiler_overhead_x") is not None:
        rows.append(("Profiler overhead", _x(b.get("profiler_overhead_x")), _x(a.get("profiler_overhead_x")), ""))
    if b.get("mfu_pct") is not None or a.get("mfu_pct") is not None:
        rows.append(("MFU (model FLOPs / step time / dense peak)", _mfu(b), _mfu(a), _pts(b.get("mfu_pct"), a.get("mfu_pct"))))
    if b.get("unprofiled_mfu_pct") is not None and a.get("unprofiled_mfu_pct") is not None:
        rows.append(("MFU over the unprofiled step", pct(b["unprofiled_mfu_pct"]), pct(a["unprofiled_mfu_pct"]),
                     _pts(b["unprofiled_mfu_pct"], a["unprofiled_mfu_pct"])))
    if b.get("model_flops") is not None or a.get("model_flops") is not None:
        rows.append(("Model FLOPs per step", flop_text(b.get("model_flops")), flop_text(a.get("model_flops")), ""))
    rows += [("GPU busy inside the steps", pct(b["gpu_busy_in_steps_pct"]), pct(a["gpu_busy_in_steps_pct"]),
              _pts(b["gpu_busy_in_steps_pct"], a["gpu_busy_in_steps_pct"])),
             ("GPU busy, whole trace", pct(b["gpu_busy_pct"]), pct(a["gpu_busy_pct"]), _pts(b["gpu_busy_pct"], a["gpu_busy_pct"]))]
    if b.get("peak_allocated_bytes") is not None or a.get("peak_allocated_bytes") is not None:
        rows.append(("Peak memory allocated", gib(b.get("peak_allocated_bytes")), gib(a.get("peak_allocated_bytes")), ""))
    if b.get("peak_reserved_bytes") is not None or a.get("peak_reserved_bytes") is not None:
        rows.append(("Peak memory reserved", gib(b.get("peak_reserved_bytes")), gib(a.get("peak_reserved_bytes")), ""))
    rows.append(("Findings", str(b["findings"]), str(a["findings"]), ""))
    return rows


def _mfu(s: dict) -> str:
    """A side's MFU with the dtypes whose peaks it is measured against: a precision change moves the peak."""
    if s.get("mfu_pct") is None:
        return "–"
    dtypes = "+".join(s.get("mfu_dtypes") or [])
    return pct(s["mfu_pct"]) + (f" ({dtypes})" if dtypes else "")


def _rel(b, a):
    return None if not b or a is None else 100 * (a / b - 1)


def _range(s: dict) -> str:
    return "–" if s.get("min_step_ms") is None else f"{ms(s['min_step_ms'])} – {ms(s['max_step_ms'])}"


def _x(v) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _pts(b, a) -> str:
    return "" if b is None or a is None else f"{a - b:+.1f} pts"


def _ranks(s: dict) -> str:
    """Several traces: the step figures are the slowest rank's (the one the job waits for)."""
    if s["traces"] > 1:
        return f" ({s['traces']} traces; step figures of the slowest, rank {s['rank']})" if s.get("rank") is not None \
            else f" ({s['traces']} traces; step figures of {s['trace']})"
    return ""


def verdict(cmp: dict) -> str:
    st = cmp["step_time"]
    if st.get("saving_pct") is None:
        return st.get("note") or "no step time to compare"
    worse = [p for p in cmp.get("predictions") or [] if p.get("worse")]
    blame = ("; " + ", ".join(f"{p['topic']}'s fix (predicted to save {predicted(p)})" for p in worse)
             + " made training slower" if worse else "")
    return f"{measured(st)} ({st['figure_label']}: {ms(st['before_ms'])} → {ms(st['after_ms'])} ms){blame}"


def counts(cmp: dict) -> str:
    f = cmp["findings"]
    parts = [f"{len(f['resolved'])} resolved", f"{len(f['new'])} new", f"{len(f['still_there'])} still there"]
    if f["unchecked"]:
        parts.append(f"{len(f['unchecked'])} not checked on one side")
    return ", ".join(parts)


def fix_status(p: dict) -> str:
    """"resolved" / "still there; dataloader[0].num_workers 0 → 1 and 2 more settings": what became of the
    finding and of the settings its fix changes (the first that differs; the comparison lists them all)."""
    changed = p.get("changed") or []
    if not changed:
        return p.get("status", "resolved")
    first = f"{changed[0]['key']} {_val(changed[0]['before'])} → {_val(changed[0]['after'])}"
    more = f" and {len(changed) - 1} more setting{'s' if len(changed) > 2 else ''}" if len(changed) > 1 else ""
    return f"{p.get('status', 'resolved')}; {first}{more}"


def prediction_sentence(p: dict, step: dict) -> str:
    """"dataloader-stall predicted 31.8 % (resolved), the step got 28.2 % faster"; a fix applied with a
    slower step: "…: this fix made training slower"."""
    return (f"{p['topic']} predicted {predicted(p)} ({fix_status(p)}), {measured(step)}"
            + (": this fix made training slower" if p.get("worse") else ""))


def gate_line(g: dict) -> str:
    if g["failed"]:
        return "CI gate failed: " + "; ".join(g["reasons"])
    checks = []
    if g.get("fail_on_regression_pct") is not None:
        checks.append(f"step time within +{g['fail_on_regression_pct']:g} %")
    if g.get("fail_on"):
        checks.append(f"no new finding matching --fail-on {g['fail_on']}")
    return "CI gate passed: " + ", ".join(checks)


# ----------------------------------------------------------------------------------------------------
# Text


def render_text(cmp: dict) -> str:
    b, a = cmp["before"], cmp["after"]
    out = [f"{name} {terminal(s['label'])}" + _ranks(s) for name, s in (("BEFORE", b), ("AFTER ", a))]
    for w in cmp["warnings"]:
        out.append(f"warning: {terminal(w)}")
    out += ["", terminal(verdict(cmp)[0].upper() + verdict(cmp)[1:]) + "."]
    if cmp.get("gate"):
        out.append(terminal(gate_line(cmp["gate"])))
    out.append("")
    width = max(len(r[0]) for r in headline(cmp))
    out.append(f"{'':<{width}}  {'BEFORE':>17}  {'AFTER':>17}  change")
    for what, vb, va, ch in headline(cmp):
        out.append(f"{what:<{width}}  {vb:>17}  {va:>17}  {ch}")
    if cmp["breakdown"]:
        out += ["", "Median step split (ms)          BEFORE      AFTER     change"]
        for r in cmp["breakdown"]:
            ch = "" if r["change_ms"] is None else signed(r["change_ms"])
            out.append(f"  {r['label']:<28} {ms(r['before_ms']):>8}   {ms(r['after_ms']):>8}   {ch:>8}")
    out += ["", f"Findings: {counts(cmp)}."]
    for key, title in CLASSES:
        for f in cmp["findings"][key]:
            side = f["after"] if key == "new" else f["before"] or f["after"]
            extra = ""
            if key == "still_there":
                extra = f"  est. saving {_finding_saving(f['before'])} → {_finding_saving(f['after'])}"
            elif key == "unchecked":
                extra = f"  ({f['note']})"
            out.append(f"  {title.lower():<12} {f['rule']} {f['topic']} [{side['severity']}]"
                       f" {terminal(f['title'])}{extra}")
    if cmp["predictions"]:
        out += ["", "Predicted vs measured" + (f" ({cmp['step_time']['figure_label']})" if cmp['step_time'].get('figure_label') else "") + ":"]
        out += [f"  {terminal(prediction_sentence(p, cmp['step_time']))}" for p in cmp["predictions"]]
    for table, name in (("kernels", "Kernels"), ("ops", "Ops")):
        rows = cmp[table][:5]
        if rows:
            out += ["", f"{name} whose time per step changed most (ms per step: the mean, total over the profiled steps):"]
            for r in rows:
                out.append(f"  {r['change_ms_per_step']:+9.3f}  {r['before_ms_per_step']:9.3f} → {r['after_ms_per_step']:9.3f}"
                           f"  {terminal(short(r['name'], 70))}")
    if cmp["environment"]:
        out += ["", "What differs between the runs:"]
        for r in cmp["environment"]:
            out.append(f"  {terminal(r['key'])}: {terminal(short(_val(r['before']), 40))} → {terminal(short(_val(r['after']), 40))}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------------
# Charts


@dataclass
class Chart:
    name: str
    alt: str
    svg: str
    section: str  # the markdown section it follows: "steps", "breakdown", "predictions"


def charts(cmp: dict) -> list[Chart]:
    b, a, st = cmp["before"], cmp["after"], cmp["step_time"]
    out = []
    rows = []
    for name, s, colour in (("BEFORE", b, "#8c959f"), ("AFTER", a, "#0969da")):
        if s.get("median_step_ms") is not None:
            whisker = (s["min_step_ms"], s["max_step_ms"]) if s.get("min_step_ms") is not None else None
            rows.append({"label": f"{name} profiled", "value": s["median_step_ms"], "colour": colour,
                         "text": f"{ms(s['median_step_ms'])} ms" + (f" ({_range(s)})" if whisker else ""), "whisker": whisker})
    for name, s, colour in (("BEFORE", b, "#afb8c1"), ("AFTER", a, "#54aeff")):
        if s.get("unprofiled_median_step_ms") is not None:
            rows.append({"label": f"{name} unprofiled", "value": s["unprofiled_median_step_ms"], "colour": colour,
                         "text": f"{ms(s['unprofiled_median_step_ms'])} ms"})
    if rows:
        out.append(Chart("steps", "Step time before and after", svg.value_bars(
            "Median step time (ms); the whisker spans the fastest to the slowest profiled step", rows), "steps"))
    bars = []
    for r_name, key in (("BEFORE", "before_ms"), ("AFTER", "after_ms")):
        split = {r["part"]: r[key] for r in cmp["breakdown"] if r[key] is not None}
        if split.get("dur") is not None:
            bars.append((r_name, svg.step_parts(split), f"{ms(split['dur'])} ms"))
    if bars:
        out.append(Chart("breakdown", "Median step split before and after",
                         svg.stacked_bars("Median step split (ms)", bars), "breakdown"))
    if cmp["predictions"] and st.get("saving_pct") is not None:
        rows = [{"label": f"{p['rule']} {p['topic']} predicted", "value": p["predicted_pct"], "text": predicted(p),
                 "colour": "#8250df"} for p in cmp["predictions"]]
        rows.append({"label": "measured", "value": st["saving_pct"], "text": pct(st["saving_pct"]) + (
            " faster" if st["saving_pct"] >= 0 else " (slower)"), "colour": "#2da44e" if st["saving_pct"] >= 0 else "#cf222e"})
        out.append(Chart("predictions", "Predicted saving vs measured change",
                         svg.value_bars(f"Step-time saving: predicted on BEFORE vs measured ({st['figure']} medians, %)",
                                        rows, "Each prediction is for its own fix; the measured change is the whole step's."),
                         "predictions"))
    return out


# ----------------------------------------------------------------------------------------------------
# Markdown


def render_markdown(cmp: dict, chart_links: dict | None = None) -> str:
    """`chart_links`: {section: [markdown lines]} put after that section's table (see `files`)."""
    links = chart_links or {}
    b, a, st = cmp["before"], cmp["after"], cmp["step_time"]
    out = ["# gpuadvise compare", ""]
    if cmp["warnings"]:
        out += [f"> **Warning:** {md_text(w)}  " for w in cmp["warnings"]] + [""]
    for name, s in (("BEFORE", b), ("AFTER", a)):
        out.append(f"- **{name}:** {md_code(s['label'])}{_ranks(s)} · {md(s.get('device') or 'device not recorded')}")
    out += ["", "## Verdict", "", f"**{md_text(verdict(cmp)[0].upper() + verdict(cmp)[1:])}.** Findings: {counts(cmp)}.", ""]
    if cmp.get("gate"):
        out += [f"**{md_text(gate_line(cmp['gate']))}**", ""]
    out += ["## Step time", "", "| | BEFORE | AFTER | Change |", "|---|---:|---:|---:|"]
    out += [f"| {what} | {vb} | {va} | {ch} |" for what, vb, va, ch in headline(cmp)]
    out += [""]
    if st.get("figure_label"):
        out += [f"Measured change: from the {st['figure_label']}." + (
            " The profiled medians include the profiler's own overhead." if st["figure"] == "profiled" else ""), ""]
    out += links.get("steps", [])
    if cmp["breakdown"]:
        out += ["## Median step split", "", "| Part | BEFORE (ms) | AFTER (ms) | Change (ms) |", "|---|---:|---:|---:|"]
        for r in cmp["breakdown"]:
            ch = signed(r["change_ms"])
            out.append(f"| {r['label']} | {ms(r['before_ms'])} | {ms(r['after_ms'])} | {ch} |")
        out += ["", "Medians over the profiled steps; GPU parts are unions of GPU activity inside each step.", ""]
        out += links.get("breakdown", [])
    if cmp["predictions"]:
        out += ["## Predicted vs measured", "", "| Finding | On AFTER | Predicted on BEFORE | Measured |",
                "|---|---|---:|---|"]
        for p in cmp["predictions"]:
            out.append(f"| `{p['rule']}` {p['topic']} | {md_cell(fix_status(p))} | {predicted(p)} | {measured(st)}"
                       + (" (this fix made training slower)" if p.get("worse") else "") + " |")
        out += ["", *(f"- {md_text(prediction_sentence(p, st))}." for p in cmp["predictions"]), ""]
        out += ["Each prediction is for its own fix alone; the measured change is the whole step's, with every "
                "change between the runs in it." + (f" Measured from the {st['figure_label']}." if st.get("figure_label") else ""), ""]
        out += links.get("predictions", [])
    out += ["## Findings", ""]
    for key, title in CLASSES:
        fs = cmp["findings"][key]
        if not fs:
            continue
        out += [f"### {title} ({len(fs)})", ""]
        if key == "still_there":
            out += ["| Rule | Topic | Finding | Severity | Est. saving BEFORE → AFTER |", "|---|---|---|---|---|"]
            for f in fs:
                out.append(f"| `{f['rule']}` | `{f['topic']}` | {md(f['title'])} | {f['before']['severity']} → "
                           f"{f['after']['severity']} | {_finding_saving(f['before'])} → {_finding_saving(f['after'])} |")
            moved = [(f, n) for f in fs for n in f.get("numbers") or []]
            if moved:
                out += ["", "How their numbers moved:", ""]
                for f in fs:
                    nums = f.get("numbers") or []
                    if nums:
                        out.append(f"- `{f['rule']}` {f['topic']}: " + "; ".join(
                            _moved(n) for n in nums[:8]))
        else:
            when = "AFTER" if key == "new" else "BEFORE"
            out += [f"| Rule | Topic | Finding | Severity | Est. saving on {when} |" + (" Why |" if key == "unchecked" else ""),
                    "|---|---|---|---|---|" + ("---|" if key == "unchecked" else "")]
            for f in fs:
                side = f["after"] if key == "new" else f["before"] or f["after"]
                row = f"| `{f['rule']}` | `{f['topic']}` | {md(f['title'])} | {side['severity']} | {_finding_saving(side)} |"
                out.append(row + (f" {md_text(f['note'])} |" if key == "unchecked" else ""))
        out.append("")
    if not any(cmp["findings"][k] for k, _ in CLASSES):
        out += ["No findings on either side.", ""]
    for table, name in (("kernels", "Kernels"), ("ops", "Ops")):
        rows = cmp[table]
        if rows:
            out += [f"## {name} whose time changed most", "",
                    "Per step: the mean (total time over the profiled steps), not the median of the step split above.", "",
                    f"| {name[:-1]} | BEFORE (ms/step) | AFTER (ms/step) | Change (ms/step) | Calls/step BEFORE → AFTER |",
                    "|---|---:|---:|---:|---:|"]
            for r in rows:
                out.append(f"| {md_cell(short(r['name'], 80))} | {r['before_ms_per_step']:.3f} | {r['after_ms_per_step']:.3f} | "
                           f"{signed(r['change_ms_per_step'], 3)} | {r['before_count_per_step']:g} → {r['after_count_per_step']:g} |")
            out.append("")
    if cmp["environment"]:
        out += ["## What differs between the runs", "", "| Fact | BEFORE | AFTER |", "|---|---|---|"]
        out += [f"| {md_cell(r['key'])} | {_fact_cell(r['before'])} | {_fact_cell(r['after'])} |" for r in cmp["environment"]]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _fact_cell(v) -> str:
    return "–" if v is None else md_cell(short(_val(v), 80))


def render_json(cmp: dict) -> str:
    from .json import finite

    return json.dumps(finite(cmp), indent=2, allow_nan=False) + "\n"


def _links(cs: list[Chart], href) -> dict:
    out: dict = {}
    for c in cs:
        out.setdefault(c.section, []).extend([f"![{c.alt}]({href(c)})", ""])
    return out


def markdown_files(cmp: dict, out: Path) -> list[tuple[Path, str]]:
    """The report at `out` and its charts beside it (`<stem>-<chart>.svg`), charts first."""
    from .charts import charts_beside

    cs = charts(cmp) if charts_beside(out) else []
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    files = {c.name: out.with_name(f"{stem}-{c.name}.svg") for c in cs}
    text = render_markdown(cmp, _links(cs, lambda c: quote(files[c.name].name)))
    return [(files[c.name], c.svg) for c in cs] + [(out, text)]


def render_html(cmp: dict) -> str:
    cs = charts(cmp)
    text = render_markdown(cmp, _links(cs, lambda c: CHART_PREFIX + c.name))
    return page("gpuadvise compare", text, {c.name: c.svg for c in cs})

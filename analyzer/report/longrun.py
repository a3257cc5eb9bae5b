"""The run-level section of a long run (`Reports.long_runs`, run/longrun.py's `LongRunReport.summary`): the whole
run's step time drawn and summarised, the windows that were recorded and why, the memory trend. Markdown
and text draw it from the same figures; the chart is an SVG (markdown files, HTML) or a sparkline (text,
the TUI)."""

from __future__ import annotations

from gpuadvise.analyzer.model.steprecord import dated

from . import svg
from .safe import md, md_code, terminal

SPARK = "▁▂▃▄▅▆▇█"
SHAPES = {"step": "a step up", "climb": "a steady climb", "faster climb": "an ever faster climb"}
TRIGGERS = {"schedule": "--wait/--warmup/--active", "signal": "a signal", "trigger file": "gpuadvise trigger --file",
            "slower": "--when-slower: the step got slower", "stall": "--when-slower: a periodic stall",
            "every": "--every"}


def sparkline(values: list[float], width: int = 60, level_ms: float | None = None) -> str:
    """The values in `width` characters (the median of each slice), on one scale from 0 (`_scale_top`)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return ""
    n = len(vals)
    width = min(width, n)
    top = _scale_top(vals, level_ms)
    out = []
    for i in range(width):
        part = sorted(vals[i * n // width:(i + 1) * n // width] or [vals[-1]])
        v = part[len(part) // 2]
        out.append(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))])
    return "".join(out)


def _scale_top(vals: list[float], level_ms: float | None = None) -> float:
    """The top of a chart's scale: a third above the run's slowest level (the median of K steps), else its
    90th percentile, so that stalls (drawn at the top) do not flatten the rest of the run."""
    ordered = sorted(vals)
    if level_ms:
        return 1.3 * max(level_ms, ordered[len(ordered) // 2])
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1.15 or 1.0


def shown(run) -> bool:
    """Whether a run has a section to show: enough steps for its levels, or windows after the first (a
    short run's record is in the JSON, and says nothing the trace's own figures do not)."""
    s = run.summary
    return s.get("levels") is not None or len(s.get("windows") or []) > 1 or bool(run.findings)


def headline(s: dict) -> str:
    """One sentence on the step time over the run."""
    lv = s.get("levels")
    steps = f"{s['steps']} step{'s' if s['steps'] != 1 else ''} recorded"
    if lv is None:
        return f"{steps}: too few unprofiled steps to compare the run's early and late step time."
    out = (f"{steps}; median step {lv['early_ms']:.2f} ms early (steps {lv['early_steps'][0]}–{lv['early_steps'][1]}), "
           f"{lv['late_ms']:.2f} ms late (steps {lv['late_steps'][0]}–{lv['late_steps'][1]})")
    if lv.get("began_at") is not None:
        shape = SHAPES.get(lv.get("shape"), "a rise")
        slow = lv.get("slow_steps") or [lv["slow_at"], lv["slow_at"]]
        out += (f"; {shape} from step {lv['began_at']}" + onset_interval(lv)
                + (f" to step {lv['until']}" if lv.get("until") else "")
                + f", to {lv['slow_ms']:.2f} ms ({lv['change_pct']:+.0f} %, the median of steps {slow[0]}–{slow[1]})")
    elif lv.get("shape") == "speed-up" and lv["late_ms"] < lv["early_ms"]:
        out += "; the step got faster during the run, and no slower"
    elif lv.get("shape") == "speed-up":  # faster for a while, not at the end: the verdict follows the two medians
        out += "; no lasting slow-down beyond chance"
    else:
        out += "; no lasting change beyond chance"
    if lv.get("warmup_until") is not None:
        out += f"; steps up to {lv['warmup_until']} were a warm-up"
    return out + "."


def onset_interval(lv: dict) -> str:
    """The onset's interval in words, when it spans more than one step."""
    return dated(*(lv.get("began_between") or (None, None)))


def memory_line(s: dict) -> str | None:
    m = s.get("memory")
    if not m:
        return None
    what = "allocated GPU memory" if m["kind"] == "allocated" else "resident memory"
    mib = 2**20
    return (f"{what} {m['start_bytes'] / mib:.0f} → {m['end_bytes'] / mib:.0f} MiB over steps {m['steps'][0]}–"
            f"{m['steps'][1]} ({m['per_step_bytes'] / 1024:+.0f} KiB per step, rising in {m['rising_share'] * 100:.0f} % "
            f"of {m['samples'] - 1} intervals)")


def _window_why(w: dict) -> str:
    return TRIGGERS.get(w["trigger"], w["trigger"]) + (f": {w['detail']}" if w.get("detail") and w["trigger"] != "schedule" else "")


def causes_across_windows(s: dict) -> list[tuple[str, str, list[tuple[int, str, float, bool]]]]:
    """The causes found in more than one window: (title, topic, [(window, its steps in words, predicted
    saving %, whether the finding is stated with this window's figures)]), in the order the run's causes
    come (once_per_cause in run/longrun.py)."""
    out = []
    for c in s.get("causes") or []:
        held = c.get("windows") or []
        if len(held) < 2:
            continue
        rows = [(w["index"], f"{w['steps'][0]}–{w['steps'][1]}" if w.get("steps") else "–", float(w["saving_pct"]),
                 w["index"] == c.get("kept_in")) for w in held]
        out.append((c.get("title") or c.get("topic") or c.get("rule"), c.get("topic") or "", rows))
    return out


def _saving(pct: float) -> str:
    if pct <= 0:
        return "none predicted"
    return f"{pct:.0f} % of the step" if pct >= 0.5 else "under 1 % of the step"


def _ms(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def markdown_section(run, multi: bool) -> list[str]:
    s = run.summary
    who = f" — {md(run.folder)}" + (f" rank {run.rank}" if run.rank is not None else "") if multi else ""
    out = [f"## Over the run{who}", "", md(headline(s)), ""]
    mem = memory_line(s)
    if mem:
        out += [f"Memory: {md(mem)}.", ""]
    windows = s.get("windows") or []
    if windows:
        out += ["| Window | Steps | Why | Unprofiled around it (ms) | Recorded median (ms) | State | Findings |",
                "|---:|---|---|---:|---:|---|---|"]
        for w in windows:
            steps = f"{w['steps'][0]}–{w['steps'][1]}" if w.get("steps") else "–"
            out.append(f"| {w['index']} | {steps} | {md(_window_why(w))} | {_ms(w.get('level_ms'))} | "
                       f"{_ms(w.get('median_step_ms'))} | {md(w['state'])} | "
                       f"{', '.join(md_code(r) for r in w.get('findings') or []) or '–'} |")
        out.append("")
    across = causes_across_windows(s)
    if across:
        out += ["Causes found in more than one window (each is stated once, with the figures of the window marked *):", "",
                "| Cause | Window | Steps | Predicted saving of its fix |", "|---|---:|---|---:|"]
        for title, topic, rows in across:
            for i, (index, steps, pct, kept) in enumerate(rows):
                out.append(f"| {md(title) + f' ({md_code(topic)})' if i == 0 else ''} | {index}{' *' if kept else ''} | "
                           f"{steps} | {_saving(pct)} |")
        out.append("")
    out += [f"Step record: {md_code(run.record)} (every step's time, written while the script ran; the chart shows "
            "the steps no profiler touched).", ""]
    return out


def text_lines(run, multi: bool) -> list[str]:
    s = run.summary
    who = f" {terminal(run.folder)}" + (f" rank {run.rank}" if run.rank is not None else "") if multi else ""
    out = [f"\nover the run{who}: {terminal(headline(s))}"]
    chart = s.get("chart") or {}
    if chart.get("ms"):
        level = (s.get("levels") or {}).get("slow_ms")
        out.append(f"  step time {sparkline(chart['ms'], level_ms=level)}  (steps {chart['step'][0]}–"
                   f"{chart['step'][-1]}, 0–{_scale_top(chart['ms'], level):.1f} ms; slower steps at the top)")
    mem = memory_line(s)
    if mem:
        out.append(f"  memory: {terminal(mem)}")
    for w in s.get("windows") or []:
        steps = f"steps {w['steps'][0]}–{w['steps'][1]}" if w.get("steps") else "no steps"
        out.append(f"  window {w['index']}: {steps}, {terminal(_window_why(w))} ({terminal(w['state'])})")
    across = causes_across_windows(s)
    if across:
        out.append("  causes in more than one window (predicted saving of the fix; * the window whose figures are stated):")
        for title, topic, rows in across:
            out.append(f"    {terminal(title)} ({terminal(topic)}): " + "; ".join(
                f"window {index}{'*' if kept else ''} (steps {steps}) {_saving(pct)}" for index, steps, pct, kept in rows))
    return out


def chart_svg(run) -> str:
    s = run.summary
    c = s.get("chart") or {}
    lv = s.get("levels") or {}
    bands = [(w["steps"][0], w["steps"][1], f"w{w['index']}: window {w['index']} ({w['trigger']})")
             for w in s.get("windows") or [] if w.get("steps")]
    marks = [(lv["began_at"], f"the rise began at step {lv['began_at']}")] if lv.get("began_at") is not None else []
    ms = c.get("ms") or []
    top = _scale_top(ms, lv.get("slow_ms")) if ms else None
    clipped = top is not None and max(c.get("max_ms") or ms) > top
    note = ("Unprofiled steps (blue median, yellow slowest); shaded: windows" + ("; dashed: rise" if marks else "")
            + ("; taller steps cut at the top" if clipped else "") + ".")
    return svg.line_chart("Step time over the run (ms)", c.get("step") or [], ms, c.get("max_ms"),
                          bands=bands, marks=marks, note=note, y_max=top)

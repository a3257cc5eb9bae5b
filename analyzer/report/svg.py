"""Small self-contained SVG charts, written by hand: horizontal bars, stacked or with a min–max whisker.

No plotting library: the charts are a few rectangles and labels, and hand-written SVG has no
dependency, no fonts or scripts to embed and the same bytes on every machine. Every number a chart
shows is also written as text (the caller formats it exactly as its markdown table does), and each
bar carries a <title> tooltip. Labels may come from a trace: they are stripped of control characters
(not allowed in XML) and escaped.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from .safe import short, terminal

WIDTH = 680
ROW = 22  # px per bar row
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:12px"
TEXT = "#24292f"
MUTED = "#57606a"
GRID = "#d0d7de"

# the parts of a step, as the TUI's overview bar splits it (see gpuadvise/tui/widgets/charts.py)
STEP_PARTS = (
    ("compute", "#2da44e"),
    ("comm", "#8250df"),
    ("copies", "#d4a72c"),
    ("data loader", "#fb8500"),
    ("other idle", "#8c959f"),
)
# a run without a GPU timeline: its training thread's time (model.report.CpuStep), in the same colours
CPU_STEP_PARTS = (
    ("in ops", "#2da44e"),
    ("collective wait", "#8250df"),
    ("data loader", "#fb8500"),
    ("outside ops", "#8c959f"),
)


def _t(text) -> str:
    return escape(terminal(str(text)))


def _a(text) -> str:
    return quoteattr(terminal(str(text)))


def _label_width(labels) -> int:
    longest = max((len(str(x)) for x in labels), default=4)
    return min(max(60, 7 * longest + 12), 260)


def _text_width(texts) -> int:
    """Room right of the longest bar for its value text (≈7 px a character at 12 px)."""
    return min(max(60, 7 * max((len(str(t)) for t in texts), default=4) + 12), 300)


def _frame(title: str, height: int, body: list[str]) -> str:
    head = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label={_a(title)} style="{FONT}">',
            f"<title>{_t(title)}</title>",
            f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>',
            f'<text x="8" y="18" fill="{TEXT}" font-weight="bold">{_t(title)}</text>']
    return "\n".join(head + body + ["</svg>"]) + "\n"


def step_parts(row: dict) -> list[float]:
    """A step's time split as the TUI's bar splits it (ms): GPU compute, communication, copies, GPU idle
    while the training thread waited for data, other GPU idle. The data-loader part is capped at the
    idle time, and parts that overlap are scaled so the bar never exceeds the step."""
    dur = max(float(row.get("dur") or 0.0), 1e-9)
    compute, comm = float(row.get("kernel") or 0.0), float(row.get("comm") or 0.0)
    copies = float(row.get("memcpy") or 0.0) + float(row.get("memset") or 0.0)
    idle = row.get("idle")
    idle = max(float(idle) if idle is not None else dur - compute - comm - copies, 0.0)
    loader = min(float(row.get("dataloader") or 0.0), idle)
    parts = [compute, comm, copies, loader, idle - loader]
    total = sum(parts)
    return [p * dur / total for p in parts] if total > dur else parts


def stacked_bars(title: str, rows: list[tuple[str, list[float], str]], note: str = "", kinds=STEP_PARTS) -> str:
    """One bar per row, split into `kinds` (STEP_PARTS, or CPU_STEP_PARTS for a CPU run) (ms), all on one
    scale; `rows` = (label, parts, value text)."""
    lw = _label_width([r[0] for r in rows])
    plot = WIDTH - lw - _text_width([r[2] for r in rows]) - 16
    top = max((sum(p) for _, p, _ in rows), default=0.0) or 1.0
    y0 = 46
    body = [_legend(y0 - 14, kinds)]
    for i, (label, parts, value) in enumerate(rows):
        y = y0 + i * ROW
        body.append(f'<text x="{lw - 6}" y="{y + 14}" text-anchor="end" fill="{TEXT}">{_t(label)}</text>')
        x = float(lw)
        for (name, colour), p in zip(kinds, parts):
            w = plot * p / top
            if w > 0:
                body.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW - 6}" fill="{colour}">'
                            f"<title>{_t(label)}: {_t(name)} {p:.2f} ms</title></rect>")
            x += w
        body.append(f'<text x="{x + 6:.1f}" y="{y + 14}" fill="{TEXT}">{_t(value)}</text>')
    height = y0 + len(rows) * ROW + (22 if note else 8)
    if note:
        body.append(f'<text x="8" y="{height - 8}" fill="{MUTED}">{_t(note)}</text>')
    return _frame(title, height, body)


def _legend(y: int, kinds=STEP_PARTS) -> str:
    out, x = [], 8
    for name, colour in kinds:
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 14}" y="{y}" fill="{MUTED}">{_t(name)}</text>')
        x += 14 + 7 * len(name) + 16
    return "".join(out)


def value_bars(title: str, rows: list[dict], note: str = "") -> str:
    """Horizontal bars from a zero line (negative values go left). Each row: label, value, text, and
    optionally colour and whisker (lo, hi) drawn over the bar (e.g. the fastest and slowest step)."""
    lw = _label_width([r["label"] for r in rows])
    plot = WIDTH - lw - _text_width([r["text"] for r in rows]) - 16
    values = [r["value"] for r in rows] + [v for r in rows for v in (r.get("whisker") or ())]
    lo, hi = min(0.0, *values) if values else 0.0, max(0.0, *values) if values else 0.0
    span = (hi - lo) or 1.0
    zero = lw + plot * (0 - lo) / span
    y0 = 32
    body = []
    for i, r in enumerate(rows):
        y = y0 + i * ROW
        v = r["value"]
        x1, x2 = sorted((zero, lw + plot * (v - lo) / span))
        colour = r.get("colour", "#0969da")
        body.append(f'<text x="{lw - 6}" y="{y + 14}" text-anchor="end" fill="{TEXT}">{_t(short(r["label"], 40))}</text>')
        body.append(f'<rect x="{x1:.1f}" y="{y + 3}" width="{max(x2 - x1, 0.5):.1f}" height="{ROW - 6}" fill="{colour}">'
                    f"<title>{_t(r['label'])}: {_t(r['text'])}</title></rect>")
        end = x2
        if r.get("whisker"):
            a, b = (lw + plot * (w - lo) / span for w in r["whisker"])
            mid = y + ROW / 2
            body.append(f'<path d="M{a:.1f} {mid:.1f}H{b:.1f}M{a:.1f} {mid - 5:.1f}V{mid + 5:.1f}'
                        f'M{b:.1f} {mid - 5:.1f}V{mid + 5:.1f}" stroke="{TEXT}" stroke-width="1.2" fill="none"/>')
            end = max(end, b)
        body.append(f'<text x="{end + 6:.1f}" y="{y + 14}" fill="{TEXT}">{_t(r["text"])}</text>')
    bottom = y0 + len(rows) * ROW
    body.append(f'<line x1="{zero:.1f}" y1="{y0}" x2="{zero:.1f}" y2="{bottom}" stroke="{GRID}"/>')
    height = bottom + (22 if note else 8)
    if note:
        body.append(f'<text x="8" y="{height - 8}" fill="{MUTED}">{_t(note)}</text>')
    return _frame(title, height, body)


def line_chart(title: str, xs: list[float], ys: list[float], peaks: list[float] | None = None,
               bands: list[tuple[float, float, str]] = (), marks: list[tuple[float, str]] = (), note: str = "",
               unit: str = "ms", y_max: float | None = None) -> str:
    """A value over steps: `ys` as a line, `peaks` (each point's slowest, same xs) as a lighter line above it,
    `bands` (x0, x1, label) shaded behind (the profiled windows), `marks` (x, label) as dashed verticals.
    Values above `y_max` (default: the highest) are drawn at the top."""
    left, right, top, plot_h = 56, 12, 34, 150
    plot_w = WIDTH - left - right
    values = list(ys) + [v for v in (peaks or []) if v is not None]
    if not xs or not values:
        return _frame(title, top + 30, [f'<text x="8" y="{top + 16}" fill="{MUTED}">no steps recorded</text>'])
    x_lo, x_hi = min(xs), max(xs)
    for x0, x1, _ in bands:
        x_lo, x_hi = min(x_lo, x0), max(x_hi, x1)
    x_span = (x_hi - x_lo) or 1.0
    y_hi = y_max or max(values) * 1.05 or 1.0

    def px(x):
        return left + plot_w * (x - x_lo) / x_span

    def py(y):
        return top + plot_h * (1 - min(y, y_hi) / y_hi)

    body = []
    for frac in (0.0, 0.5, 1.0):  # a light grid with its values
        y = y_hi * frac
        body.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + plot_w}" y2="{py(y):.1f}" stroke="{GRID}"/>'
                    f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end" fill="{MUTED}">{y:.3g}</text>')
    for x0, x1, label in bands:
        body.append(f'<rect x="{px(x0):.1f}" y="{top}" width="{max(px(x1) - px(x0), 2):.1f}" height="{plot_h}" '
                    f'fill="#ddf4ff"><title>{_t(label)}</title></rect>'
                    f'<text x="{px(x0) + 2:.1f}" y="{top + 11}" fill="#0969da" font-size="10">{_t(label.split(":")[0])}</text>')
    for x, label in marks:
        body.append(f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{top + plot_h}" stroke="#cf222e" '
                    f'stroke-dasharray="4 3"><title>{_t(label)}</title></line>')
    if peaks:
        pts = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, peaks) if v is not None)
        body.append(f'<polyline points="{pts}" fill="none" stroke="#d4a72c" stroke-width="1"/>')
    pts = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, ys))
    body.append(f'<polyline points="{pts}" fill="none" stroke="#0969da" stroke-width="1.6"/>')
    bottom = top + plot_h
    body.append(f'<line x1="{left}" y1="{bottom}" x2="{left + plot_w}" y2="{bottom}" stroke="{TEXT}"/>'
                f'<text x="{left}" y="{bottom + 14}" fill="{MUTED}">step {x_lo:.0f}</text>'
                f'<text x="{left + plot_w}" y="{bottom + 14}" text-anchor="end" fill="{MUTED}">step {x_hi:.0f}</text>'
                f'<text x="{left - 6}" y="{top - 8}" text-anchor="end" fill="{MUTED}">{_t(unit)}</text>')
    height = bottom + 22 + (18 if note else 0)
    if note:
        body.append(f'<text x="8" y="{height - 6}" fill="{MUTED}">{_t(note)}</text>')
    return _frame(title, height, body)

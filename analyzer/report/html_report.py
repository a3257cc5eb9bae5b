"""HTML report: the markdown report with its charts inline, as one self-contained page (html.py)."""

from __future__ import annotations

from .charts import chart_lines, charts
from .html import CHART_PREFIX, page
from .markdown import render as markdown


def render(reports) -> str:
    cs = charts(reports)
    text = markdown(reports, charts=chart_lines(cs, lambda c: CHART_PREFIX + c.name))
    return page("gpuadvise report", text, {c.name: c.svg for c in cs})

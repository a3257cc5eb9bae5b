"""Renderers: the analysis (`model.report.Reports`) drawn as text, markdown, JSON or HTML (with SVG charts). They read the
reports only, never the loader or the files."""

from __future__ import annotations

FORMATS = ("text", "md", "json", "html")
EXTENSIONS = {".md": "md", ".markdown": "md", ".json": "json", ".txt": "text", ".html": "html", ".htm": "html"}


def render(reports, fmt: str, top: int = 5) -> str:
    if fmt == "json":
        from .json import render as r

        return r(reports)
    if fmt == "md":
        from .markdown import render as r

        return r(reports)
    if fmt == "html":
        from .charts import html

        return html(reports)
    from .text import render as r

    return r(reports, top=top)

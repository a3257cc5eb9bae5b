"""Renderers: the analysis (`model.report.Reports`) drawn as text, markdown or JSON. They read the
reports only, never the loader or the files."""

from __future__ import annotations

FORMATS = ("text", "md", "json")
EXTENSIONS = {".md": "md", ".markdown": "md", ".json": "json", ".txt": "text"}


def render(reports, fmt: str, top: int = 5) -> str:
    if fmt == "json":
        from .json import render as r

        return r(reports)
    if fmt == "md":
        from .markdown import render as r

        return r(reports)
    from .text import render as r

    return r(reports, top=top)

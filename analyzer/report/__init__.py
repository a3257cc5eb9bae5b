"""Renderers: the analysis (`model.report.Reports`) drawn as text, markdown, JSON or HTML (with SVG
charts), and a comparison likewise. They read the reports only, never the loader, the files or the rule
catalog. Which format draws what, and which file extensions pick it, is in formats.py."""

from __future__ import annotations

from .formats import NAMES as FORMATS, render  # noqa: F401 - the names scripts import

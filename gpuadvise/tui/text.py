"""Formatting helpers shared by the screens.

Trace names are untrusted. Everything that shows one passes it through `clean` (terminal control and
escape sequences stripped) and puts it on screen inside a rich `Text`, never a markup string, so a `[`
in a kernel name is just a character."""

from __future__ import annotations

import math
from pathlib import Path

from gpuadvise.analyzer.report.safe import terminal


def clean(name) -> str:
    """A trace-sourced string made safe for the terminal, on one line."""
    return terminal(str(name)).replace("\n", " ").replace("\r", " ").replace("\t", " ")


def ms(us: float, digits: int = 2) -> str:
    """Microseconds shown as milliseconds."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "–"
    return f"{us / 1e3:,.{digits}f}"


def duration(us: float) -> str:
    """A duration with a unit that fits its size."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "–"
    us = float(us)
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3g} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def nbytes(n: float) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "–"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def pct(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{float(v):.1f} %"


def short_source(source: str) -> str:
    """A trace path as shown in headers: the file name (folders can be long and say little)."""
    return Path(source).name or source

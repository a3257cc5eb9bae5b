"""JSON report: `summary` (the heading trace's figures and the counts), `findings` (the finding fields) and
`traces` (each one's summary), for scripts and CI; `job` (ranks, per-rank stats, the slowest rank per step)
when two or more ranks were analysed together. It is `model.summary.RunSummary` serialised."""

from __future__ import annotations

import json
import math

from gpuadvise.version import __version__

from gpuadvise.analyzer.model.summary import summarize


def render(reports) -> str:
    return json.dumps(document(reports), indent=2, default=_default, allow_nan=False) + "\n"


def document(reports) -> dict:
    """The report as plain JSON-able data (what `render` writes): the serialisation of the analysis's
    summary (`model.summary`); NaN and infinities become null."""
    return finite({"tool": "gpuadvise", "version": __version__, **summarize(reports).to_dict()})


def finite(o):
    """As JSON holds it: NaN/inf become null (they are not JSON), numpy scalars Python numbers, tuples lists."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return finite(o.item())
    except ImportError:  # pragma: no cover
        pass
    return o


def _default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")

"""The shared trace corpus (`../shared/traces`, or $GPUADVISE_TRACES) and its analyses, once per test process.

test_corpus.py and test_consistency.py check different things of the same analyses: `analysed` runs each
file through the engine once, and both modules sit in the "corpus" xdist group, so that under
`-n N --dist loadgroup` one worker analyses each file once for both (the analysis is ~95 % of their cost;
rendering is milliseconds).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from _cli_support import REPO, is_corpus_trace

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
SNAPSHOT_NAMES = (".pickle", ".pkl")
XDIST_GROUP = "corpus"


def corpus_files() -> list[str]:
    """Every trace and memory snapshot of the corpus (holdout included), relative to TRACES; [] without it."""
    if not TRACES.is_dir():
        return []
    files = [p for p in TRACES.rglob("*") if is_corpus_trace(p) or (p.is_file() and p.name.endswith(SNAPSHOT_NAMES))]
    return sorted(p.relative_to(TRACES).as_posix() for p in files)


@functools.cache
def analysed(path: str) -> tuple:
    """The engine's reports for one input path (a tuple: callers only read it)."""
    from gpuadvise.analyzer.run.engine import analyze_paths

    return tuple(analyze_paths([path]))

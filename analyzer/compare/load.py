"""Analyse a run into a side of `gpuadvise compare`: a run folder, a trace or a folder of rank traces, through
run/'s API. Kept apart from side.py and diff.py, which only read analyses (the run-level analysis of a long
run compares its windows with them, so they must not depend on run/)."""

from __future__ import annotations

from .side import Side


def load_side(path, jobs: int | None = None, cache: bool | None = None, label: str | None = None) -> Side:
    """Analyse one run (a run folder, a trace, or a folder of rank traces; or the sources
    `run.resolve_inputs` made of one) into a side. The run.json facts come with the reports."""
    from gpuadvise.analyzer import run

    reports = run.analyze(path if not isinstance(path, str) else [path], jobs=jobs, cache=cache)
    if label is None:
        label = path if isinstance(path, str) else " ".join(str(s.path) for s in path)
    return Side.of(reports, label=label)

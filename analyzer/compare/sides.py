"""A side of `gpuadvise compare`: one run (a run folder, a trace, a folder of rank traces) analysed through
run/'s API and made into the plain data `diff.compare` reads."""

from __future__ import annotations

from .diff import side_from_reports


def load_side(path, jobs: int | None = None, cache: bool | None = None, label: str | None = None) -> dict:
    """Analyse one run (a run folder, a trace, or a folder of rank traces; or the sources
    `run.resolve_inputs` made of one) into a side. The run.json facts come with the reports."""
    from gpuadvise.analyzer import run

    reports = run.analyze(path if not isinstance(path, str) else [path], jobs=jobs, cache=cache)
    if label is None:
        label = path if isinstance(path, str) else " ".join(str(s.path) for s in path)
    return side_from_reports(reports, label=label)

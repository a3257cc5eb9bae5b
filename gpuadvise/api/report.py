"""`gpuadvise.analyze(...)`: the analysis as a `Report` object for scripts and notebooks.

The analysis runs through analyzer.run's one entry point (`run.analyze`), and a `Report` is built
from the JSON document the CLI writes (`--format json`), so its findings carry exactly the fields,
numbers and predictions every other output shows; the markdown, HTML and JSON texts come from the
same format registry as `gpuadvise analyze --format ...`.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Finding:
    """One problem found: what it is, how sure and how costly, and what to change."""

    rule: str  # rule code, e.g. "GA102"
    topic: str  # e.g. "dataloader-stall"
    severity: str  # "high", "medium", "low" or "info"
    title: str
    message: str  # what was measured
    recommendation: str  # advice, then the rule's general fix (text, may hold a code block)
    saving_pct: float  # predicted share of today's step time the fix saves
    saving_basis: str  # how that was predicted
    saving_is_upper_bound: bool
    evidence: dict[str, Any] = field(default_factory=dict)  # steps, time ranges, items, sources, numbers
    advice: str = ""  # what to do about this instance
    fix: str = ""  # the rule's general fix (markdown from its docs)
    rank: int | None = None
    trace: str | None = None

    @classmethod
    def _from_json(cls, d: dict) -> Finding:
        impact = d.get("impact") or {}
        return cls(rule=d["rule"], topic=d["topic"], severity=d["severity"], title=d["title"], message=d["message"],
                   recommendation=d.get("recommendation", ""), saving_pct=float(impact.get("est_step_saving_pct", 0.0)),
                   saving_basis=impact.get("basis", ""), saving_is_upper_bound=bool(impact.get("upper_bound")),
                   evidence=d.get("evidence") or {}, advice=d.get("advice", ""), fix=d.get("fix", ""),
                   rank=d.get("rank"), trace=d.get("trace"))


class Report:
    """The analysis of one run folder, trace or snapshot (or several ranks together)."""

    def __init__(self, reports, document: dict):
        self._reports = reports  # the analysis the renderers draw
        self._document = document
        self.findings: list[Finding] = [Finding._from_json(f) for f in document.get("findings", [])]
        self.summary: dict[str, Any] = dict(document.get("summary") or {})

    def __repr__(self) -> str:
        return f"<gpuadvise.Report: {len(self.findings)} finding(s), {self.summary.get('traces')} source(s)>"

    def to_json(self) -> str:
        from gpuadvise.analyzer.report import render

        return render(self._reports, "json")

    def to_markdown(self) -> str:
        from gpuadvise.analyzer.report import render

        return render(self._reports, "md")

    def to_html(self) -> str:
        """The full HTML page `gpuadvise analyze --format html` writes (charts included)."""
        from gpuadvise.analyzer.report import render

        return render(self._reports, "html")

    def to_text(self) -> str:
        from gpuadvise.analyzer.report import render

        return render(self._reports, "text")

    # -- Jupyter rich display -------------------------------------------------------------------------------
    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        """A fragment for a notebook cell (the full page of `to_html` would bring its own <html>)."""
        e = html.escape
        s = self.summary
        head = f"{len(self.findings)} finding(s)"
        if s.get("median_step_ms") is not None:
            head += f"; median step {s['median_step_ms']} ms over {s.get('steps')} step(s)"
        if s.get("gpu_busy_pct") is not None:
            head += f"; GPU busy {s['gpu_busy_pct']} %"
        rows = []
        for f in self.findings:
            saving = f"{'up to ' if f.saving_is_upper_bound else ''}{f.saving_pct:.1f} %"
            rows.append("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in (f.severity, f.topic, saving)) +
                        f"<td><b>{e(f.title)}</b><br>{e(f.message)}</td>"
                        f"<td><pre>{e(f.recommendation)}</pre></td></tr>")
        table = ("<table><thead><tr><th>severity</th><th>topic</th><th>est. saving</th><th>finding</th>"
                 "<th>recommendation</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>") if rows else ""
        return f'<div class="gpuadvise-report"><p>{e(head)}</p>{table}</div>'


def analyze(path_or_paths: PathLike | Sequence[PathLike]) -> Report:
    """Analyse a run folder, a trace, a memory snapshot, or several (ranks of one job).

    Raises `gpuadvise.InputError` (one line naming the file and the problem) for bad input.
    """
    from gpuadvise.analyzer import run
    from gpuadvise.analyzer.report import render

    if isinstance(path_or_paths, (str, os.PathLike)):
        paths = [os.fspath(path_or_paths)]
    else:
        paths = [os.fspath(p) for p in path_or_paths]
    reports = run.analyze(run.resolve_inputs(paths))
    return Report(reports, json.loads(render(reports, "json")))

"""The rule contract. A rule is one module in this package that defines `RULE = SomeRule()`.

docs/rule-api.md is the guide for writing one: what `check(a)` may read, with columns and units.

The module docstring is the rule's documentation, with these headings (a test enforces them):
`## What it detects`, `## Why it matters`, `## Fix`, `## Thresholds`. `gpuadvise explain CODE`
prints it. `positive()` and `negative()` build the rule's own fixtures: a trace (or, for a rule that
reads allocator snapshots, a snapshot) that must trigger it and a near miss that must not.

Two kinds of rule:
- `Rule`, on one trace or snapshot: `check(a)` gets an `Analysis`. `requires` names the inputs it
  reads: "trace" (the model and its metrics) and/or "memory" (`Analysis.memory`). The engine runs a
  rule only when all of them exist, so a snapshot on its own never gets a trace verdict.
- `JobRule`, on the job view of ≥2 ranks: it runs once per multi-rank analysis, after every rank was
  analysed, and `check(a)` gets a `job.JobAnalysis` (`a.job`, `a.rank_findings`). Its fixtures are
  `RankFolder`s (one trace per rank, written as a folder), and it sets `Finding.rank` /
  `Finding.trace` itself when a finding is about one rank.
- `RunRule`, on a long run: it runs once per process of a run folder with a step record, after its
  windows were analysed, and `check(a)` gets a `longrun.RunAnalysis` (the whole run's step times and
  memory samples, the windows and their comparisons). Its fixtures are `RunFolder`s.
"""

from __future__ import annotations

import inspect
import re
import sys

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.job.job import JobAnalysis
from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis
from gpuadvise.analyzer.model.findings import Evidence, Finding, Impact, severity_for
from gpuadvise.fixtures.builder import RankFolder, TraceBuilder
from gpuadvise.fixtures.longrun import RunFolder

DOC_HEADINGS = ("## What it detects", "## Why it matters", "## Fix", "## Thresholds")


class Rule:
    code: str = ""  # stable id, e.g. GA101
    name: str = ""  # kebab-case name of the pattern
    topic: str = ""  # what findings are grouped by; a rule that leaves it empty gets its `name`
    title: str = ""  # one line
    thresholds: dict = {}
    requires: tuple = ("trace",)
    # a rule on one rank's trace read alone whose finding the job's rules replace once every rank's trace is
    # analysed with it (the engine drops its findings from the ranks of a job)
    job_replaces: bool = False
    # its check walks every event or op of the trace, so its time grows with the trace: when a big trace's
    # rules are shared between two processes (run/rulequeue.py), such rules are taken first, and the
    # cheap ones after them even out the two processes' ends. It changes nothing else.
    costly: bool = False
    # the run.json facts its fix changes, as `gpuadvise compare` names them ("dataloader[*].num_workers": `*`
    # is any index or word): compare counts the fix as applied where one of them differs between the runs
    fix_facts: tuple = ()

    def applied_in(self, key: str) -> bool:
        """Whether a fact that differs between two runs (compare's key) is one this rule's fix changes."""
        return any(re.fullmatch(re.escape(p).replace(r"\*", r"[^.\]]*"), key) for p in self.fix_facts)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.topic and cls.name:
            cls.topic = cls.name

    @property
    def job_level(self) -> bool:
        """Whether the rule runs on the job view of ≥2 ranks rather than on one trace."""
        return isinstance(self, JobRule)

    @property
    def sections(self) -> dict[str, str]:
        """The docs' sections by heading ("What it detects", ...), text without the heading line."""
        parts = re.split(r"^## (.+)$", self.docs, flags=re.M)
        return {head.strip(): body.strip() for head, body in zip(parts[1::2], parts[2::2])}

    @property
    def summary(self) -> str:
        """The docs' first line without the "name: " prefix: one sentence on what the rule finds."""
        first = self.docs.split("\n", 1)[0]
        return first.split(":", 1)[1].strip() if first.startswith(f"{self.name}:") else first.strip()

    def check(self, a: Analysis) -> list[Finding]:
        raise NotImplementedError

    def positive(self) -> TraceBuilder:
        raise NotImplementedError

    def negative(self) -> TraceBuilder:
        raise NotImplementedError

    # -- helpers for subclasses -------------------------------------------------------------------
    @property
    def docs(self) -> str:
        return inspect.cleandoc(sys.modules[type(self).__module__].__doc__ or "")

    @property
    def fix(self) -> str:
        """The `## Fix` section of the docs, used as the general part of each recommendation."""
        m = re.search(r"^## Fix\n(.*?)(?=^## |\Z)", self.docs, flags=re.S | re.M)
        return m.group(1).strip() if m else ""

    def finding(self, *, message: str, evidence: Evidence, saving: float, basis: str, advice: str,
                severity: str | None = None, title: str | None = None, range_pct: tuple[float, float] | None = None,
                after: str | None = None, fix: str | None = None, removes: list | None = None) -> Finding:
        """`fix` replaces the rule's general Fix text when the input makes part of it wrong (a setting
        the run records as already on). `removes`: the keys (`a.collectives.keys()`) of the collectives
        the fix takes away, for what it saves a job (they stop holding the ranks together)."""
        saving = round(max(0.0, saving), 1)
        span = None
        if range_pct is not None:
            lo, hi = sorted(round(max(0.0, min(100.0, v)), 1) for v in range_pct)
            span = [min(lo, saving), max(hi, saving)]
        return Finding(
            rule=self.code,
            topic=self.topic,
            severity=severity or severity_for(saving),
            title=title or self.title,
            message=message,
            evidence=evidence,
            impact=Impact(est_step_saving_pct=saving, basis=basis, range_pct=span, after=after, removes=removes),
            advice=advice.strip(),
            fix=(self.fix if fix is None else fix).strip(),
        )


class JobRule(Rule):
    """A rule on the job view of ≥2 ranks (see the module docstring). The engine runs it once, after
    every rank, only when the analysis has at least two ranks; its fixtures are `RankFolder`s."""

    requires: tuple = ("ranks",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.requires != ("ranks",):
            raise TypeError(f"{cls.__name__}: a job rule reads the job view only (requires = ('ranks',))")

    def check(self, a: JobAnalysis) -> list[Finding]:
        raise NotImplementedError

    def positive(self) -> RankFolder:
        raise NotImplementedError

    def negative(self) -> RankFolder:
        raise NotImplementedError


class RunRule(Rule):
    """A rule on a long run (see the module docstring): once per process with a step record; its fixtures
    are `RunFolder`s."""

    requires: tuple = ("run",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.requires != ("run",):
            raise TypeError(f"{cls.__name__}: a run rule reads the run's record and windows only (requires = ('run',))")

    def check(self, a: RunAnalysis) -> list[Finding]:
        raise NotImplementedError

    def positive(self) -> RunFolder:
        raise NotImplementedError

    def negative(self) -> RunFolder:
        raise NotImplementedError

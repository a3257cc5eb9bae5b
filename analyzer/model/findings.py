"""A finding: what is slow, the numbers that prove it, what fixing it would save, and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SEVERITIES = ("high", "medium", "low", "info")


@dataclass
class Evidence:
    steps: list[int] = field(default_factory=list)  # ProfilerStep numbers affected
    time_ranges_ms: list[tuple[float, float]] = field(default_factory=list)  # where in the trace (from its start)
    items: list[dict] = field(default_factory=list)  # top offenders: name, count, total_ms, ...
    sources: list[str] = field(default_factory=list)  # user source lines (file.py(line): func)
    numbers: dict = field(default_factory=dict)  # the measured figures the message quotes
    # the step each time range lies in (None: outside every step), set by the engine (place_ranges) so that
    # renderers show the ranges in step order beside their steps; not part of the JSON
    range_steps: list[int | None] = field(default_factory=list)

    def place_ranges(self, steps: list[tuple[int, float, float]]) -> None:
        """Name the step of each time range: `steps` are (number, start ms, end ms) from the trace start;
        a range belongs to the step that holds its middle."""
        placed = []
        for a, b in self.time_ranges_ms:
            mid = (a + b) / 2
            placed.append(next((n for n, s, e in steps if s <= mid <= e), None))
        self.range_steps = placed


@dataclass
class Impact:
    est_step_saving_pct: float  # predicted % of today's (median) step time saved by the fix
    basis: str  # how it was predicted
    upper_bound: bool = False  # True when the figure is a ceiling (a symptom), not a fix's prediction
    # [low, high] % of today's step when the trace cannot pin the effect down (or fixes differ); the
    # headline is the estimate for the recommended fix, inside the range
    range_pct: list[float] | None = None
    # topic of another finding whose fix this saving depends on: the figure is what this fix adds to it
    after: str | None = None
    # a finding on a rank of a multi-rank job: % of the job's step saved when every rank that shows the
    # cause gets the fix (collectives end when their last rank arrives), and how that was predicted
    job_pct: float | None = None
    job_basis: str | None = None
    # the collectives the fix removes on this rank (measure.job.collectives keys), for the job's prediction;
    # not part of the JSON
    removes: list | None = None


@dataclass
class Finding:
    rule: str
    topic: str
    severity: str
    title: str
    message: str
    evidence: Evidence
    impact: Impact
    advice: str  # what to do about this instance (may quote trace or run.json values)
    fix: str = ""  # the rule's general Fix text (markdown from its docs), the same for every instance
    rank: int | None = None
    trace: str | None = None

    @property
    def recommendation(self) -> str:
        """Advice then the general fix, as one text (the JSON's `recommendation`, kept for scripts)."""
        return (self.advice + "\n\n" + self.fix).strip()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["impact"].pop("removes", None)
        d["evidence"].pop("range_steps", None)
        d["evidence"]["time_ranges_ms"] = [list(r) for r in self.evidence.time_ranges_ms]
        # the JSON keeps its field order: recommendation where it always was, advice and fix after
        out = {k: d[k] for k in ("rule", "topic", "severity", "title", "message", "evidence", "impact")}
        out["recommendation"] = self.recommendation
        out.update((k, d[k]) for k in ("rank", "trace", "advice", "fix"))
        return out


def order(findings: list, job: bool = False) -> list:
    """By severity, then predicted saving, biggest first: an `[info]` note never stands above a `[low]`
    finding. Within a severity a symptom's ceiling (upper_bound) does not outrank a cause that explains
    at least half of it: the user should read the cause first. In a job's report (`job`) a rank's
    finding counts by what its fix saves the job (`impact.job_pct`) where that was computed."""

    def saving(f) -> float:
        return f.impact.job_pct if job and f.impact.job_pct is not None else f.impact.est_step_saving_pct

    causes = [saving(f) for f in findings if not f.impact.upper_bound]
    top_cause = max(causes, default=0.0)

    def key(f):
        est = saving(f)
        if f.impact.upper_bound and top_cause >= 0.5 * est:
            est = top_cause - 1e-6
        rank = SEVERITIES.index(f.severity) if f.severity in SEVERITIES else len(SEVERITIES)
        own = f.impact.est_step_saving_pct if job else 0.0  # equal for the job: the larger rank's figure first
        return (rank, -est, -own, f.rule, f.rank if f.rank is not None else -1)

    return sorted(findings, key=key)


def severity_for(saving_pct: float, high: float = 10.0, medium: float = 3.0) -> str:
    """Severity follows the predicted saving: what matters is the time the user gets back."""
    if saving_pct >= high:
        return "high"
    if saving_pct >= medium:
        return "medium"
    return "low"

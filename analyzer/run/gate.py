"""The CI gate: `--fail-on SEVERITY|TOPIC[,…]` and `--fail-on-regression PCT`.

A severity is a threshold (`medium` matches medium and high findings); a topic, or a rule code or
name, matches exactly. Exit code 1 says the gate tripped; it stays apart from bad input (2) and
internal errors (3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.model.findings import SEVERITIES


# SEVERITIES runs from the most to the least severe: a smaller rank is more severe
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class FailOn:
    """What `--fail-on` matches: findings at or above `severity`, and findings of these topics/rules."""

    text: str = ""
    severity: str | None = None
    topics: set[str] = field(default_factory=set)
    rules: set[str] = field(default_factory=set)

    def matches(self, finding: dict) -> bool:
        sev = finding.get("severity")
        if self.severity is not None and sev in _RANK and _RANK[sev] <= _RANK[self.severity]:
            return True
        return finding.get("topic") in self.topics or str(finding.get("rule", "")).upper() in self.rules

    def __bool__(self) -> bool:
        return self.severity is not None or bool(self.topics) or bool(self.rules)


def parse_fail_on(text: str | None) -> FailOn:
    """`high`, `dataloader-stall,host-sync`, `medium,GA110`; an unknown word is an InputError that
    lists the valid ones."""
    if text is None:
        return FailOn()
    from gpuadvise.rules import all_rules

    rules = all_rules()
    topics = {r.topic for r in rules}
    by_name = {r.name.lower(): r for r in rules}
    codes = {r.code.upper() for r in rules}
    out = FailOn(text=text)
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise InputError(None, f"--fail-on needs a value; {_valid(rules)}")
    for word in words:
        low = word.lower()
        if low in _RANK:
            # several severities: the lowest one is the threshold
            if out.severity is None or _RANK[low] > _RANK[out.severity]:
                out.severity = low
        elif low in topics:
            out.topics.add(low)
        elif word.upper() in codes:
            out.rules.add(word.upper())
        elif low in by_name:
            out.rules.add(by_name[low].code.upper())
        else:
            raise InputError(None, f"--fail-on: unknown value {word!r}; {_valid(rules)}")
    return out


def _valid(rules) -> str:
    topics = sorted({r.topic for r in rules})
    return (f"valid values are a severity ({', '.join(SEVERITIES)}: that severity or worse), a topic "
            f"({', '.join(topics)}) or a rule code (GA1xx), comma-separated")


def matching(findings: list[dict], fail_on: FailOn) -> list[dict]:
    return [f for f in findings if fail_on and fail_on.matches(f)]


def describe(findings: list[dict], limit: int = 5) -> str:
    """`GA102 dataloader-stall (high), …` for the one line that says why the gate tripped."""
    parts = [f"{f.get('rule')} {f.get('topic')} ({f.get('severity')})" for f in findings[:limit]]
    more = f" and {len(findings) - limit} more" if len(findings) > limit else ""
    return ", ".join(parts) + more


def parse_regression(text: str | None) -> float | None:
    """`--fail-on-regression 5` or `5%`: a step-time increase, in percent, that is still allowed."""
    if text is None:
        return None
    raw = text.strip().rstrip("%").strip()
    try:
        pct = float(raw)
    except ValueError:
        pct = math.nan
    if not math.isfinite(pct) or pct < 0:
        raise InputError(None, f"--fail-on-regression: expected a percentage ≥ 0 (e.g. 5 or 2.5%), got {text!r}")
    return pct

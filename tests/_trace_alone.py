"""A run folder against its trace alone: the same topics fire, with predicted savings within 5 points,
except the topics docs/rule-api.md (section 10) lists as needing run.json facts (its first table); the
topics of its second table must fire both ways, but their savings rest on run.json and are not compared.

The tests that already analyse a run folder (rule fixtures, the H100 run folders, the CPU end-to-end runs)
analyse its trace once more without run.json and call `disagreements` on the two.
"""

from __future__ import annotations

import re
from pathlib import Path

from _cli_support import REPO

RULE_API = REPO / "docs" / "rule-api.md"
SAVING_POINTS = 5.0


def _tables() -> list[frozenset[str]]:
    """The topics of each table in docs/rule-api.md's "Topics that need run.json facts" section."""
    text = RULE_API.read_text(encoding="utf-8")
    m = re.search(r"^## \d+\. Topics that need run\.json facts\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert m, "docs/rule-api.md has no section 'Topics that need run.json facts'"
    tables = re.split(r"\n\n(?=[^|])", m.group(1))
    found = [frozenset(re.findall(r"^\|\s*`([\w-]+)`", t, flags=re.M)) for t in tables]
    return [t for t in found if t]


def needs_run_json() -> frozenset[str]:
    """Topics that fire only with run.json facts (the section's first table)."""
    return _tables()[0]


def saving_needs_run_json() -> frozenset[str]:
    """Topics whose saving rests on a run.json fact (the section's second table): topics compared only."""
    tables = _tables()
    return tables[1] if len(tables) > 1 else frozenset()


def savings(findings) -> dict[str, float]:
    """topic → the largest predicted saving among its findings (Finding objects or JSON dicts)."""
    out: dict[str, float] = {}
    for f in findings:
        topic = f["topic"] if isinstance(f, dict) else f.topic
        pct = f["impact"]["est_step_saving_pct"] if isinstance(f, dict) else f.impact.est_step_saving_pct
        out[topic] = max(pct, out.get(topic, float("-inf")))
    return out


def disagreements(with_run_json, alone, where: str | Path = "") -> list[str]:
    """What differs between the findings of a run folder and of its trace alone, in words ([] if nothing)."""
    a, b = savings(with_run_json), savings(alone)
    exempt, topic_only = needs_run_json(), saving_needs_run_json()
    out = []
    for topic in sorted(set(a) | set(b)):
        if topic in exempt:
            continue
        if topic not in b:
            out.append(f"{where}: {topic} ({a[topic]:.1f} %) fires with run.json only")
        elif topic not in a:
            out.append(f"{where}: {topic} ({b[topic]:.1f} %) fires from the trace alone only")
        elif abs(a[topic] - b[topic]) > SAVING_POINTS and topic not in topic_only:
            out.append(f"{where}: {topic} predicts {a[topic]:.1f} % with run.json, {b[topic]:.1f} % from the trace alone")
    return out

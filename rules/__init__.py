"""The rule catalog. Every module here that defines `RULE` is a rule; nothing else needs editing.

`base` holds the contract (`Rule`, `JobRule`), `catalog` the catalog as data (the docs' rule pages and table, JSON),
`cli` the `rules` and `explain` commands; docs/rule-api.md is the guide for writing a rule.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache


def rule_modules() -> list[str]:
    """The modules that may hold a rule, by import name: every module here but the contract, the catalog
    and the CLI (a job's fork server imports them all before it forks its workers: run/ranks.py)."""
    return [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__)
            if not info.name.startswith("_") and info.name not in ("base", "catalog", "cli")]


@lru_cache(maxsize=1)
def all_rules() -> tuple:
    from .base import Rule

    found = []
    for name in rule_modules():
        module = importlib.import_module(name)
        rule = getattr(module, "RULE", None)
        if isinstance(rule, Rule):
            found.append(rule)
    codes = [r.code for r in found]
    dupes = {c for c in codes if codes.count(c) > 1}
    if dupes:
        raise RuntimeError(f"duplicate rule codes: {sorted(dupes)}")
    return tuple(sorted(found, key=lambda r: r.code))


def find_rule(key: str):
    """A rule by code (GA102) or name (dataloader-stall), case-insensitive; None if unknown."""
    key = key.strip().lower()
    for rule in all_rules():
        if key in (rule.code.lower(), rule.name.lower()):
            return rule
    return None

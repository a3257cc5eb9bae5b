"""The rule catalog. Every module here that defines `RULE` is a rule; nothing else needs editing.

`base` holds the contract (`Rule`, `JobRule`), `catalog` the catalog as data (the docs' rule pages and table, JSON),
`cli` the `rules` and `explain` commands; docs/rule-api.md is the guide for writing a rule.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache


@lru_cache(maxsize=1)
def all_rules() -> tuple:
    from .base import Rule

    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in ("base", "catalog", "cli"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
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

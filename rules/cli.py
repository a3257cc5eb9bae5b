"""`gpuadvise rules` (the catalog, one line a rule) and `gpuadvise explain RULE` (one rule's docs)."""

from __future__ import annotations

import argparse

from gpuadvise.analyzer.errors import EXIT_OK, InputError

from . import all_rules, find_rule

def rules_main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="gpuadvise rules", description="List every rule: code, name, title.").parse_args(argv)
    for r in all_rules():
        print(f"{r.code}  {r.name:<24} {r.title}")
    print("\n`gpuadvise explain CODE` shows what a rule detects, why it matters, the fix and its thresholds.")
    return EXIT_OK


def explain_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpuadvise explain", description="Show what a rule detects, why it matters, "
                                                                     "the fix and its thresholds.")
    p.add_argument("rule", metavar="RULE", help="rule code (GA102) or name (dataloader-stall)")
    key = p.parse_args(argv).rule
    rule = find_rule(key)
    if rule is None:
        known = ", ".join(r.name for r in all_rules())
        raise InputError(None, f"unknown rule {key!r}; known rules: {known}")
    print(f"{rule.code} {rule.name} (topic: {rule.topic})\n")
    print(rule.docs)
    return EXIT_OK

"""`gpuadvise rules` (the catalog: text, markdown or JSON) and `gpuadvise explain RULE` (one rule's docs)."""

from __future__ import annotations

import argparse
import json

from gpuadvise.analyzer.errors import EXIT_OK, InputError

from . import all_rules, catalog, find_rule


def build_rules_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuadvise rules", description="List every rule: code, name, title.")
    p.add_argument("--format", choices=("text", "markdown", "md", "json"), default="text",
                   help="text (one line a rule), markdown or md (the documentation's rule table) or json (everything a "
                        "script needs: code, name, topic, title, requires, thresholds, docs sections)")
    p.add_argument("--update", metavar="FILE",
                   help="with --format markdown: write the table into FILE between its rule-table markers")
    p.add_argument("--pages", metavar="DIR",
                   help="write the documentation: one page per rule from its docstring into DIR (docs/rules), "
                        "the table into DIR/index.md and the rules' entries into the site's mkdocs.yml nav")
    return p


def build_explain_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuadvise explain", description="Show what a rule detects, why it matters, "
                                                                     "the fix and its thresholds.")
    p.add_argument("rule", metavar="RULE", help="rule code (GA102) or name (dataloader-stall)")
    return p


def rules_main(argv: list[str]) -> int:
    args = build_rules_parser().parse_args(argv)
    if args.format == "md":  # the name `analyze --format` gives markdown
        args.format = "markdown"
    if args.pages:
        try:
            changed = catalog.write_pages(args.pages)
        except FileNotFoundError:
            raise InputError(args.pages, "no such folder") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(args.pages, str(exc)) from None
        print(f"{args.pages}: rule pages {'updated: ' + ', '.join(changed) if changed else 'already up to date'}")
        return EXIT_OK
    if args.update:
        if args.format != "markdown":
            raise InputError(None, "--update writes the markdown table: use it with --format markdown")
        try:
            changed = catalog.update_file(args.update)
        except FileNotFoundError:
            raise InputError(args.update, "no such file") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(args.update, str(exc).removeprefix(f"{args.update}: ")) from None
        print(f"{args.update}: rule table {'updated' if changed else 'already up to date'}")
        return EXIT_OK
    if args.format == "json":
        print(json.dumps(catalog.catalog(), indent=2, ensure_ascii=False))
    elif args.format == "markdown":
        print(catalog.markdown_table())
    else:
        for r in all_rules():
            print(f"{r.code}  {r.name:<24} {r.title}")
        print("\n`gpuadvise explain CODE` shows what a rule detects, why it matters, the fix and its thresholds.")
    return EXIT_OK


def explain_main(argv: list[str]) -> int:
    print(explain(build_explain_parser().parse_args(argv).rule))
    return EXIT_OK


def named_rule(key: str):
    """The rule a code (GA102) or name (dataloader-stall) names; an unknown one is the user's mistake."""
    rule = find_rule(key)
    if rule is None:
        known = ", ".join(r.name for r in all_rules())
        raise InputError(None, f"unknown rule {key!r}; known rules: {known}")
    return rule


def explain(key: str) -> str:
    """`gpuadvise explain RULE`'s text: the rule's code, name, topic and inputs, then its documentation."""
    rule = named_rule(key)
    kind = "job rule, on ≥2 ranks" if rule.job_level else f"reads: {', '.join(rule.requires)}"
    return f"{rule.code} {rule.name} (topic: {rule.topic}; {kind})\n\n{rule.docs}"

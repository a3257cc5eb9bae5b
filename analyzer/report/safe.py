"""Names from a trace are data. Before they reach a terminal or a markdown file they are defused."""

from __future__ import annotations

import re

# Whole sequences first (CSI, 8-bit CSI, OSC up to BEL/ST, two-byte ESC), then any lone control char.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>|#])")


def terminal(text: str) -> str:
    """Strip escape sequences and control characters so a crafted name cannot drive the terminal."""
    return _CONTROL.sub("", str(text))


def md(text: str) -> str:
    """Escape markdown/HTML specials in a name so it renders as the literal text."""
    return _MD_SPECIAL.sub(r"\\\1", terminal(text)).replace("\n", " ")


_MD_TEXT_SPECIAL = re.compile(r"([\\<>|\[\]*])")


def md_text(text: str) -> str:
    """Prose written by a rule: keep its `code` spans, but defuse HTML, links and table pipes that a
    trace-sourced name inside it could carry."""
    return _MD_TEXT_SPECIAL.sub(r"\\\1", terminal(text)).replace("\n", " ")


def md_code(text: str) -> str:
    """A name in inline code: backticks in it are balanced by a longer fence."""
    t = terminal(text).replace("\n", " ")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def md_cell(text: str) -> str:
    """A table cell: code-quoted, with pipes escaped (a pipe ends a cell even inside code)."""
    return md_code(text).replace("|", "\\|")


def short(text: str, width: int = 90) -> str:
    t = str(text)
    return t if len(t) <= width else t[: width - 1] + "…"

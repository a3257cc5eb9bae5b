"""What a tool call returns: structured data in the JSON report's own shapes and a short text, both kept
to a size an assistant reads whole. Lists come in pages (`offset`, `limit`, and where the next page
starts); a result that would still be too big keeps its parts in the order given (the findings first)
and names the parts it left out, with their size and how to get them. Nothing here computes a figure:
the numbers are the engine's, only cut into pages."""

from __future__ import annotations

import json

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.report.json import finite

# About 10k tokens of JSON: what assistants read from one tool call without truncating it (Claude Code warns
# above 10k tokens and cuts at 25k by default), with room for the text beside it.
MAX_JSON_CHARS = 40_000
MAX_TEXT_CHARS = 6_000


def size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def whole_number(name: str, value: int, least: int) -> int:
    """A count or offset an assistant passed, checked as the CLI checks its options: one line when wrong."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(None, f"{name}: expected a whole number ≥ {least}, got {value!r}")
    return value


def page(rows: list, offset: int, limit: int, budget: int = MAX_JSON_CHARS // 2) -> tuple[list, dict]:
    """Rows `offset`… (at most `limit`, and no more than `budget` characters of JSON, one row at least),
    and the page's place in the whole: `{"offset", "shown", "total", "next_offset"}` (None on the last)."""
    whole_number("offset", offset, 0)
    whole_number("limit", limit, 1)
    out, used = [], 0
    for row in rows[offset:offset + limit]:
        n = size(row)
        if out and used + n > budget:
            break
        out.append(row)
        used += n
    end = offset + len(out)
    return out, {"offset": offset, "shown": len(out), "total": len(rows), "next_offset": end if end < len(rows) else None}


def fit(parts: dict, left_out_hint: str, budget: int = MAX_JSON_CHARS) -> dict:
    """`parts` in their order, each kept while the whole stays within `budget` characters of JSON; the
    ones that do not fit are named under `left_out` (with their size and `left_out_hint`: where to get
    them whole). The first part is always kept."""
    out: dict = {}
    left: list[str] = []
    used = 0
    for name, value in parts.items():
        value = finite(value)
        n = size(value)
        if out and used + n > budget:
            left.append(f"{name} ({n:,} characters)")
            continue
        out[name] = value
        used += n
    if left:
        out["left_out"] = {"parts": left, "why": f"the result is kept under {budget:,} characters",
                           "whole": left_out_hint}
    return out


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """A text cut at a line end before `limit` characters, saying so."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    cut = cut if cut > 0 else limit
    return text[:cut] + f"\n… ({len(text) - cut:,} more characters: the structured result has the data)\n"


def table(rows: list[dict], columns: list[tuple[str, str]], width: int = 100) -> str:
    """Rows as an aligned plain-text table: `columns` are (key, heading); a text cell is cut at `width`."""
    def cell(v) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:,.0f}"
        text = str(v)
        return text if len(text) <= width else text[: width - 1] + "…"

    cells = [[cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def paging_line(paging: dict, noun: str) -> str:
    """"rows 1–50 of 120; the next page: offset=50"."""
    if not paging["total"]:
        return f"no {noun}"
    first, last = paging["offset"] + 1, paging["offset"] + paging["shown"]
    more = f"; the next page: offset={paging['next_offset']}" if paging["next_offset"] is not None else ""
    return f"{noun} {first}–{last} of {paging['total']}{more}"

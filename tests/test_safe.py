"""Names from a trace are attacker-controlled text: they must not drive the terminal or break markdown."""

from __future__ import annotations

import re

import pytest

from gpuadvise.analyzer.report import safe

EVIL = "evil|`<img src=x>`"


@pytest.mark.parametrize("raw, clean", [
    ("a\x1b[2Jb", "ab"),  # CSI: clear screen
    ("a\x1b[31;1mred\x1b[0mb", "aredb"),  # SGR colours
    ("a\x1b[?25lb", "ab"),  # private mode: hide cursor
    ("a\x1b]0;pwned title\x07b", "ab"),  # OSC: set window title, BEL-terminated
    ("a\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 hyperlink, ST-terminated
    ("a\x9b2Jb", "ab"),  # 8-bit CSI
])
def test_terminal_strips_escape_sequences(raw, clean):
    assert safe.terminal(raw) == clean


@pytest.mark.parametrize("ch", ["\x00", "\x07", "\x08", "\x0b", "\x0c", "\r", "\x1b", "\x7f", "\x85", "\x9d"])
def test_terminal_strips_control_characters(ch):
    out = safe.terminal(f"kernel{ch}name")
    assert out == "kernelname"


def test_terminal_keeps_ordinary_text():
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous)::add<float>>\tµs → ok\nnext"
    assert safe.terminal(name) == name
    assert safe.terminal(42) == "42"


def test_terminal_output_has_no_escape_at_all():
    hostile = "\x1b[2J\x1b]0;t\x07\x1bP+q\x1b\\\x1b[6n\x1bc" * 3
    out = safe.terminal("x" + hostile + "y")
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out)


def test_md_escapes_specials():
    out = safe.md(EVIL)
    assert out == r"evil\|\`\<img src=x\>\`"
    assert "<" not in out.replace(r"\<", "")
    assert safe.md("<script>alert(1)</script>") == r"\<script\>alert(1)\</script\>"
    assert safe.md("a\nb") == "a b"
    assert safe.md("*bold* _it_ [link](x) # h") == r"\*bold\* \_it\_ \[link\](x) \# h"


def test_md_strips_terminal_escapes_too():
    assert "\x1b" not in safe.md("a\x1b[2Jb")


def _cells(row: str) -> list[str]:
    """Split a GFM table row on unescaped pipes (a backslash-escaped pipe stays in its cell)."""
    inner = row.strip()
    assert inner.startswith("|") and inner.endswith("|")
    return re.split(r"(?<!\\)\|", inner[1:-1])


@pytest.mark.parametrize("name", [EVIL, "a|b|c", "``|``", "x\\|y", "<script>alert('|')</script>", "`", "|", "a\n| b |"])
def test_md_cell_keeps_the_table_shape(name):
    row = f"| {safe.md_cell(name)} | 12 |"
    assert len(_cells(row)) == 2, row
    assert "\n" not in row


@pytest.mark.parametrize("name", [EVIL, "sgemm`<b>`", "``double``", "<script>x</script>"])
def test_md_cell_is_a_code_span(name):
    cell = safe.md_cell(name)
    fence = re.match(r"`+", cell).group(0)
    assert cell.endswith(fence)
    inner = cell[len(fence):-len(fence)]
    # no run of backticks inside is as long as the fence, so the span cannot close early
    assert all(len(run) < len(fence) for run in re.findall(r"`+", inner))


def test_md_cell_renders_as_one_literal_cell():
    """Rendered by a real GFM table parser: one row, two cells, the name as literal code, no HTML."""
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark").enable("table")
    for name in (EVIL, "<script>alert(1)</script>", "a|b`c`|d"):
        table = f"| kernel | ms |\n|---|---|\n| {safe.md_cell(name)} | 12 |\n"
        html = md.render(table)
        assert html.count("<td>") == 2, html
        assert "<img" not in html and "<script" not in html
        code = re.search(r"<td><code>(.*?)</code></td>", html, flags=re.S).group(1)
        import html as htmllib

        assert htmllib.unescape(code).strip() == name


def test_md_code_balances_backticks():
    assert safe.md_code("plain") == "`plain`"
    assert safe.md_code("a`b") == "``a`b``"
    assert safe.md_code("`x`") == "`` `x` ``"


def test_short():
    assert safe.short("abc", 5) == "abc"
    out = safe.short("x" * 100, 10)
    assert len(out) == 10 and out.endswith("…")

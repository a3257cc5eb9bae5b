"""One self-contained HTML page from a markdown report: inline CSS, charts as inline SVG, nothing
fetched from anywhere (no scripts, fonts, images or style sheets), so the file can be shared by link
or attached to a CI run as it is.

The page is the markdown report itself, rendered by markdown-it-py (CommonMark with tables, raw HTML
off: anything HTML-like in a trace name stays text), so the page and the markdown show the same
numbers by construction. A chart is referenced in the markdown as `![alt](chart:NAME)` and replaced
here by its SVG.
"""

from __future__ import annotations

from html import escape

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; color: #24292f;
       max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.5; }
h1, h2, h3 { border-bottom: 1px solid #d8dee4; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .8em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: .25em .6em; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fbfcfd; }
code { background: #f6f8fa; padding: .1em .3em; border-radius: 4px; font-size: 90%; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; border-radius: 6px; }
pre code { background: none; padding: 0; }
svg { max-width: 100%; height: auto; display: block; margin: .6em 0; }
blockquote { border-left: 4px solid #d4a72c; margin: .8em 0; padding: .2em 1em; background: #fff8c5; }
"""

CHART_PREFIX = "chart:"


def page(title: str, markdown: str, charts: dict[str, str]) -> str:
    """The HTML page of `markdown`, with each `chart:NAME` image replaced by `charts[NAME]` (SVG)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")

    def image(self, tokens, idx, options, env):
        src = tokens[idx].attrGet("src") or ""
        name = src[len(CHART_PREFIX):] if src.startswith(CHART_PREFIX) else None
        if name in charts:
            return charts[name].strip()
        alt = self.renderInlineAsText(tokens[idx].children or [], options, env)
        return f"<em>[{escape(alt)}]</em>"  # not an embeddable chart: never fetch an image

    md.add_render_rule("image", image)
    body = md.render(markdown)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")

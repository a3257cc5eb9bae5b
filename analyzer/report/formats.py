"""The output formats, in one registry that `analyze` and `compare` share: a format's name, the file
extensions that pick it for `-o FILE`, and its renderers (of an analysis, of a comparison), imported
only when that format is written."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

from gpuadvise.analyzer.errors import InputError


@dataclass(frozen=True)
class Format:
    name: str
    extensions: tuple[str, ...]
    renderer: str  # module (in report/) whose `render(reports, **options)` draws an analysis
    compare: str  # function of report/compare.py that draws a comparison
    charts_beside: bool = False  # a file of it gets its SVG charts as files beside it (markdown)
    aliases: tuple[str, ...] = ()  # other names `--format` takes for it


REGISTRY: dict[str, Format] = {f.name: f for f in (
    Format("text", (".txt", ".log"), "text", "render_text"),
    Format("md", (".md", ".markdown"), "markdown", "render_markdown", charts_beside=True, aliases=("markdown",)),
    Format("json", (".json",), "json", "render_json"),
    Format("html", (".html", ".htm"), "html_report", "render_html"),
)}
NAMES = tuple(REGISTRY)
CHOICES = NAMES + tuple(a for f in REGISTRY.values() for a in f.aliases)  # what `--format` takes
DEFAULT = "text"


def named(fmt: str) -> Format:
    """The format `--format` names, by its name or an alias ("markdown" is "md")."""
    return REGISTRY.get(fmt) or next(f for f in REGISTRY.values() if fmt in f.aliases)


def choose(fmt: str | None, output: str | None) -> Format:
    """The format asked for, else the one `-o FILE`'s extension names (a file without one, or a device
    such as /dev/stdout, gets text); an extension no format has is refused rather than guessed."""
    if fmt is not None:
        return named(fmt)
    if output:
        suffix = Path(output).suffix.lower()
        if suffix:
            for f in REGISTRY.values():
                if suffix in f.extensions:
                    return f
            known = ", ".join(e for f in REGISTRY.values() for e in f.extensions)
            raise InputError(output, f"unknown report extension {suffix!r} (known: {known}; "
                                     f"or name the format with --format {'|'.join(NAMES)})")
    return REGISTRY[DEFAULT]


def render(reports, fmt: str, **options) -> str:
    """An analysis drawn in `fmt` (options: `top`, for text)."""
    f = named(fmt)
    module = import_module(f"{__package__}.{f.renderer}")
    if f.name != "text":
        options.pop("top", None)
    return module.render(reports, **options)


def files(reports, fmt: str, out: Path, **options) -> list[tuple[Path, str]]:
    """The files of an analysis written to `out`: a markdown report's charts first, the report last."""
    if named(fmt).charts_beside:
        from .charts import markdown_files

        return markdown_files(reports, out)
    return [(out, render(reports, fmt, **options))]


def render_compare(cmp: dict, fmt: str) -> str:
    from . import compare

    return getattr(compare, named(fmt).compare)(cmp)


def compare_files(cmp: dict, fmt: str, out: Path) -> list[tuple[Path, str]]:
    if named(fmt).charts_beside:
        from .compare import markdown_files

        return markdown_files(cmp, out)
    return [(out, render_compare(cmp, fmt))]

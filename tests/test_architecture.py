"""The layout keeps its promises: no import cycles among the project's modules, dependencies point one
way through the analysis layers, and every package folder is installed.

Imports are read from the source (ast), lazy ones inside functions included: a cycle hidden in a
function is still a cycle a reader has to untangle. Imports under `if TYPE_CHECKING:` are left out
(they never run). Importing `a.b.c` runs `a/b/__init__.py` first, so an import also depends on the
packages around its target, except those around the importer itself (already running by then).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import networkx as nx
import pytest

from _cli_support import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE_DIRS = PYPROJECT["tool"]["setuptools"]["package-dir"]  # import name → folder in the repo


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by import name (sub-packages follow their parent's folder)."""
    found: dict[str, Path] = {}
    for name, folder in PACKAGE_DIRS.items():
        root = REPO / folder
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if any(p in ("__pycache__",) for p in parts):
                continue
            mod = ".".join((name, *parts))
            if mod.endswith(".__init__"):
                mod = mod[: -len(".__init__")]
            # a folder mapped on its own (gpuadvise.analyzer → analyzer/) wins over gpuadvise/analyzer
            found.setdefault(mod, path)
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> set[str]:
    """Project modules that `module` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name in MODULES)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    if sub in MODULES:
                        out.add(sub)
                    elif target in MODULES:
                        out.add(target)
            visit(child)

    visit(tree)
    out |= {p for dep in out for p in _packages_around(dep)} - _packages_around(module) - {module}
    out.discard(module)
    return out


def _packages_around(module: str) -> set[str]:
    """The project packages whose __init__ runs before `module` (a.b.c → a.b, a)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES}


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for mod, path in MODULES.items():
        g.add_node(mod)
        for dep in _imports(mod, path):
            g.add_edge(mod, dep)
    return g


GRAPH = _graph()


def test_the_scan_sees_the_package():
    # guards the test itself: a broken scan would find no cycles in nothing
    assert "gpuadvise.analyzer.read.loader" in MODULES and "gpuadvise.rules.dataloader_stall" in MODULES
    assert "gpuadvise.analyzer.read.stream" in set(GRAPH.successors("gpuadvise.analyzer.read.loader"))
    assert GRAPH.number_of_edges() > 100


def test_an_import_depends_on_the_package_around_its_target():
    # guards the scan: the public API imports the harness's session, so it runs the harness's __init__
    assert "gpuadvise.harness" in set(GRAPH.successors("gpuadvise.api.capture"))
    assert "gpuadvise.api" not in set(GRAPH.successors("gpuadvise.api.capture"))  # its own package


def test_capture_is_a_plain_function():
    import inspect

    import gpuadvise
    import gpuadvise.harness.session.session  # noqa: F401 - importing the harness must not replace it

    assert inspect.isfunction(gpuadvise.capture)


def test_no_import_cycles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


# Layer → the layers it must never import. Renderers and rules read the analysis, never the files.
FORBIDDEN = {
    "gpuadvise.analyzer.model": ("read", "measure", "run", "report"),
    "gpuadvise.analyzer.read": ("measure", "run", "report"),
    "gpuadvise.analyzer.measure": ("read", "run", "report"),
    "gpuadvise.analyzer.report": ("read", "measure", "run"),
    "gpuadvise.rules": ("read", "run", "report"),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_dependencies_point_one_way(layer):
    bad = []
    for mod in MODULES:
        if mod != layer and not mod.startswith(layer + "."):
            continue
        for dep in GRAPH.successors(mod):
            for other in FORBIDDEN[layer]:
                target = f"gpuadvise.analyzer.{other}"
                if dep == target or dep.startswith(target + "."):
                    bad.append(f"{mod} → {dep}")
    assert not bad, "layer rule broken:\n" + "\n".join(bad)


def test_every_package_folder_is_installed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    packages = {mod for mod, path in MODULES.items() if path.name == "__init__.py"}
    assert packages - listed == set(), "add these to pyproject.toml's packages"


def test_each_subcommand_module_exists_and_has_main():
    import importlib

    from gpuadvise.cli import COMMANDS

    for name, (module, func, _) in COMMANDS.items():
        assert callable(getattr(importlib.import_module(module), func)), name


def test_renderers_never_import_the_rule_catalog():
    """A finding carries its advice and its rule's fix: the renderers need nothing from the rules."""
    bad = [f"{mod} → {dep}" for mod in MODULES if mod.startswith("gpuadvise.analyzer.report")
           for dep in GRAPH.successors(mod) if dep == "gpuadvise.rules" or dep.startswith("gpuadvise.rules.")]
    assert not bad, "renderers importing rules:\n" + "\n".join(bad)


# The consumers of an analysis get it from run/'s package API (`run.analyze`, `run.resolve_inputs`) and
# read the model's types; they never read traces, measure or run rules themselves. run.gate (the CI
# gate's argument parsing) and run.cli (the analyze subcommand) are not analysis.
CONSUMERS = ("gpuadvise.tui", "gpuadvise.mcp", "gpuadvise.analyzer.compare", "gpuadvise.harness", "gpuadvise.api")
PAST_RUN = ("gpuadvise.analyzer.read", "gpuadvise.analyzer.measure", "gpuadvise.analyzer.run")
RUN_ALLOWED = ("gpuadvise.analyzer.run", "gpuadvise.analyzer.run.gate")
# What the timeline draws with, not analysis: interval arithmetic (the call-name lists that lanes are
# coloured by live in model/calls.py, which any consumer may read).
DRAWING_HELPERS = {"gpuadvise.tui.timeline_index": ("gpuadvise.analyzer.measure.basics.intervals",
                                                    "gpuadvise.analyzer.measure.basics",
                                                    "gpuadvise.analyzer.measure")}  # its packages: no code


def _inside(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


@pytest.mark.parametrize("consumer", CONSUMERS)
def test_consumers_analyse_only_through_run(consumer):
    bad = [f"{mod} → {dep}" for mod in MODULES if _inside(mod, consumer) for dep in GRAPH.successors(mod)
           if any(_inside(dep, p) for p in PAST_RUN) and dep not in RUN_ALLOWED
           and dep not in DRAWING_HELPERS.get(mod, ())]
    assert not bad, "analysis reached past run/'s API:\n" + "\n".join(bad)


def test_the_consumer_rule_sees_imports():
    # guards the test above: the TUI's load goes through run/, so the scan must see that edge
    assert "gpuadvise.analyzer.run" in set(GRAPH.successors("gpuadvise.tui.ahead"))


# -- a stage by concern: the harness and measure/ are packages by concern, each sub-package's docstring
# saying what it owns and what it may import ------------------------------------------------------------------
HARNESS = "gpuadvise.harness"
MEASURE = "gpuadvise.analyzer.measure"


def _parts_of(stage: str) -> list[str]:
    """A stage's parts: its sub-packages and the modules that stand alone at its top."""
    return sorted(mod for mod in MODULES if mod.count(".") == stage.count(".") + 1 and _inside(mod, stage))


HARNESS_PARTS = _parts_of(HARNESS)
MEASURE_PARTS = _parts_of(MEASURE)


def _part(mod: str, parts: list[str]) -> str | None:
    """The part (sub-package or lone module) `mod` belongs to; None outside the parts."""
    return next((p for p in parts if _inside(mod, p)), None)


def _docstring(package: str) -> str:
    return ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""


def _may_import(package: str) -> list[str]:
    """The `May import:` paragraph of a package's docstring (names under gpuadvise, each maybe followed by
    a note in brackets), as full module names."""
    _, found, rest = _docstring(package).partition("May import:")
    assert found, f"{package}'s docstring says nothing of what it may import"
    names = re.sub(r"\([^)]*\)", "", rest.split("\n\n")[0]).replace("\n", " ").rstrip(". ")
    return [f"gpuadvise.{name.strip()}" for name in names.split(",")]


def _subpackages(parts: list[str]) -> list[str]:
    return [p for p in parts if MODULES[p].name == "__init__.py"]


SUBPACKAGES = _subpackages(HARNESS_PARTS)
MEASURE_PACKAGES = _subpackages(MEASURE_PARTS)


def _parts_graph(parts: list[str]) -> nx.DiGraph:
    """The imports between a stage's parts."""
    g = nx.DiGraph()
    for mod in MODULES:
        here = _part(mod, parts)
        if here is None:
            continue
        g.add_node(here)
        for dep in GRAPH.successors(mod):
            there = _part(dep, parts)
            if there is not None and there != here:
                g.add_edge(here, there)
    return g


def test_the_harness_is_grouped_by_concern():
    # guards the tests below: they read every sub-package's docstring
    assert {"gpuadvise.harness.windows", "gpuadvise.harness.frameworks", "gpuadvise.harness.steps"} <= set(SUBPACKAGES)
    assert "gpuadvise.harness.windows.slowwatch" in MODULES
    assert "gpuadvise.harness.windows" in set(GRAPH.successors("gpuadvise.harness.steps.sources"))


def test_the_measure_stage_is_grouped_by_concern():
    # guards the tests below: the scan sees the measure packages, their modules and the imports between them
    assert {f"{MEASURE}.{p}" for p in ("basics", "replay", "job", "longrun", "efficiency")} <= set(MEASURE_PACKAGES)
    assert {f"{MEASURE}.replay.whatif", f"{MEASURE}.job.job", f"{MEASURE}.basics.metrics"} <= set(MODULES)
    assert f"{MEASURE}.basics" in set(GRAPH.successors(f"{MEASURE}.job.job"))


@pytest.mark.parametrize("package", SUBPACKAGES + MEASURE_PACKAGES)
def test_a_package_imports_only_what_its_docstring_allows(package):
    allowed = _may_import(package)
    assert all(a in MODULES for a in allowed), f"{package}'s docstring names a module that does not exist: {allowed}"
    bad = [f"{mod} → {dep}" for mod in MODULES if _inside(mod, package) for dep in GRAPH.successors(mod)
           if not _inside(dep, package) and not _inside(package, dep)  # its own packages around it
           and not any(_inside(dep, a) or _inside(a, dep) for a in allowed)]  # or a package around it
    assert not bad, f"imports {package}'s docstring does not allow:\n" + "\n".join(bad)


def test_no_part_of_the_harness_imports_the_rules_or_the_tui():
    bad = [f"{mod} → {dep}" for mod in MODULES if _inside(mod, HARNESS) for dep in GRAPH.successors(mod)
           if _inside(dep, "gpuadvise.rules") or _inside(dep, "gpuadvise.tui")]
    assert not bad, "the harness reaching the rules or the TUI:\n" + "\n".join(bad)


def test_the_harness_parts_are_layered():
    """Between its parts, the harness's imports point one way: the session ties the parts together,
    no part below it reaches back up (a cycle between two packages, even with no cycle between modules)."""
    parts = _parts_graph(HARNESS_PARTS)
    assert parts.has_edge("gpuadvise.harness.session", "gpuadvise.harness.steps")  # guards the scan
    cycles = [sorted(c) for c in nx.strongly_connected_components(parts) if len(c) > 1]
    assert not cycles, f"harness packages importing each other: {cycles}"


def test_the_measure_parts_are_layered():
    """Between measure's parts, imports point one way: `Analysis` (analysis.py) ties the concerns together,
    the basics are under them all, and no concern reaches back up into the one that imports it."""
    parts = _parts_graph(MEASURE_PARTS)
    assert parts.has_edge(f"{MEASURE}.analysis", f"{MEASURE}.replay")  # guards the scan
    cycles = [sorted(c) for c in nx.strongly_connected_components(parts) if len(c) > 1]
    assert not cycles, f"measure packages importing each other: {cycles}"
    assert not [p for p in parts.successors(f"{MEASURE}.basics")], "the basics import another concern"


# The modules at the top of measure/: what a rule reads, and the memory summary. Anything else belongs to a concern.
MEASURE_LONE = {f"{MEASURE}.analysis", f"{MEASURE}.memory"}


def test_every_measure_module_belongs_to_a_concern():
    """measure/ stays by concern: a new module goes into the package of its concern (or a new package with
    its docstring), not beside them."""
    lone = {p for p in MEASURE_PARTS if MODULES[p].name != "__init__.py"}
    assert lone == MEASURE_LONE, f"modules at the top of measure/: {sorted(lone - MEASURE_LONE)}"


@pytest.mark.parametrize("package", [MEASURE, *MEASURE_PACKAGES])
def test_a_measure_package_says_what_it_owns(package):
    """Each measure package's __init__ is its docstring alone (importing one module runs nothing else) and
    names every module the package holds."""
    tree = ast.parse(MODULES[package].read_text())
    assert len(tree.body) == 1 and ast.get_docstring(tree), f"{package}/__init__.py holds more than its docstring"
    doc = _docstring(package)
    held = [mod.rsplit(".", 1)[1] for mod in MODULES if mod.count(".") == package.count(".") + 1
            and _inside(mod, package)]
    unnamed = [name for name in held if not re.search(rf"\b{re.escape(name)}(\.py|/)", doc)]
    assert not unnamed, f"{package}'s docstring does not say it holds: {unnamed}"

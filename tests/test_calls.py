"""The call-name lists (launch, copy, sync, DataLoader, …) live in analyzer/model/calls.py only, and
every user imports them from there: a call added there counts the same in metrics, the what-if
replay, the rules and the TUI."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuadvise.analyzer.model import calls

ROOT = Path(__file__).resolve().parents[1]
NAMES = {n for n in vars(calls) if n.isupper()}
HOME = ROOT / "analyzer" / "model" / "calls.py"


def _modules():
    for folder in ("analyzer", "rules", "gpuadvise", "fixtures"):
        yield from (p for p in (ROOT / folder).rglob("*.py") if p != HOME)


def test_lists_are_defined_once_and_imported_from_calls():
    defined, imported_elsewhere = [], []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(ROOT).as_posix()
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            defined += [f"{rel}: {t.id}" for t in targets if isinstance(t, ast.Name) and t.id in NAMES]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "gpuadvise.analyzer.model.calls":
                imported_elsewhere += [f"{rel}: {a.name} from {node.module}" for a in node.names if a.name in NAMES]
    assert NAMES >= {"LAUNCH_CALLS", "COPY_CALLS", "SYNC_CALLS", "DEVICE_SYNCS", "DATALOADER", "SCALAR_OPS"}
    assert defined == [], "call-name lists belong in analyzer/model/calls.py"
    assert imported_elsewhere == [], "import call-name lists from gpuadvise.analyzer.model.calls"


def test_blocking_calls_are_known_calls():
    """Every sync call is a runtime call the metrics see; device-wide and graph launches are subsets."""
    assert calls.DEVICE_SYNCS <= set(calls.SYNC_CALLS)
    assert calls.GRAPH_LAUNCHES <= calls.LAUNCH_CALLS
    blocking_copies = {n for n, kind in calls.SYNC_CALLS.items() if kind.startswith("blocking")}
    assert blocking_copies <= calls.COPY_CALLS
    assert calls.DATALOADER.match("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__")
    assert calls.STEP.match("ProfilerStep#12").group(1) == "12"
    assert calls.COPY_NAME.match("Memcpy HtoD (Pageable -> Device)").groups() == ("HtoD", "Pageable", "Device")

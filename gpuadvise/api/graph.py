"""`gpuadvise.dependency_graph(path)`: one trace's replay graph (the graph every predicted saving is
replayed on) as a networkx DiGraph, through analyzer.run's entry point (analyzer/measure/replay/replay_export.py
says what its nodes and edges hold)."""

from __future__ import annotations

import os

from gpuadvise.analyzer.errors import InputError


def dependency_graph(path):
    from gpuadvise.analyzer import run

    shown = os.fspath(path)
    traces = [s for s in run.resolve_inputs([shown]) if s.kind == "trace"]
    if not traces:
        raise InputError(shown, "holds no trace: a dependency graph is read from a trace")
    if len(traces) > 1:
        raise InputError(shown, f"holds {len(traces)} traces (ranks or windows): name the one to graph, "
                                f"e.g. {traces[0].path}")
    graph = run.dependency_graph(traces[0])
    if graph is None:
        raise InputError(traces[0].path, "has no steps and no GPU work launched by its calls: nothing to replay")
    return graph

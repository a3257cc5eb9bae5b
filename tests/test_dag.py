"""The replay's graph (analyzer/measure/dag.py): its topological order and the longest path the replay
takes through it, against networkx on random DAGs."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from gpuadvise.analyzer.measure.dag import Cyclic, Graph
from gpuadvise.analyzer.measure.whatif import _longest_path


def _random_dag(seed: int, nodes: int = 300, edges: int = 1500):
    """Edges that point forward in a hidden order (so the graph is a DAG), weights with ties, zeros and
    -inf (an edge a scenario switched off), in a shuffled order."""
    rng = np.random.default_rng(seed)
    rank = rng.permutation(nodes)
    a, b = rng.integers(0, nodes, (2, edges))
    keep = rank[a] != rank[b]
    a, b = a[keep], b[keep]
    src, dst = np.where(rank[a] < rank[b], a, b), np.where(rank[a] < rank[b], b, a)
    w = rng.choice([0.0, 1.5, 2.25, 1e6, 0.1, -np.inf], size=len(src)) + rng.integers(0, 3, len(src))
    return src, dst, w


def _by_order(g: Graph, order: np.ndarray):
    e = g.edges()
    pos = np.empty(g.nodes, dtype=np.int64)
    pos[order] = np.arange(len(order))
    by = np.argsort(pos[e["src"]], kind="stable")
    return list(zip(e["src"][by].tolist(), e["dst"][by].tolist())), by


@pytest.mark.parametrize("seed", range(5))
def test_longest_path_matches_networkx_in_any_topological_order(seed):
    src, dst, w = _random_dag(seed)
    g = Graph(300)
    g.add("cpu", src, dst, w)
    order = g.topological_order()
    position = {n: i for i, n in enumerate(order.tolist())}
    assert sorted(position) == list(range(300))
    assert all(position[u] < position[v] for u, v in zip(src.tolist(), dst.tolist()))

    ref = nx.DiGraph()
    ref.add_nodes_from(range(300))
    best = {}
    for u, v, wt in zip(src.tolist(), dst.tolist(), w.tolist()):  # parallel edges: the heaviest counts
        best[(u, v)] = max(best.get((u, v), -np.inf), wt)
    ref.add_weighted_edges_from((u, v, wt) for (u, v), wt in best.items())
    start = int(order[0])
    dist = {n: -np.inf for n in ref}
    dist[start] = 0.0
    for u in nx.topological_sort(ref):
        for v, d in ref[u].items():
            dist[v] = max(dist[v], dist[u] + d["weight"])
    for end in (int(order[-1]), int(order[len(order) // 2])):
        want = max(dist[end], 0.0)
        for each in (order, np.array(list(nx.topological_sort(ref)))):  # ours and networkx's order alike
            path, by = _by_order(g, each)
            assert _longest_path(300, start, end, path, g.edges()["base"][by]) == want


def test_a_cycle_has_no_topological_order():
    g = Graph(3)
    g.add("cpu", [0, 1, 2], [1, 2, 0], 1.0)
    with pytest.raises(Cyclic):
        g.topological_order()
    g.drop(("cpu",))
    assert sorted(g.topological_order().tolist()) == [0, 1, 2]


def test_dropping_a_kind_keeps_the_others_and_synced_falls_back_to_base():
    g = Graph(4)
    g.add("call", [0, 1], [1, 2], [3.0, 4.0], synced=[1.0, 2.0], has_synced=[True, False])
    g.add("wait", 2, 3, 5.0)
    g.drop(("wait",))
    e = g.edges()
    assert e["src"].tolist() == [0, 1] and e["base"].tolist() == [3.0, 4.0]
    assert e["has_synced"].tolist() == [True, False]
    g.forget_synced()
    assert not g.edges()["has_synced"].any()

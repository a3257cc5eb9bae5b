"""The replay's graph (analyzer/measure/replay/dag.py): its topological order and the longest path the replay
takes through it, against networkx on random DAGs."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from gpuadvise.analyzer.measure.replay import dag, whatif
from gpuadvise.analyzer.measure.replay.dag import Cyclic, Graph
from gpuadvise.analyzer.measure.replay.whatif import _longest_path

COMPILED = dag._compiled_topological_order is not None and whatif._compiled_longest_path is not None
needs_compiled = pytest.mark.skipif(not COMPILED, reason="the compiled replay loops were not built (no C compiler at install)")


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


@pytest.mark.parametrize("compiled", [True, False])
def test_a_cycle_has_no_topological_order(compiled, monkeypatch):
    if compiled and not COMPILED:
        pytest.skip("the compiled replay loops were not built")
    if not compiled:
        monkeypatch.setattr(dag, "_compiled_topological_order", None)
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


@needs_compiled
@pytest.mark.parametrize("seed", range(4))
def test_compiled_loops_give_the_python_loops_order_and_time_to_the_bit(seed, monkeypatch):
    """Where the C loops were built, they give the Python loops' topological order node for node and the
    same longest path to the bit, removed edges (-inf) and a node no edge reaches included."""
    src, dst, w = _random_dag(seed, nodes=2_000, edges=12_000)
    g = Graph(2_000)
    g.add("cpu", src, dst, w)
    compiled = g.topological_order()
    monkeypatch.setattr(dag, "_compiled_topological_order", None)
    assert compiled.tolist() == g.topological_order().tolist()
    path, by = _by_order(g, compiled)
    e = {"n": 2_000, "start": int(compiled[0]), "src": g.edges()["src"][by], "dst": g.edges()["dst"][by]}
    weights = g.edges()["base"][by]
    unreached = int(np.setdiff1d(np.arange(2_000), dst)[-1])
    for end in (int(compiled[-1]), int(compiled[1_000]), unreached):
        want = _longest_path(2_000, e["start"], end, path, weights)
        assert whatif.longest_path(dict(e, end=end), weights) == want


@needs_compiled
def test_compiled_loops_refuse_an_edge_outside_the_graph():
    src, dst = np.array([0, 1], np.int64), np.array([1, 5], np.int64)
    with pytest.raises(ValueError, match="outside the graph"):
        whatif._compiled_longest_path(3, 0, 2, src, dst, np.ones(2))
    with pytest.raises(ValueError, match="outside the graph"):
        dag._compiled_topological_order(3, src, dst)

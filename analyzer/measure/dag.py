"""The replay's graph (replay_graph.py builds it, whatif.py replays it): a directed graph of plain dicts.

It keeps the part of `networkx.DiGraph` the replay uses, with the same orders: nodes in the order they
were first added, each node's successors and predecessors in the order their edges were first added, an
edge added again keeps its place and has its attributes updated, and `topological_order` is the order
`networkx.topological_sort` gives (Kahn's algorithm generation by generation, as networkx's
`topological_generations`). The replay's edge arrays, and so every prediction, are then the same as
with networkx, at a fraction of its cost per edge (a replay graph has tens of thousands of edges).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator


class Cyclic(ValueError):
    """The graph has a cycle: it has no topological order."""


class DiGraph:
    __slots__ = ("_succ", "_pred")

    def __init__(self) -> None:
        self._succ: dict[Hashable, dict[Hashable, dict]] = {}  # node → successor → the edge's attributes
        self._pred: dict[Hashable, dict[Hashable, dict]] = {}  # node → predecessor → the same dict

    def add_node(self, n: Hashable) -> None:
        if n not in self._succ:
            self._succ[n] = {}
            self._pred[n] = {}

    def add_edge(self, u: Hashable, v: Hashable, **attr) -> None:
        succ, pred = self._succ, self._pred
        if u not in succ:
            succ[u] = {}
            pred[u] = {}
        if v not in succ:
            succ[v] = {}
            pred[v] = {}
        data = succ[u].get(v)
        if data is None:
            succ[u][v] = pred[v][u] = attr
        else:
            data.update(attr)

    def has_edge(self, u: Hashable, v: Hashable) -> bool:
        return v in self._succ.get(u, ())

    def edge(self, u: Hashable, v: Hashable) -> dict:
        """The attributes of edge u → v (a KeyError when there is none); changing them changes the edge."""
        return self._succ[u][v]

    def edges(self) -> Iterator[tuple[Hashable, Hashable, dict]]:
        """(u, v, attributes) of every edge: by u in node order, then in the order u's edges were added."""
        for u, nbrs in self._succ.items():
            for v, d in nbrs.items():
                yield u, v, d

    def in_edges(self, v: Hashable) -> Iterator[tuple[Hashable, Hashable, dict]]:
        for u, d in self._pred[v].items():
            yield u, v, d

    def predecessors(self, v: Hashable) -> Iterator[Hashable]:
        return iter(self._pred[v])

    def remove_edges_from(self, edges: Iterable[tuple[Hashable, Hashable]]) -> None:
        for u, v in edges:
            if v in self._succ.get(u, ()):
                del self._succ[u][v]
                del self._pred[v][u]

    def __len__(self) -> int:
        return len(self._succ)

    def __contains__(self, n: Hashable) -> bool:
        return n in self._succ

    def topological_order(self) -> list:
        """Every node, each after all its predecessors, in networkx's order (module docstring); `Cyclic`
        when there is none."""
        succ = self._succ
        indegree = {v: len(p) for v, p in self._pred.items() if p}
        generation = [v for v, p in self._pred.items() if not p]
        order: list = []
        while generation:
            order.extend(generation)
            following = []
            for node in generation:
                for child in succ[node]:
                    left = indegree[child] - 1
                    if left:
                        indegree[child] = left
                    else:
                        following.append(child)
                        del indegree[child]
            generation = following
        if indegree:
            raise Cyclic("the graph has a cycle")
        return order

    def is_acyclic(self) -> bool:
        try:
            self.topological_order()
        except Cyclic:
            return False
        return True

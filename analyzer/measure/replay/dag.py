"""The replay's graph (replay_graph.py builds it, whatif.py replays it) as columns of edges.

Nodes are the numbers 0 … n−1 (replay_graph.py says which is which); each edge has a `kind` and the
attributes the replay reads: `base` (its weight in the trace, µs), `call` / `op` (the row of `Replay.calls`
/ `Replay.ops` it belongs to, -1: none), `gap` (a CPU edge's time range on the trace clock), `synced` (a
call's own cost with allocator syncs on; its `base` where not given) and `unseen` (µs of a wait for what
the trace does not show). Edges are added a block at a time as numpy arrays, so building a graph of tens
of thousands of edges costs a few numpy calls per block, not a Python call per edge.

The longest path is the same whatever topological order its edges are relaxed in: a node's time is the
largest of its incoming candidates, and each candidate is the same sum whichever order they come in.
"""

from __future__ import annotations

import numpy as np

try:  # the compiled topological order (replay_loops.c); the Python loop below where it was not built
    from ._replay_loops import topological_order as _compiled_topological_order
except ImportError:  # pragma: no cover - depends on the install having had a C compiler
    _compiled_topological_order = None

KINDS = ("cpu", "call", "launch", "anchor", "gpu", "stream", "drain", "wait", "dep", "alloc_wait", "unseen_dep")
_CODE = {k: i for i, k in enumerate(KINDS)}
_COLUMNS = ("src", "dst", "kind", "base", "call", "op", "gap_a", "gap_b", "synced", "has_synced", "unseen")
_DTYPES = (np.int64, np.int64, np.int8, np.float64, np.int64, np.int64, np.float64, np.float64, np.float64, bool,
           np.float64)


class Cyclic(ValueError):
    """The graph has a cycle: it has no topological order."""


class Graph:
    """Nodes 0 … nodes−1 and the edges added so far (`add`), read as columns (`edges`)."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self._blocks: list[tuple] = []
        self._frozen: dict | None = None

    def add(self, kind: str, src, dst, base, call=-1, op=-1, gap_a=0.0, gap_b=0.0, synced=0.0, has_synced=False,
            unseen=0.0) -> None:
        """Edges src[j] → dst[j] of one kind; scalars apply to every edge of the block (`synced` counts
        only where `has_synced`)."""
        n = np.broadcast(np.asarray(src), np.asarray(dst)).size
        if not n:
            return
        values = (src, dst, _CODE[kind], base, call, op, gap_a, gap_b, synced, has_synced, unseen)
        self._blocks.append(tuple(np.broadcast_to(np.asarray(v, dtype=t), (n,)) for v, t in zip(values, _DTYPES)))
        self._frozen = None

    def edges(self) -> dict:
        """Every edge as columns (`kind` as a code: KINDS[code] is its name)."""
        if self._frozen is None:
            if self._blocks:
                cols = [np.concatenate(c) for c in zip(*self._blocks)]
            else:
                cols = [np.empty(0, dtype=t) for t in _DTYPES]
            self._frozen = dict(zip(_COLUMNS, cols))
            self._blocks = [tuple(self._frozen[c] for c in _COLUMNS)]
        return self._frozen

    def drop(self, kinds: tuple[str, ...]) -> None:
        """Remove every edge of these kinds."""
        e = self.edges()
        keep = ~np.isin(e["kind"], [_CODE[k] for k in kinds])
        self._blocks = [tuple(e[c][keep] for c in _COLUMNS)]
        self._frozen = None

    def forget_synced(self) -> None:
        """Every edge's `synced` becomes its `base`."""
        e = self.edges()
        e["has_synced"] = np.zeros(len(e["src"]), dtype=bool)
        self._blocks = [tuple(e[c] for c in _COLUMNS)]

    def topological_order(self) -> np.ndarray:
        """Every node, each after all its predecessors (Kahn's algorithm); `Cyclic` when there is none."""
        e = self.edges()
        src, dst = e["src"], e["dst"]
        if _compiled_topological_order is not None:
            order = _compiled_topological_order(self.nodes, np.ascontiguousarray(src, np.int64),
                                                np.ascontiguousarray(dst, np.int64))
            if order is None:
                raise Cyclic("the graph has a cycle")
            return np.frombuffer(order, dtype=np.int64).copy()
        by_src = np.argsort(src, kind="stable")
        targets = dst[by_src].tolist()
        first = np.searchsorted(src[by_src], np.arange(self.nodes + 1)).tolist()
        waiting = np.bincount(dst, minlength=self.nodes).tolist()
        ready = [v for v, d in enumerate(waiting) if not d]
        order = []
        while ready:
            u = ready.pop()
            order.append(u)
            for v in targets[first[u]:first[u + 1]]:
                left = waiting[v] - 1
                waiting[v] = left
                if not left:
                    ready.append(v)
        if len(order) < self.nodes:
            raise Cyclic("the graph has a cycle")
        return np.array(order, dtype=np.int64)

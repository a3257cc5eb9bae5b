"""The replay graph (replay_graph.py) as a networkx DiGraph, for those who want to walk it themselves: the
graph every predicted saving is replayed on, with the weights of today's run.

Nodes are moments of the chosen steps, each with `what` ("window start", "window end", "call start",
"call end", "GPU op start", "GPU op end", "drain end"), and for calls and GPU ops their `name`, their
`ts` (µs on the trace's clock) and `tid` (calls) or `stream` (GPU ops). Edges carry `kind` (replay_graph's
kinds: "cpu" the CPU time between calls, "call" a call's own cost, "launch", "gpu" an op running,
"stream" an op behind the one before it on its stream, "wait" a sync waiting for GPU work, …) and `us`,
the edge's weight in the baseline replay (µs). Where two kinds join the same two moments, the longer
one is kept (it is the one a longest path takes).

The longest path from the window's start to its end is the replay's baseline (`baseline_us`, a graph
attribute, with `window_us`, `steps` and `actual_us`), so `networkx.dag_longest_path(g, weight="us")`
is the chain of CPU work, launches, GPU ops and waits that sets the step time: the critical path.
"""

from __future__ import annotations

import numpy as np

from .whatif import Replay, Scenario, _weights

WHAT = ("window start", "window end", "call start", "call end", "GPU op start", "GPU op end", "drain end")


def to_networkx(replay: Replay):
    """The replay's graph as a `networkx.DiGraph` (see the module's docstring for its attributes)."""
    import networkx as nx

    e = replay._edges
    w = _weights(replay, Scenario("baseline"))
    g = nx.DiGraph(window_us=(float(replay.window[0]), float(replay.window[1])), steps=int(replay.steps),
                   baseline_us=float(replay.baseline_us), actual_us=float(replay.actual_us))
    g.add_nodes_from(_nodes(replay))
    keep = np.flatnonzero(np.isfinite(w))
    keep = keep[np.argsort(w[keep], kind="stable")]  # the longest of parallel edges is added last and stays
    src, dst, kind, us = (e["src"][keep].tolist(), e["dst"][keep].tolist(), e["kind"][keep].tolist(),
                          w[keep].tolist())
    g.add_edges_from((u, v, {"kind": k, "us": x}) for u, v, k, x in zip(src, dst, kind, us))
    return g


def _nodes(replay: Replay):
    """(node, attributes) in replay_graph's numbering: S, E, the calls' starts and ends, the GPU ops'
    starts and ends, the allocator calls' drain ends."""
    calls, ops = replay.calls, replay.ops
    nc, no = len(calls), len(ops)
    yield 0, {"what": WHAT[0], "ts": float(replay.window[0])}
    yield 1, {"what": WHAT[1], "ts": float(replay.window[1])}
    c_name, c_ts, c_end = calls["name"].astype(str).tolist(), calls["ts"].tolist(), calls["end"].tolist()
    c_tid = calls["tid"].tolist() if "tid" in calls else [None] * nc
    o_name, o_ts, o_end = ops["name"].astype(str).tolist(), ops["ts"].tolist(), ops["end"].tolist()
    o_stream = ops["stream"].tolist()
    for what, first, names, times, where, key in (
            (WHAT[2], 2, c_name, c_ts, c_tid, "tid"), (WHAT[3], 2 + nc, c_name, c_end, c_tid, "tid"),
            (WHAT[4], 2 + 2 * nc, o_name, o_ts, o_stream, "stream"),
            (WHAT[5], 2 + 2 * nc + no, o_name, o_end, o_stream, "stream"),
            (WHAT[6], 2 + 2 * nc + 2 * no, c_name, c_end, c_tid, "tid")):
        for j, (name, ts, at) in enumerate(zip(names, times, where)):
            yield first + j, {"what": what, "name": name, "ts": float(ts), key: _plain(at)}


def _plain(v):
    """A numpy scalar as the Python number it is (networkx writers and people read these)."""
    return v.item() if hasattr(v, "item") else v

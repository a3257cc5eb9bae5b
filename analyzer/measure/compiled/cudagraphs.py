"""Kernels a CUDA graph launched, attributed to the ops captured into the graph.

A replayed graph is one runtime call (`cudaGraphLaunch`) whose kernels all carry its correlation id: by
the launch alone every one of them belongs to whatever op replayed the graph (`CUDAGraph::replay`), with
no op, shape or source line of its own. CUPTI marks each kernel, copy and memset a graph ran with the
graph's id and its node's (`graph id`, `graph node id`; newer torch writes them into the trace), and a
node is made when a launch is captured: when the trace holds the capture (the launches a thread made
between `cudaStreamBeginCapture` and `cudaStreamEndCapture`, which ran nothing then), the k-th node of a
graph, by node id (ids count up as nodes are made), is its k-th captured launch, and the op around that
launch is the op the kernel belongs to: its name, its shapes, its source line, its phase.

A graph is matched to the capture that made as many nodes as the graph ran, the earliest not taken, in
the order the graphs were first replayed. A graph captured before the trace began (the usual case for a
model captured once in warm-up) keeps its replay's op; `captured` says how many kernels that leaves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuadvise.analyzer.model.calls import COPY_CALLS, GRAPH_LAUNCHES, LAUNCH_CALLS
from gpuadvise.analyzer.model.trace import TraceModel, name_mask, names_in

BEGIN = re.compile(r"^(cuda|hip|cu)StreamBeginCapture")
END = re.compile(r"^(cuda|hip|cu)StreamEndCapture")
NODE_CALLS = (LAUNCH_CALLS - GRAPH_LAUNCHES) | COPY_CALLS  # the calls that make a node when captured


@dataclass
class Captured:
    """The GPU ops graphs ran, mapped to the launches captured into the graphs."""

    calls: pd.DataFrame  # per mapped GPU op (index: its row in model.gpu): the captured call's name, ts, end,
    #                      tid, correlation, external_id
    graph_ops: int  # GPU ops that graphs ran (with a `graph node id`)
    unmapped: int  # of those, ops no capture in the trace accounts for

    def note(self) -> str | None:
        """What the report says about them ("" when no graph ran)."""
        if not self.graph_ops:
            return None
        if not self.unmapped:
            return (f"{self.graph_ops} GPU ops ran from CUDA graphs: each is attributed to the op captured into its "
                    "graph (its name, shapes and source line)")
        if self.unmapped == self.graph_ops:
            return (f"{self.graph_ops} GPU ops ran from CUDA graphs captured before the trace began: they are "
                    "attributed to the op that replayed the graph, not to the ops captured into it")
        return (f"{self.graph_ops} GPU ops ran from CUDA graphs; {self.graph_ops - self.unmapped} are attributed to "
                f"the op captured into their graph, {self.unmapped} (graphs captured before the trace began) to the "
                "op that replayed it")


def captured(model: TraceModel) -> Captured:
    """The captured launch of every GPU op a graph ran, where the trace holds the capture."""
    gpu = model.gpu
    empty = pd.DataFrame(columns=["name", "ts", "end", "tid", "correlation", "external_id"])
    if "graph_node" not in gpu or gpu.empty:
        return Captured(empty, 0, 0)
    graph = gpu[gpu["graph_node"].to_numpy() >= 0]
    if graph.empty:
        return Captured(empty, 0, 0)
    captures = _captures(model)
    # each graph: its nodes, by id; graphs in the order they were first replayed
    graphs: list[np.ndarray] = []
    seen: set = set()
    for corr, part in graph.sort_values("ts", kind="stable").groupby("correlation", sort=False):
        nodes = np.unique(part["graph_node"].to_numpy())
        key = tuple(nodes.tolist())
        if key not in seen:
            seen.add(key)
            graphs.append(nodes)
    node_call: dict = {}
    free = list(range(len(captures)))
    for nodes in graphs:
        k = next((i for i in free if len(captures[i]) == len(nodes)), None)
        if k is None:
            continue
        free.remove(k)
        calls = captures[k]
        for node, j in zip(nodes.tolist(), range(len(calls))):
            node_call[node] = calls.iloc[j]
    picked = graph[graph["graph_node"].isin(list(node_call))]
    rows = [node_call[n] for n in picked["graph_node"].tolist()]
    calls = pd.DataFrame(rows, index=picked.index)[["name", "ts", "end", "tid", "correlation", "external_id"]] \
        if rows else empty
    return Captured(calls, len(graph), len(graph) - len(picked))


def _captures(model: TraceModel) -> list[pd.DataFrame]:
    """Per capture in the trace (a thread's launches between BeginCapture and EndCapture, which ran nothing
    then), its node-making calls in the order made."""
    rt = model.runtime
    if rt.empty:
        return []
    begins = rt[name_mask(rt["name"], BEGIN.match)]
    ends = rt[name_mask(rt["name"], END.match)]
    if begins.empty or ends.empty:
        return []
    ran = set(model.gpu["correlation"].tolist())
    calls = rt[names_in(rt["name"], NODE_CALLS) & ~rt["correlation"].isin(ran).to_numpy()]
    out = []
    for _, b in begins.sort_values("ts").iterrows():
        after = ends[(ends["tid"] == b["tid"]) & (ends["ts"] >= b["ts"])]
        if after.empty:
            continue
        stop = float(after["ts"].min())
        inside = calls[(calls["tid"] == b["tid"]) & (calls["ts"] > b["ts"]) & (calls["ts"] < stop)]
        if len(inside):
            out.append(inside.sort_values("ts", kind="stable").assign(name=lambda d: d["name"].astype(str)))
    return out

"""The what-if replay that predicts every saving: `replay_graph.py` (which calls and GPU ops of a trace
become nodes, which waits become edges), `dag.py` (that graph as columns of edges, and its topological
order), `whatif.py` (a fix as a `Scenario`, replayed along the critical path), `replay_loops.c` (the
graph's two hot loops compiled, as `_replay_loops`; the Python loops in dag.py and whatif.py run where it
was not built), `calibration.py` (the replay corrected for what the profiler itself cost),
`feeding.py` (the work that exists only to produce a synced value, removed with the sync) and
`replay_export.py` (the graph as a networkx DiGraph).

May import: analyzer.model, analyzer.measure.basics.
"""

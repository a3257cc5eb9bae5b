"""The one way in for analysis. The analyze CLI, the TUI (`view`), `compare`, `profile`'s summary and
scripts call only this API; none of them reads traces or runs rules on its own.

    sources = resolve_inputs(paths)              # checks every path; bad input raises InputError
    reports = analyze(sources, cache=False, ...)  # Reports: one TraceReport per source, .job, .facts

`tables` gives one analysed trace's steps, kernels, idle causes and what it found at a line of the user's
code as plain data (what `view` shows; the MCP server's tools read them).

`analyze` takes paths or the resolved sources (a caller that checked them first reads them once), and
progress callbacks: `progress(i, n, source)` before each source, `bytes_progress(done, total)` during a
decode, `rank_progress(done, n, nbytes)` as parallel ranks finish. `jobs=1` keeps every rank in this
process with its events (what the TUI's timeline needs); more workers send back compact reports.

The names are imported lazily, so that `import gpuadvise.analyzer.run.gate` (argument checks) stays
cheap.
"""

from __future__ import annotations

__all__ = ["analyze", "beside_threads", "dependency_graph", "resolve_inputs", "refuse_overwriting_inputs", "write_perfetto", "Reports", "TraceReport",
           "all_findings", "tables"]


def __getattr__(name):
    if name == "analyze":
        from .engine import analyze_paths

        return analyze_paths
    if name == "beside_threads":  # a reader thread beside threads that hold nothing it needs may still fork
        from gpuadvise.analyzer.read.forked import beside_threads

        return beside_threads
    if name == "dependency_graph":  # one trace's replay graph as a networkx DiGraph (the Python API)
        from .single import dependency_graph

        return dependency_graph
    if name == "resolve_inputs":
        from gpuadvise.analyzer.read.sources import resolve

        return resolve
    if name == "refuse_overwriting_inputs":  # an output path that is one of the inputs (before anything runs)
        from gpuadvise.analyzer.read.sources import refuse_overwriting_inputs

        return refuse_overwriting_inputs
    if name == "write_perfetto":  # the analysed trace plus a track of the findings (`--perfetto`)
        from .perfetto import write_perfetto

        return write_perfetto
    if name == "tables":  # steps, kernels, idle causes, a source line: the view's tables as data
        import importlib

        return importlib.import_module(f"{__name__}.tables")  # `from . import tables` would ask this function again
    if name in ("Reports", "TraceReport", "all_findings"):
        from gpuadvise.analyzer.model import report

        return getattr(report, name)
    raise AttributeError(name)

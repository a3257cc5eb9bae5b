"""gpuadvise: explains why PyTorch training leaves the GPU idle, and what to change.

The public Python API (docs/python-api.md):
- `analyze(path_or_paths) -> Report`: the findings for a run folder, trace or snapshot;
- `capture(out) -> Capture`: `with gpuadvise.capture("runs/exp1") as cap:` profiles a block of code;
- `step()`: marks the end of an iteration under `gpuadvise profile`;
- `dependency_graph(path) -> networkx.DiGraph`: the graph a trace's predictions are replayed on;
- `Report`, `Finding`, `Capture`, `InputError`: the types those return or raise.
Everything else is internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuadvise.version import __version__
__all__ = ["analyze", "capture", "step", "dependency_graph", "Report", "Finding", "Capture", "InputError", "__version__"]

if TYPE_CHECKING:
    from gpuadvise.analyzer.errors import InputError
    from gpuadvise.api.capture import Capture
    from gpuadvise.api.report import Finding, PathLike, Report
    from collections.abc import Sequence


def analyze(path_or_paths: PathLike | Sequence[PathLike]) -> Report:
    """Analyse a run folder, trace or memory snapshot (or several ranks): a `Report` with `.findings`,
    `.summary`, `.to_markdown()`, `.to_json()`, `.to_html()` and rich display in Jupyter.
    Raises `InputError` for bad input."""
    from gpuadvise.api.report import analyze as run

    return run(path_or_paths)


def capture(out: str, **options: Any) -> Capture:
    """`with gpuadvise.capture("runs/exp1") as cap:` around a training loop: writes the run folder
    `gpuadvise profile` writes; `cap.step()` marks steps by hand, `cap.report()` analyses it.
    Options: wait, warmup, active (the window, as `profile`), force, record_shapes, with_stack,
    memory_history, loader_probe."""
    from gpuadvise.api.capture import Capture

    return Capture(out, **options)


def dependency_graph(path: PathLike) -> Any:
    """The graph every predicted saving of one trace is replayed on, as a `networkx.DiGraph`: the CPU work,
    runtime calls, GPU ops and waits of the chosen steps, each edge's `kind` and `us` (µs today). Its
    longest path (`networkx.dag_longest_path(g, weight="us")`) is the chain that sets the step time.
    `path`: a trace or a run folder of one trace. Raises `InputError` for bad input."""
    from gpuadvise.api.graph import dependency_graph as graph

    return graph(path)


def step() -> None:
    """Mark the end of one training iteration for `gpuadvise profile`.

    Only needed for loops that call no `optimizer.step()` and read no DataLoader; once called, it is
    the only step signal. Outside `gpuadvise profile` it does nothing.
    """
    from gpuadvise.harness.active import active

    session = active()
    if session is not None:
        session.manual_step()


def __getattr__(name: str):  # the types, imported only when asked for (`import gpuadvise` stays light)
    if name in ("Report", "Finding"):
        from gpuadvise.api import report

        return getattr(report, name)
    if name == "Capture":
        from gpuadvise.api.capture import Capture

        return Capture
    if name == "InputError":
        from gpuadvise.analyzer.errors import InputError

        return InputError
    raise AttributeError(f"module 'gpuadvise' has no attribute {name!r}")

"""Kept so that scripts written against gpuadvise 0.1 (`from gpuadvise.analyzer.engine import
analyze_paths`) still run; the code lives in run/engine.py, the public name is
`gpuadvise.analyzer.analyze_paths`."""

from gpuadvise.analyzer.run.engine import analyze_paths  # noqa: F401

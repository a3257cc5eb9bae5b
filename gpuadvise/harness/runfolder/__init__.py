"""The run folder `gpuadvise profile` writes: `layout.py` (its files' names per rank, atomic JSON writes,
the keys of run.json), `jobfolder.py` (one folder and one report for a job under torchrun), `writers.py`
(how the trace, the memory snapshot and run.json are written; the session decides when).

May import: harness.facts, harness.frameworks, analyzer.filemode.
"""

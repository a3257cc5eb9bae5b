"""The harness `gpuadvise profile` runs: the user's script under torch.profiler in a child process, stepped
by the harness, writing a run folder (trace, run.json, memory snapshot). `gpuadvise.capture(...)`, the
public context manager, drives the same session in the caller's process (gpuadvise/api/capture.py).

By concern, each sub-package's docstring saying what it owns and what it may import:
- session/: the profiling session inside the user's process and the child process that runs it;
- steps/: what a step is (its boundaries) and its times, for the whole run;
- windows/: the profiled windows: the first one, the plan of the later ones, their triggers and requests;
- frameworks/: the training frameworks (transformers, Lightning, Accelerate): detection, one module each;
- facts/: the settings run.json records (general, distributed, compiled) and the matmul shapes;
- runfolder/: the run folder's files: names, the job's folder under torchrun, the writers.
Three modules stand alone: cli.py (`gpuadvise profile`, the parent process), active.py (the session
running in this process: framework hooks and `gpuadvise.step()` reach it without importing the session)
and loaderprobe.py (where the DataLoader's time goes).

Layers, lowest first; each imports only those below it (tests/test_architecture.py checks both):
active, facts, loaderprobe → frameworks → runfolder → windows → steps → session → cli.
No part of the harness imports the rules or the TUI; the analysis only through `analyzer.run`.
"""

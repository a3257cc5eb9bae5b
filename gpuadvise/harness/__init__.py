"""The harness `gpuadvise profile` runs: the user's script under torch.profiler in a child process, stepped
by the harness, writing a run folder (trace, run.json, memory snapshot). `gpuadvise.capture(...)`, the
public context manager, drives the same session in the caller's process (gpuadvise/api/capture.py)."""

"""What a step is and how long it took: `sources.py` (where step boundaries come from: `gpuadvise.step()`,
a framework, the optimizer hook, the DataLoader, fallbacks), `times.py` (each step's CPU and GPU time,
in and out of the profiled windows), `record.py` (the whole run's step times and memory, `steps.jsonl`), `telemetry.py` (the GPU's
NVML readings in a daemon thread, `telemetry.jsonl`).

May import: harness.facts, harness.windows.window (whether the script runs on a GPU).
"""

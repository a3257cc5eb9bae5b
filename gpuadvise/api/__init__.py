"""The Python API behind `gpuadvise.analyze` and `gpuadvise.capture` (import those from `gpuadvise`)."""

"""`gpuadvise profile`: runs the user's script under torch.profiler in a child process and writes a run folder."""

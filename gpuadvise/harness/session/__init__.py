"""The profiling session inside the user's process: `session.py` steps torch.profiler at each step
boundary, times every step and writes the run folder; `bootstrap.py` is the child process of
`gpuadvise profile` that runs the script under it (`python -m gpuadvise.harness.session.bootstrap`);
`usertrace.py` prints the script's traceback without the harness's frames.

The one place that ties the other parts together.
May import: harness.active, harness.facts, harness.frameworks, harness.loaderprobe, harness.runfolder,
harness.steps, harness.windows.
"""

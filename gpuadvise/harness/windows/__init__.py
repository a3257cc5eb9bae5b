"""The profiled windows of a run. A window: `window.py` (the first window's schedule of unprofiled, probed,
warm-up and recorded steps, the profiler, the shape probe, the hooks at the recorded steps' edges) and
`quiet.py` (the profiler's own log lines kept off the user's stderr). The plan of windows: `plan.py`
(every window of one run, one profiler schedule) and `later.py` (what the session does for the windows
after the first). What asks for a later window: `triggers.py` (`--on-signal`, `--when-slower`,
`--every`), `slowwatch.py` (`--when-slower`'s drift and periodic-stall watch), `requests.py` (the
requests every rank of a job follows) and `trigger_command.py` (the `gpuadvise trigger` command).

May import: harness.facts, harness.runfolder, analyzer.errors, analyzer.model.recurrence.
"""

"""The long run, from the whole run's step record and its windows: `longrun.py` (the run-level rules'
input, `RunAnalysis`), `changepoints.py` (where a step-time series changed and how: a drift's onset and
shape, warm-up, periodic stalls, each beyond chance), `throttling.py` (whether the GPU's SM clock fell
over a slowdown, and why, from its NVML telemetry) and `slowsteps.py` (the steps of one trace far slower
than the others, and what their extra time went to).

May import: analyzer.model.
"""

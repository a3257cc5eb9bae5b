"""The per-step basics every other concern of measure builds on: `intervals.py` (interval arithmetic on
numpy arrays), `steps.py` (the steps, their windows, which step a timestamp or launch belongs to),
`spans.py` (CPU spans and what lies inside them), `source_lines.py` (the user's file:line of a call),
`syncs.py` (every call that blocks the training thread), `phases.py` and `warmup.py` (the evaluation and
checkpoint phases and the one-time costs kept out of the figures; `compilework.py`, torch.compile's own
compile spans, among them), `tables.py` (the per-step, launch, kernel, op and copy tables), `metrics.py`
(all of it computed once per trace: `Metrics`), `perstep.py` (per-step figures by the median), `idle.py`
(what the CPU did while the GPU sat idle) and `gpuwaits.py` (what the GPU waited for).

May import: analyzer.model.
"""

"""The measure stage: the numbers the rules and the report read, computed from the model
(analyzer/model) of a trace, a memory snapshot, run.json and the whole run's step record.

By concern, each sub-package's docstring saying what it owns and what it may import:
- basics/: the per-step basics the others build on: intervals, steps, spans, syncs, one-time costs, the
  tables and `Metrics` (computed once per trace), per-step figures, idle time;
- compiled/: compiled code: torch.compile's work in the trace, CUDA graphs' kernels given back to their
  ops, what compiling removes from launching;
- replay/: the what-if replay that predicts every saving (its graph, its compiled loops, its calibration);
- job/: several ranks as one run: collectives, their process groups and phases, waits, each rank's
  time, the job view and its model;
- longrun/: the whole run: change points, drifts and stalls, the GPU's throttling, slow steps;
- efficiency/: what the kernels do and could do: FLOPs, MFU, rooflines, precision, layout, attention,
  recompute;
- settings/: what the run had on (switches, frameworks), from run.json and the trace.
Two modules stand alone: analysis.py (`Analysis`, what a rule reads: the one place that ties the parts
together) and memory.py (the memory summary from a snapshot, the trace and run.json).

Layers, lowest first; each imports only those before it (tests/test_architecture.py checks both):
basics → compiled → efficiency, replay, job, memory → settings → analysis; longrun reads the model alone.
The stage reads the model, never the reader, run/ or the report.
"""

"""The analysis, one layer per folder, each reading only the layers before it:

    read/     files → events: trace loader (streamed, two processes), sources, snapshots, model cache
    model/    the data: TraceModel tables, kernel classes, findings, the reports rules and renderers share
    measure/  numbers from the model, a package per concern: the per-step basics and metrics, compiled
              code, the critical-path replay (whatif), the job view, the long run, kernel efficiency,
              the run's settings; the memory summary
    run/      orchestration: one input (single), many ranks (ranks), `analyze_paths` (engine), the CLI;
              its package API (`run.analyze`, `run.resolve_inputs`) is the one way in for every consumer
    report/   renderers: text, markdown, JSON; atomic output

The rules (gpuadvise.rules) sit between measure/ and report/: they read `measure.analysis.Analysis`
and return `model.findings.Finding`s.
"""


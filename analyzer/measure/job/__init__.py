"""The job: several ranks' traces read as one run. Per rank: `collectives.py` (its collectives, ready to
be lined up), `commphases.py` (where in the step each collective was issued, and by which kind of
parallelism), `ranktime.py` (where its training thread spends each step), `gradients.py` (the compute
left to hide a gradient reduction) and `microbatches.py` (DDP's forwards in a step and the collectives
each backward issued). Across the ranks: `commgroups.py` (the process group each collective ran on, and
each group's ranks), `waits.py` (every collective lined up, each rank's wait for the last to arrive),
`grouptime.py` (the communication by group and phase), `job.py` (the job view, `JobAnalysis`, and each
rank's stats) and `jobmodel.py` (what a fix saves the job: the ranks' steps replayed side by side).

May import: analyzer.model, analyzer.measure.basics, analyzer.measure.compiled (the kernels a CUDA graph
replayed, by the ops captured into it).
"""

"""`gpuadvise doctor`: what this machine and this torch build can do, how they are set, and a verdict
for each line. `probe` gathers the facts (the same code writes them into a profiled run's run.json),
`checks` judges them, `cli` prints them.

Nothing here imports torch (or anything else a user may lack) at import time.
"""

"""The facts run.json records about the user's script, instrumented while it runs, each failure swallowed:
`general.py` (DataLoaders, model wrappers, autocast, optimizers, torch.compile calls, backend flags, the
environment), `distributed.py` (the launcher, DDP, FSDP, DeepSpeed: run.json `distributed`),
`compiled.py` (what torch.compile did: run.json `compiled`), and `shapes.py` (the matmul shapes the
probe step records, merged into the window's trace).

May import: analyzer.model, doctor.
"""

"""The training framework that runs the user's loop: `importwatch.py` attaches to one when the script
imports it (never importing one itself), `loop.py` is what every framework reports (its start, its
steps, its evaluation and checkpoints, run.json `framework`), and one module per framework:
`hf_trainer.py` (transformers' Trainer), `lightning_trainer.py` (Lightning's Trainer),
`accelerate_steps.py` (Accelerate). Supporting a new framework is a module here plus its line in
importwatch.py.

May import: harness.active, harness.facts, analyzer.model.
"""

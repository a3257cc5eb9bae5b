"""Callbacks for the training frameworks, for users who would rather add a callback than put
`gpuadvise profile` in front of their command:

- `gpuadvise.integrations.huggingface.GpuadviseCallback`: a transformers `TrainerCallback`
  (`pip install 'gpuadvise[hf]'`);
- `gpuadvise.integrations.lightning.GpuadviseCallback`: a Lightning `Callback` (`pip install 'gpuadvise[lightning]'`).

Each profiles a window of the Trainer's steps as `gpuadvise profile` would (the same options, the same
run folder) and prints where the report is when training ends. Under `gpuadvise profile` they only mark
the steps: the profile's own session writes the run folder. Importing one imports its framework, and
says which extra to install when it is missing.
"""

"""Lightning's Trainer with gpuadvise's callback, launched as `python lightning_callback.py RUN LOGS`:
gradient accumulation over 2 batches, validation after optimizer step 4 (and the sanity check before
training), num_workers=0."""

import sys

import lightning as L

from gpuadvise.integrations.lightning import GpuadviseCallback
from lit_model import Regression

trainer = L.Trainer(max_steps=7, accumulate_grad_batches=2, val_check_interval=8, limit_val_batches=2,
                    accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=sys.argv[2],
                    callbacks=[GpuadviseCallback(sys.argv[1], wait=2, warmup=1, active=3, log_findings=True)])
trainer.fit(Regression())

"""Lightning's Trainer on two CPU processes it starts itself (`strategy="ddp"`, `devices=2`), launched as
`gpuadvise profile -o RUN lightning_ddp.py LOGS`: validation after optimizer step 4, a checkpoint at its
end, num_workers=0."""

import sys

import lightning as L

from lit_model import Regression

trainer = L.Trainer(max_steps=7, val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0,
                    accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=sys.argv[1])
trainer.fit(Regression())

"""Lightning's Trainer with gpuadvise's callback, launched as `python lightning_callback.py RUN`: gradient
accumulation over 2 batches, validation after optimizer step 4 (and the sanity check before training),
num_workers=0."""

import sys

import lightning as L
import torch

from gpuadvise.integrations.lightning import GpuadviseCallback
from slow_data import SlowPairs


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(SlowPairs(), batch_size=8, num_workers=0)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(SlowPairs(), batch_size=8, num_workers=0)


trainer = L.Trainer(max_steps=7, accumulate_grad_batches=2, val_check_interval=8, limit_val_batches=2,
                    accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=sys.argv[2] if len(sys.argv) > 2 else None,
                    callbacks=[GpuadviseCallback(sys.argv[1], wait=2, warmup=1, active=3, log_findings=True)])
trainer.fit(Regression())

"""The LightningModule both Lightning probes train: a small regression fed by the slow dataset."""

import lightning as L
import torch

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

"""A hand-written loop on Accelerate, launched as `accelerate launch ... -m gpuadvise profile ... accelerate_train.py`:
gradient accumulation over 2 micro-batches (12 micro-batches: 6 optimizer steps), num_workers=0."""

import torch
from accelerate import Accelerator

from slow_data import SlowPairs

accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(SlowPairs(), batch_size=8, num_workers=0)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for i, (x, y) in enumerate(loader):
    with accelerator.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    if i == 11:
        break

"""A loop with no optimizer and no DataLoader: it marks its steps with gpuadvise.step()."""

import torch

import gpuadvise

x = torch.randn(64, 64)
for _ in range(6):
    y = (x @ x).relu()
    gpuadvise.step()
print("done", flush=True)

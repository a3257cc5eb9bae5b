"""A tiny CPU training loop that turns autograd anomaly detection on after import (as scripts do) and
off again after the loop, so run.json must hold the setting the profiled steps ran with.
Run it with CUDA_LAUNCH_BLOCKING=1 in the environment to plant the debug variable as well."""

import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
torch.manual_seed(0)
torch.autograd.set_detect_anomaly(True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(8, 16)
for _ in range(steps):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.autograd.set_detect_anomaly(False)
print("done", flush=True)

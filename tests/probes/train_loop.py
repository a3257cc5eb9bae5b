"""python train_loop.py STEPS: a tiny CPU training loop over a DataLoader; prints each step and "done"."""

import sys

import torch
from torch.utils.data import DataLoader

steps = int(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(torch.randn(steps * 4, 16), batch_size=4, num_workers=0)
for i, x in enumerate(loader):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {i}", flush=True)
print("done", flush=True)

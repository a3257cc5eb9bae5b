"""An evaluation loop over a DataLoader (no optimizer: the profiler steps per batch). With `--grad` it
forgets torch.no_grad(), so every forward records autograd for a backward that never runs."""

import sys

import torch
from torch.utils.data import DataLoader

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4)).eval()
loader = DataLoader(torch.randn(96, 32), batch_size=8)
correct = 0
if "--grad" in sys.argv:
    for x in loader:
        correct += int((model(x).argmax(dim=1) == 0).sum())
else:
    with torch.no_grad():
        for x in loader:
            correct += int((model(x).argmax(dim=1) == 0).sum())
print("done", correct, flush=True)

"""An inference loop over a DataLoader: no optimizer anywhere."""

import torch
from torch.utils.data import DataLoader

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).eval()
loader = DataLoader(torch.randn(64, 32), batch_size=8)
with torch.no_grad():
    for x in loader:
        model(x).argmax(dim=1)
print("done", flush=True)

"""The hand-written loop with the same planted problem (the reference the frameworks' runs are held to)."""

import torch

from slow_data import SlowPairs

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(SlowPairs(), batch_size=8, num_workers=0)
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if i == 6:
        break

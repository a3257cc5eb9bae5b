"""A training loop that builds small tensors on the CPU in every step and moves them to the device:
positions (arange), a causal mask (ones → tril → bool) and loss weights (torch.tensor). On a GPU each of
those `.to(device)` calls is a small pageable host→device copy; on the CPU it is a no-op, but the ops that
create the tensors are in the trace all the same. The batch comes from a DataLoader and is moved too (not
a creation). Each move is marked with a `move:*` record_function so a test on a CPU-only machine knows
where a GPU run would have copied; the marks are annotations, which the rule does not read."""

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
n = 16
model = torch.nn.Sequential(torch.nn.Linear(n, n), torch.nn.ReLU(), torch.nn.Linear(n, 3)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
loader = DataLoader(torch.randn(64, n, n), batch_size=4)
for x in loader:
    with record_function("move:batch"):
        x = x.to(device)
    pos = torch.arange(n)
    with record_function("move:positions"):
        pos = pos.to(device)
    mask = torch.ones(n, n).tril().bool()
    with record_function("move:mask"):
        mask = mask.to(device)
    weights = torch.tensor([1.0, 2.0, 0.5])
    with record_function("move:weights"):
        weights = weights.to(device)
    h = model(x.masked_fill(~mask, 0.0) + pos.float())
    loss = (h.pow(2).mean(dim=(0, 1)) * weights).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", flush=True)

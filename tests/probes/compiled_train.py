"""python compiled_train.py CASE STEPS [BACKEND]: a tiny CPU training loop under torch.compile.

CASE: clean (fixed shapes, nothing dynamo cannot trace), recompile (dynamic=False and a batch size
that changes every two steps, the model inside torch's own `nn.Sequential`: dynamo compiles it through a
frame in torch's files), break (`.item()` inside forward: a graph break on that line).
"""

import sys

import torch

case, steps = sys.argv[1], int(sys.argv[2])
backend = sys.argv[3] if len(sys.argv) > 3 else "eager"
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self, sync: bool):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 1)
        self.sync = sync

    def forward(self, x):
        h = self.a(x).relu()
        if self.sync:
            h = h / (1.0 + h.abs().max().item())  # a Python float out of the graph: dynamo breaks here
        return self.b(h)


model = Net(sync=case == "break")
target = torch.nn.Sequential(model) if case == "recompile" else model
compiled = torch.compile(target, backend=backend, dynamic=False)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for i in range(steps):
    batch = 4 + 2 * (i // 2) if case == "recompile" else 8  # a new size every two steps
    loss = compiled(torch.randn(batch, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", flush=True)

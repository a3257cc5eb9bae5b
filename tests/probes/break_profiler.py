"""python break_profiler.py WHAT: breaks torch.profiler from inside the script, then trains and prints "done".

WHAT: step (torch.profiler.profile.step raises) or export (export_chrome_trace raises, so the trace
cannot be written when the window completes).
"""

import sys

import torch
import torch.profiler


def broken(*args, **kwargs):
    raise RuntimeError("probe: profiler broken on purpose")


what = sys.argv[1]
if what == "step":
    torch.profiler.profile.step = broken
elif what == "export":
    torch.profiler.profile.export_chrome_trace = broken
else:
    raise SystemExit(f"unknown: {what}")

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(6):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", flush=True)

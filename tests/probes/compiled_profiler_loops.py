"""python compiled_profiler_loops.py OUT [cuda]: four tiny training loops under torch.compile (Inductor),
each recorded with plain torch.profiler (no gpuadvise) into OUT/CASE.json, as a user who wraps their own
loop in the profiler would. On the CPU by default; with `cuda`, on the GPU (Triton kernels), the first
case compiled with mode="max-autotune-no-cudagraphs" so that Inductor's autotuner times its candidates
inside the window (its syncs and copies must be reported as compiling, never as the loop's):

- first: the window holds the first, compiling call (the schedule records from step 0);
- clean: fixed shapes, nothing dynamo cannot trace, recorded after the compiles;
- breaks: `torch._dynamo.graph_break()` inside forward: two compiled frames a step, eager code between;
- recompile: `dynamic=False` and a batch size that changes in the recorded steps: a recompile each time.

One Python for all four (Inductor's code cache is shared between them); prints each case's seconds.
"""

import os
import sys
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile, schedule

out = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
ACTIVITIES = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
torch.manual_seed(0)
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")


class Net(torch.nn.Module):
    def __init__(self, graph_break: bool):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
        self.graph_break = graph_break

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.graph_break:
            torch._dynamo.graph_break()  # dynamo ends the graph here and resumes in a second frame
        return self.b(h * 2).sum()


def record(case: str, sizes: list[int], wait: int, graph_break: bool = False, mode: str | None = None) -> None:
    torch._dynamo.reset()
    model = Net(graph_break).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, dynamic=False, mode=mode)
    started = time.time()
    active = len(sizes) - wait
    path = os.path.join(out, f"{case}.json")
    with profile(activities=ACTIVITIES, schedule=schedule(wait=wait, warmup=0, active=active, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for n in sizes:
            loss = compiled(torch.randn(n, 16, device=device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    print(case, f"{time.time() - started:.1f}", flush=True)


# steps 0-3 recorded: step 0 compiles (and, on a GPU, autotunes)
record("first", [8, 8, 8, 8], wait=0, mode="max-autotune-no-cudagraphs" if device == "cuda" else None)
record("clean", [8] * 7, wait=3)  # steps 3-6 recorded, long after the compiles
record("breaks", [8] * 7, wait=3, graph_break=True)
record("recompile", [8] * 5 + [12, 16], wait=3)  # steps 3-6 recorded: new sizes at steps 5 and 6

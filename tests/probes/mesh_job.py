"""A tiny transformer-style job on a 2 × 2 device mesh for torchrun on the CPU (gloo): FSDP2 over the "dp"
dimension, tensor parallelism over "tp" (ColwiseParallel into RowwiseParallel, as a transformer's MLP
is split).

    torchrun --standalone --nproc_per_node 4 mesh_job.py [--steps N] [--trace-dir DIR]

--trace-dir: record the steps with torch.profiler as a user writes it (one trace per rank, record_shapes),
into DIR/rank{r}.json; without it the script only trains (run it under `gpuadvise profile`).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--width", type=int, default=256)
p.add_argument("--trace-dir", default="")
args = p.parse_args()

torch.set_num_threads(1)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


model = torch.nn.Sequential(Block(args.width), Block(args.width))
for block in model:
    parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train(steps: int, prof=None) -> None:
    for _ in range(steps):
        x = torch.randn(8, args.width)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if prof is not None:
            prof.step()


if args.trace_dir:
    os.makedirs(args.trace_dir, exist_ok=True)

    def save(prof) -> None:
        prof.export_chrome_trace(os.path.join(args.trace_dir, f"rank{rank}.json"))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.steps - 2),
                                on_trace_ready=save) as prof:
        train(args.steps, prof)
else:
    train(args.steps)
dist.destroy_process_group()

"""A tiny data-parallel job for torchrun on the CPU (gloo), with the distributed pitfalls to plant.

    torchrun --standalone --nproc_per_node 2 ddp_job.py [--steps N] [--sleep-rank R --sleep-ms MS]
        [--accumulate K [--no-sync]] [--find-unused] [--fsdp] [--raise-rank R --raise-at STEP] [--time]

--sleep-rank: that rank sleeps before each step's forward (a slow input pipeline on one rank);
--accumulate: K micro-batches per optimizer step, each one all-reduced unless --no-sync;
--find-unused: DDP(find_unused_parameters=True) on a model that uses every parameter;
--fsdp: FSDP2 fully_shard on each layer instead of DDP; --raise-rank: that rank raises at step STEP;
--time: rank 0 prints the median wall time of the steps after the third, as "step_ms=…" (unprofiled runs).
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--sleep-rank", type=int, default=-1)
p.add_argument("--sleep-ms", type=float, default=0.0)
p.add_argument("--accumulate", type=int, default=1)
p.add_argument("--no-sync", action="store_true")
p.add_argument("--find-unused", action="store_true")
p.add_argument("--fsdp", action="store_true")
p.add_argument("--raise-rank", type=int, default=-1)
p.add_argument("--raise-at", type=int, default=-1)
p.add_argument("--width", type=int, default=256)
p.add_argument("--time", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
layers = [torch.nn.Linear(args.width, args.width) for _ in range(3)]
model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
if args.fsdp:
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
else:
    model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=args.find_unused)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = []
for step in range(args.steps):
    t0 = time.perf_counter()
    if step == args.raise_at and rank == args.raise_rank:
        raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
    for micro in range(args.accumulate):
        last = micro == args.accumulate - 1
        quiet = model.no_sync() if args.no_sync and not last else contextlib.nullcontext()
        with quiet:
            if rank == args.sleep_rank:
                time.sleep(args.sleep_ms / 1e3)
            x = torch.randn(32, args.width)
            loss = model(x).square().mean() / args.accumulate
            loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
if args.time and rank == 0:
    print(f"step_ms={1e3 * statistics.median(times[3:]):.3f}", flush=True)
dist.destroy_process_group()

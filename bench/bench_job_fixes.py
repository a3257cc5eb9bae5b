"""What the distributed fixes measure without the profiler, side by side in one job (the same load on a
shared machine for both sides): the loop of tests/probes/ddp_job.py with each pitfall and its fix, in
alternating blocks of steps, the median step time of each.

    python -m torch.distributed.run --standalone --nproc_per_node 2 bench/bench_job_fixes.py [--rounds 8]

Pairs: gradient accumulation of 4 micro-batches without / with `no_sync()`; DDP with / without
`find_unused_parameters=True` (a model that uses every parameter); rank 1 sleeping 30 ms per step / not.
Rank 0 prints one line per pair: both medians (ms) and the saving 1 − fixed / before, the figure
`gpuadvise profile` predicts on the profiled script (docs/jobs.md).
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block", type=int, default=5, help="steps per block")
    p.add_argument("--width", type=int, default=256)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()

    def model(find_unused: bool):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                  torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                  torch.nn.Linear(args.width, args.width))
        ddp = torch.nn.parallel.DistributedDataParallel(net, find_unused_parameters=find_unused)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)

    plain, unused = model(False), model(True)

    def step(m, accumulate=1, no_sync=False, sleep_ms=0.0) -> float:
        ddp, opt = m
        t0 = time.perf_counter()
        for micro in range(accumulate):
            last = micro == accumulate - 1
            with ddp.no_sync() if no_sync and not last else contextlib.nullcontext():
                if rank == 1 and sleep_ms:
                    time.sleep(sleep_ms / 1e3)
                loss = ddp(torch.randn(32, args.width)).square().mean() / accumulate
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    pairs = {
        "accumulation of 4: no no_sync → no_sync": (lambda: step(plain, 4), lambda: step(plain, 4, no_sync=True)),
        "find_unused_parameters=True → False": (lambda: step(unused), lambda: step(plain)),
        "rank 1 sleeps 30 ms → does not": (lambda: step(plain, sleep_ms=30), lambda: step(plain)),
    }
    for name, (before, after) in pairs.items():
        for fn in (before, after):  # warm up both sides (DDP rebuilds its buckets on the first steps)
            for _ in range(3):
                fn()
        times = ([], [])
        for _ in range(args.rounds):
            for side, fn in enumerate((before, after)):
                times[side].extend(fn() for _ in range(args.block))
        b, a = (1e3 * statistics.median(t) for t in times)
        if rank == 0:
            print(f"{name}: {b:.2f} → {a:.2f} ms per step, saving {100 * (1 - a / b):.1f} %", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A loop of many tiny ops: a deep, narrow MLP with LayerNorm at a small batch, and a non-fused
optimizer. Each op does little work, so the per-op cost of launching it (and of profiling it)
dominates the step, as in GPT-2-sized models at small batch or with many small parameters.

    python examples/train_small_ops.py
    gpuadvise profile examples/train_small_ops.py
"""

import argparse

import torch
from torch import nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--depth", type=int, default=24)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.LayerNorm(args.width), nn.GELU()]
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)  # one small op per parameter
    x = torch.randn(args.batch_size, args.width, device=device)
    for step in range(args.steps):
        loss = model(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"done: {args.steps} steps, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

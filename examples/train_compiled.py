"""The healthy loop, compiled: fixed shapes, nothing dynamo cannot trace, so torch.compile compiles
once and every later step runs the compiled graphs. `gpuadvise profile` finds no compile problem here.

    gpuadvise profile examples/train_compiled.py [--backend inductor]
"""

import argparse

import torch
from torch import nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager compiles in a second)")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(device)
    step_fn = torch.compile(model, backend=args.backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(args.steps, args.batch_size, 512, device=device)
    labels = torch.randint(0, 10, (args.steps, args.batch_size), device=device)
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(step_fn(data[step]), labels[step])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print(f"done: {args.steps} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()

"""A small training loop with a planted input-pipeline stall: a single-process DataLoader whose
samples are slow to produce (as decoding JPEGs on the training thread would be).

    python examples/train_stall.py            # runs on the GPU if there is one, else on the CPU
    gpuadvise profile examples/train_stall.py # find out why it is slow
    gpuadvise profile -o fixed examples/train_stall.py --workers 2  # the fix: load in worker processes
    gpuadvise compare <first run folder> fixed                      # dataloader-stall resolved
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowImages(Dataset):
    """Random 'images' that take `delay` seconds each to load, like decoding on the training thread."""

    def __init__(self, n: int, delay: float, io: bool = False):
        self.n, self.delay, self.io = n, delay, io
        self.image = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.io:  # waiting, as reading from a slow disk or network would: workers overlap it on any machine
            time.sleep(self.delay)
            return self.image, i % 10
        # CPU work, as decoding would be (so the stall keeps its share of the step however busy the machine is)
        start = time.process_time()
        while time.process_time() - start < self.delay:
            pass
        return self.image, i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--delay", type=float, default=0.001, help="CPU seconds to load one sample")
    p.add_argument("--width", type=int, default=16, help="convolution channels (a wider model: a longer step)")
    p.add_argument("--io", action="store_true", help="samples wait (slow storage) instead of computing (decoding)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (0: the planted stall)")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Conv2d(3, args.width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                          nn.Flatten(), nn.Linear(16 * args.width, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowImages(args.steps * args.batch_size, args.delay, args.io), batch_size=args.batch_size,
                        num_workers=args.workers,  # 0, the planted stall: loading happens on the training thread
                        persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers > 0 else None)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"done: {args.steps} steps, last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()

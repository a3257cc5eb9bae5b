"""Every output channel a training script uses, deterministic run to run (tests/test_profile_output.py)."""
import logging
import os
import sys
import warnings

import torch
from torch.utils.data import DataLoader, Dataset
import tqdm

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # stderr
log = logging.getLogger("train")
tqdm.tqdm.monitor_interval = 0  # no monitor thread: the bar moves on updates only


class Numbers(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        warnings.warn("a warning from a DataLoader worker")  # once per worker process (each epoch's)
        return torch.full((4,), float(i))


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    # pin_memory on a machine without an accelerator: torch warns as each epoch's iterator starts, once shown
    loader = DataLoader(Numbers(), batch_size=2, num_workers=1, pin_memory=True)
    print("stdout, block-buffered: written at the end", end="")
    print(" (same line)")
    print("stdout, flushed at once", flush=True)
    step = 0
    for epoch in range(3):
        bar = tqdm.tqdm(loader, desc=f"epoch {epoch}", mininterval=0, miniters=1, bar_format="{desc}: {n_fmt}/{total_fmt}")
        for x in bar:
            warnings.warn("a warning in the training loop, once per location")
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            # the bytes stdout has put in its file so far: a flush by anyone else moves them
            log.info("step %d loss %.4f stdout at %d bytes", step, loss.item(), os.fstat(1).st_size)
            print(f"stdout line of step {step}")
            if step % 7 == 0:
                sys.stdout.flush()
                sys.stderr.write("stderr without a newline, ")
        bar.close()
    print("done", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()

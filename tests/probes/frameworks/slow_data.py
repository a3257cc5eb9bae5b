"""The planted problem every framework probe shares: a dataset whose __getitem__ sleeps 10 ms a sample,
read with num_workers=0, so each step waits on the DataLoader (80 ms a batch of 8: a clear share of the
step even when the profiler slows a loaded machine's recorded steps several times over)."""

import time

import torch


class SlowTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 4096, length: int = 32, vocab: int = 128):
        self.n, self.length, self.vocab = n, length, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.01)  # decoding, augmenting, reading from a slow disk
        ids = torch.randint(0, self.vocab, (self.length,))
        return {"input_ids": ids, "labels": ids}


class SlowPairs(torch.utils.data.Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(32), torch.randn(4)

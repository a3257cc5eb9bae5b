"""python transformer_loops.py OUT: tiny GPT-style training loops on the CPU, each recorded with plain
torch.profiler into OUT/CASE.json, as a user who wraps their own loop in the profiler would:

- hand: attention written out (q @ kᵀ, scale, causal masked_fill, softmax, @ v), with Python stacks
  (`with_stack=True`: the finding points at the line);
- math: `F.scaled_dot_product_attention(..., is_causal=True)` forced to the math backend with
  `torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`;
- fused: the same call on the default backend (the CPU's flash kernel);
- hand_dropout: attention written out with dropout on its probabilities (`F.dropout(att, 0.1)`), as
  minGPT writes it;
- dropout: the SDPA call with attention dropout (`dropout_p=0.1` while training) on the default backend,
  which on a CPU is the math backend (the CPU's flash kernel takes no dropout);
- plain / checkpointed: the fused model without, and with, `torch.utils.checkpoint` (non-reentrant) on
  every block, `profile_memory=True`; each block's forward is annotated `block`, `loss.backward()`
  `backward`, so the recompute can be counted by hand: the `block` spans inside `backward`.

One Python for all of them; prints each case's seconds.
"""

import contextlib
import math
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.checkpoint import checkpoint

out = sys.argv[1]
torch.manual_seed(0)
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
B, T, C, H, VOCAB = 4, 256, 64, 4, 256


class Attention(torch.nn.Module):
    def __init__(self, hand: bool, dropout: float = 0.0):
        super().__init__()
        self.qkv, self.proj, self.hand = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C), hand
        self.dropout = dropout
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        if self.hand:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(self.mask == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            if self.dropout:
                att = F.dropout(att, self.dropout, self.training)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(torch.nn.Module):
    def __init__(self, hand: bool, dropout: float = 0.0):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.attn = Attention(hand, dropout)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(C, 4 * C), torch.nn.GELU(), torch.nn.Linear(4 * C, C))

    def forward(self, x):
        with record_function("block"):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, hand: bool = False, ckpt: bool = False, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, C)
        self.blocks = torch.nn.ModuleList(Block(hand, dropout) for _ in range(layers))
        self.head, self.ckpt = torch.nn.Linear(C, VOCAB), ckpt

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.ckpt else block(x)
        return self.head(x)


def record(case: str, model: GPT, backend=None, stack: bool = True, memory: bool = False, steps: int = 3) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, VOCAB, (B, T))
    path = f"{out}/{case}.json"
    sched = schedule(wait=0, warmup=1, active=steps, repeat=1)
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext(), \
            profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=stack, profile_memory=memory,
                    schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(steps + 1):
            loss = F.cross_entropy(model(idx).view(-1, VOCAB), idx.view(-1))
            with record_function("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


for case, kwargs in {"hand": dict(model=GPT(hand=True)),
                     "math": dict(model=GPT(), backend=SDPBackend.MATH, stack=False),
                     "fused": dict(model=GPT(), stack=False),
                     "dropout": dict(model=GPT(dropout=0.1), stack=False),
                     "hand_dropout": dict(model=GPT(hand=True, dropout=0.1), stack=False),
                     "plain": dict(model=GPT(), stack=False, memory=True),
                     "checkpointed": dict(model=GPT(ckpt=True), stack=False, memory=True)}.items():
    t0 = time.perf_counter()
    record(case, **kwargs)
    print(f"{case}: {time.perf_counter() - t0:.2f} s")

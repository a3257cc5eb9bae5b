"""Collectives as traces record them, on every backend: which events are collectives, what each one does
there, and which collective (all-reduce, all-gather, …) it is.

A collective shows in a trace in up to three ways:
- **kernel**: a GPU kernel that runs it (NCCL/RCCL `ncclDevKernel_AllReduce_…`); newer torch puts the
  collective's metadata in the kernel's args ("Collective name", "In msg nelems", "Process Group Name",
  "Group size", "dtype", "Seq");
- **host**: a span on a CPU backend's worker thread that runs it (`gloo:all_reduce` on gloo's
  `pt_gloo_runloop` thread, `mpi:…`, `ucc:…`): the collective's execution when no GPU kernel does it;
- **call**: the CPU-side call that issues it (`c10d::allreduce_`, `record_param_comms` with the same
  metadata, `nccl:all_reduce`): it returns at once for an asynchronous backend and says nothing about
  when the collective ran.

The kernel or host span is the collective's execution: it starts when the rank arrives (its data is
ready and its stream or worker thread gets to it) and ends when the transfer is done, which is never
before the last rank has arrived. Waits are measured on those (measure/collectives.py).
"""

from __future__ import annotations

import re

import numpy as np

from .kernels import is_comm
from .trace import name_mask

KERNEL, HOST, CALL = "kernel", "host", "call"

# Backends whose collectives run on the GPU: their `<backend>:<collective>` CPU annotation is only the call
GPU_BACKENDS = ("nccl", "rccl", "hccl", "xccl")
# `<backend>:<collective>` annotations: gloo:all_reduce, nccl:_all_gather_base, mpi:broadcast, ucc:…
BACKEND_SPAN = re.compile(r"^(gloo|nccl|rccl|mpi|ucc|hccl|xccl):(\w+)$")
# The CPU-side calls every backend goes through
C10D_CALL = re.compile(r"^c10d::(\w+)$")
PARAM_COMMS = "record_param_comms"

# The collective a name stands for, from its words: the kernel's (`AllReduce`, `ReduceScatter`,
# `SendRecv`), the op's (`_allgather_base_`, `reduce_scatter_tensor_coalesced_`, `alltoall_base_`) or
# record_param_comms' "Collective name" (`allreduce`, `_allgather_base`, `all_to_allv`)
_KINDS = (
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_reduce", re.compile(r"all_?reduce", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
    ("send_recv", re.compile(r"send_?recv|^_?send|^_?recv|p2p", re.I)),
    ("gather", re.compile(r"gather", re.I)),
    ("scatter", re.compile(r"scatter", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
)


def role(name: str, is_kernel: bool) -> str | None:
    """What the event is for a collective (KERNEL, HOST, CALL), None when it is not one."""
    if is_kernel:
        return KERNEL if is_comm(name) else None
    if name == PARAM_COMMS or C10D_CALL.match(name):
        return CALL
    m = BACKEND_SPAN.match(name)
    if m:
        return CALL if m.group(1) in GPU_BACKENDS else HOST
    return None


def kind(name: str, collective: str = "") -> str:
    """The collective, one word for every backend: "all_reduce", "all_gather", "reduce_scatter",
    "all_to_all", "broadcast", "barrier", "send_recv", "gather", "scatter", "reduce", or "other"."""
    text = collective or _words(name)
    for word, pattern in _KINDS:
        if pattern.search(text):
            return word
    return "other"


def _words(name: str) -> str:
    """The part of an event name that says which collective it is."""
    m = BACKEND_SPAN.match(name) or C10D_CALL.match(name)
    if m:
        return m.groups()[-1]
    # ncclDevKernel_AllReduce_Sum_f32_RING_LL(…), ncclKernel_SendRecv_…: the words after the prefix
    head = name.split("(", 1)[0]
    return re.sub(r"^(nccl|rccl)(Dev)?Kernel_?", "", head, flags=re.I)


# Collectives whose ranks all finish together: the transfer ends only when every rank has sent and
# received, so their ends line the ranks' clocks up (broadcast and point-to-point end rank by rank)
SYMMETRIC = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})


def began(comms, runs, kinds: list[str], where: list[str]) -> np.ndarray:
    """When each execution in `runs` (rows of the model's `comms`, in start order, with their `kinds` and
    `where`, KERNEL or HOST) began for its rank. A kernel: its start on the GPU. A CPU backend's span: the
    `c10d::` call that issued it, when that came first: the training thread is held in the call (gloo
    may block there) as it is in the backend's span, and the rank arrived when it issued the collective.
    The k-th span of a collective goes with the earliest call of that collective not yet paired and
    issued before it (a backend runs its queue in order)."""
    ts = runs["ts"].to_numpy(dtype=float).copy()
    host = [i for i, w in enumerate(where) if w == HOST]
    calls = comms[(comms["role"] == CALL).to_numpy() & name_mask(comms["name"], C10D_CALL.match)]
    if not host or calls.empty:
        return ts
    pending: dict = {}
    for t, name in sorted(zip(calls["ts"].to_numpy(dtype=float).tolist(), calls["name"].astype(str))):
        pending.setdefault(kind(name), []).append(t)
    used = dict.fromkeys(pending, 0)
    for i in host:
        queue = pending.get(kinds[i], [])
        j = used.get(kinds[i], 0)
        if j < len(queue) and queue[j] <= ts[i]:
            ts[i] = queue[j]
            used[kinds[i]] = j + 1
    return ts


def executions(comms):
    """The rows of `comms` that are a collective's execution (a kernel or a CPU backend's span), in start
    order, with `kinds` and `where` for each: (rows, kinds, where); None when there are none."""
    if comms is None or comms.empty:
        return None
    runs = comms[comms["role"].isin([KERNEL, HOST])]
    if runs.empty:
        return None
    runs = runs.sort_values("ts", kind="stable")
    kinds = [kind(n, str(c)) for n, c in zip(runs["name"].astype(str).tolist(), runs["collective"].astype(str))]
    return runs, kinds, runs["role"].astype(str).tolist()


def host_spans(comms) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the collectives a CPU backend ran (gloo's, MPI's, …), each from the call that issued
    it (`began`): the time the rank spent inside them, as the job's view measures it; empty arrays when the
    trace has none."""
    found = executions(comms)
    if found is None:
        return np.zeros(0), np.zeros(0)
    runs, kinds, where = found
    host = np.array([w == HOST for w in where], dtype=bool)
    if not host.any():
        return np.zeros(0), np.zeros(0)
    ts = began(comms, runs, kinds, where)
    return ts[host], runs["end"].to_numpy(dtype=float)[host]

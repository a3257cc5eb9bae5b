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

from .kernels import is_comm

KERNEL, HOST, CALL = "kernel", "host", "call"

# Backends whose collectives run on the GPU: their `<backend>:<collective>` CPU annotation is only the call
GPU_BACKENDS = ("nccl", "rccl", "hccl", "xccl")
# `<backend>:<collective>` annotations: gloo:all_reduce, nccl:_all_gather_base, mpi:broadcast, ucc:…
BACKEND_SPAN = re.compile(r"^(gloo|nccl|rccl|mpi|ucc|hccl|xccl):(\w+)$")
# The CPU-side calls every backend goes through
C10D_CALL = re.compile(r"^c10d::(\w+)$")
PARAM_COMMS = "record_param_comms"
# Functional collectives (DTensor, tensor parallel, compiled code): the op that issues a `c10d::` call and
# returns a tensor to wait on, and the op that waits for it. Neither is the rank's own work: the first
# only hands the collective to the backend, the second blocks until it is done.
FUNCTIONAL = re.compile(r"^_?c10d_functional(_autograd)?::(\w+)$")
WAITS = re.compile(r"^_?c10d_functional(_autograd)?::wait_tensor$|^c10d::wait")

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


def runs_as(span_kind: str, call_kind: str) -> bool:
    """Whether a CPU backend's span of `span_kind` can run a call of `call_kind`: the same collective, or
    gloo's reduce-scatter, which it runs as an all-reduce (`gloo:all_reduce` for `c10d::_reduce_scatter_base_`)."""
    return (span_kind == call_kind or span_kind == "other"
            or (span_kind == "all_reduce" and call_kind == "reduce_scatter"))


def not_work(name: str) -> bool:
    """A CPU op that is part of a collective, not the rank's own work: the call that issues it, a
    functional collective's op, or a wait for one."""
    return role(name, False) is not None or bool(FUNCTIONAL.match(name)) or bool(WAITS.match(name))


def parse_ranks(value) -> list[int]:
    """A group's ranks as the trace writes them: a list, or its text ("[0, 2]", "0,2"); [] when unreadable."""
    if isinstance(value, str):
        value = [p for p in value.strip().strip("[]").replace(",", " ").split() if p]
    if not isinstance(value, (list, tuple)):
        return []
    out = []
    for v in value:
        try:
            out.append(int(v))
        except (TypeError, ValueError):
            return []
    return out


# Collectives whose ranks all finish together: the transfer ends only when every rank has sent and
# received, so their ends line the ranks' clocks up (broadcast and point-to-point end rank by rank)
SYMMETRIC = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})

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
before the last rank has arrived. Waits are measured on those (measure/job/collectives.py).
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
# c10d calls whose tensors say their group's size (the reader keeps their shapes: model/flopops.shaped): an
# all-gather's output holds every rank's input, a reduce-scatter's input every rank's output. Argument
# positions (output, input) as the ops take them: (bigger, smaller).
SIZED_CALLS = {"c10d::_allgather_base_": (0, 1), "c10d::_reduce_scatter_base_": (1, 0)}
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


def in_a_collective(ops) -> np.ndarray:
    """Per CPU op (rows of the model's `cpu`): whether it is part of a collective (`not_work`: its call, a
    functional collective's op, a wait for one) or holds one inside it on its thread (autograd's node whose
    hook issued an FSDP reduce-scatter, a tensor-parallel op waiting for its all-reduce): the thread spends
    that op in the collective, not in work of its own. Ops nest on a thread, so an op holds one when the
    first collective op starting at or after it starts before it ends."""
    out = name_mask(ops["name"], not_work)
    if not out.any():
        return out
    ts, end, tid = (ops[c].to_numpy() for c in ("ts", "end", "tid"))
    for t in np.unique(tid[out]):
        on = tid == t
        starts = np.sort(ts[on & out])
        k = np.searchsorted(starts, ts[on], side="left")
        nxt = np.where(k < len(starts), starts[np.minimum(k, len(starts) - 1)], np.inf)
        out[on] |= nxt < end[on]
    return out


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


def calls_of(comms, runs, kinds: list[str], where: list[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """For each execution in `runs` (rows of the model's `comms`, in start order, with their `kinds` and
    `where`, KERNEL or HOST) that is a CPU backend's span, the `c10d::` call that issued it: its start,
    thread and collective (NaN, -1, "" for kernels and spans no call is found for). Each span goes with the
    earliest call not yet paired that was issued before it and that it can run (`runs_as`: the same
    collective; gloo runs a reduce-scatter as an all-reduce): a backend runs its queue in order."""
    n = len(runs)
    call_ts, call_tid, call_kind = np.full(n, np.nan), np.full(n, -1, dtype=np.int64), [""] * n
    host = [i for i, w in enumerate(where) if w == HOST]
    calls = comms[(comms["role"] == CALL).to_numpy() & name_mask(comms["name"], C10D_CALL.match)]
    if not host or calls.empty:
        return call_ts, call_tid, call_kind
    calls = calls.sort_values("ts", kind="stable")
    c_ts = calls["ts"].to_numpy(dtype=float)
    c_tid = calls["tid"].to_numpy(dtype=np.int64)
    c_kind = [kind(str(name)) for name in calls["name"]]
    used = np.zeros(len(calls), dtype=bool)
    first_free = 0
    span_ts = runs["ts"].to_numpy(dtype=float)
    for i in host:
        while first_free < len(calls) and used[first_free]:
            first_free += 1
        j = first_free
        while j < len(calls) and c_ts[j] <= span_ts[i]:
            if not used[j] and runs_as(kinds[i], c_kind[j]):
                used[j] = True
                call_ts[i], call_tid[i], call_kind[i] = c_ts[j], c_tid[j], c_kind[j]
                break
            j += 1
    return call_ts, call_tid, call_kind


def began(comms, runs, kinds: list[str], where: list[str], calls=None) -> np.ndarray:
    """When each execution in `runs` (as for `calls_of`) began for its rank. A kernel: its start on the GPU.
    A CPU backend's span: the `c10d::` call that issued it (`calls_of`), when that came first: the training
    thread is held in the call (gloo may block there) as it is in the backend's span, and the rank arrived
    when it issued the collective. `calls`: `calls_of`'s answer where the caller has it already."""
    call_ts = (calls if calls is not None else calls_of(comms, runs, kinds, where))[0]
    ts = runs["ts"].to_numpy(dtype=float)
    return np.where(np.isfinite(call_ts), np.minimum(call_ts, ts), ts)


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


def size_from_shapes(name: str, dims: list) -> int:
    """The group size a sized c10d call's tensors give (`SIZED_CALLS`; `dims`: its recorded `Input Dims`),
    0 when they do not give one (another call, shapes missing, sizes that do not divide)."""
    where = SIZED_CALLS.get(name)
    if where is None or not isinstance(dims, list) or len(dims) <= max(where):
        return 0
    numel = []
    for d in (dims[where[0]], dims[where[1]]):
        if not isinstance(d, list) or not d or not all(isinstance(x, int) and x > 0 for x in d):
            return 0
        numel.append(int(np.prod(d)))
    big, small = numel
    return big // small if big % small == 0 and big >= 2 * small else 0

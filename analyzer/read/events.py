"""Typed shapes of Kineto Chrome-trace events, decoded by msgspec straight from the JSON bytes.

Only the fields the analysis reads are declared; msgspec skips every other key without building it,
which is most of the speed and memory win over `json.load`.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

Num = Union[int, float, None]


class Args(msgspec.Struct, omit_defaults=True, gc=False):
    correlation: Num = None
    external_id: Num = msgspec.field(name="External id", default=None)
    external_id_legacy: Num = msgspec.field(name="external id", default=None)
    stream: Num = None
    device: Num = None
    nbytes: Num = msgspec.field(name="bytes", default=None)
    # [memory] instant events
    mem_bytes: Num = msgspec.field(name="Bytes", default=None)
    total_allocated: Num = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Num = msgspec.field(name="Total Reserved", default=None)
    device_type: Num = msgspec.field(name="Device Type", default=None)
    device_id: Num = msgspec.field(name="Device Id", default=None)
    addr: Num = msgspec.field(name="Addr", default=None)
    # python_function events (with_stack=True)
    python_id: Num = msgspec.field(name="Python id", default=None)
    python_parent_id: Num = msgspec.field(name="Python parent id", default=None)
    # cpu ops recorded while autograd is on: the autograd sequence number (forward op and its backward share it)
    sequence_number: Num = msgspec.field(name="Sequence number", default=None)
    # cpu ops: shapes and dtypes (record_shapes=True) and the legacy call stack
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b"null"))  # decoded for matmuls only
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b"null"))
    input_concrete: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=msgspec.Raw(b"null"))  # scalar arguments
    call_stack: Any = msgspec.field(name="Call stack", default=None)
    # collectives (NCCL kernels and record_param_comms in newer torch): what, in which process group, how big
    collective_name: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    group_size: Num = msgspec.field(name="Group size", default=None)
    in_nelems: Num = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Num = msgspec.field(name="Out msg nelems", default=None)
    dtype: Any = None
    comm_seq: Num = msgspec.field(name="Seq", default=None)
    # newer torch: the group's description and ranks, and one id for a collective on every rank ("Comms Id",
    # a 64-bit hash kept as its text: as a JSON number it may not fit an int64 or a double)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    comms_id: msgspec.Raw = msgspec.field(name="Comms Id", default=msgspec.Raw(b"null"))
    # kernels a CUDA graph launched: the graph and its node (CUPTI)
    graph_id: Num = msgspec.field(name="graph id", default=None)
    graph_node_id: Num = msgspec.field(name="graph node id", default=None)
    # metadata (ph M) payload
    name: Any = None
    labels: Any = None


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: Any = ""
    name: Any = ""
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: Union[float, None] = None
    dur: Union[float, None] = None
    args: Union[Args, None] = None


class Header(msgspec.Struct):
    """The top level of a trace file; events stay raw byte slices until decoded chunk by chunk."""

    traceEvents: msgspec.Raw = msgspec.Raw(b"null")  # the events array, still undecoded
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    cupti_version: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    roctracer_version: Any = None
    record_shapes: Any = None
    profile_memory: Any = None
    with_stack: Any = None
    trace_id: Any = None


# Kineto category names, old (2021) and new, mapped to the table each event lands in.
KERNEL, MEMCPY, MEMSET, RUNTIME, CPU_OP, ANNOTATION, GPU_ANNOTATION, PYTHON, SYNC, MEMORY, RANGE, OVERHEAD = range(12)

CATEGORY = {
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cuda_runtime": RUNTIME,
    "runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "privateuse1_runtime": RUNTIME,
    "privateuse1_driver": RUNTIME,
    "cpu_op": CPU_OP,
    "operator": CPU_OP,
    "user_annotation": ANNOTATION,
    "gpu_user_annotation": GPU_ANNOTATION,
    "python_function": PYTHON,
    "cuda_sync": SYNC,
    "cpu_instant_event": MEMORY,  # only the [memory] ones are kept, see loader
    "cuda_profiler_range": RANGE,
    "overhead": OVERHEAD,
}

# Categories that are known and deliberately not tabulated (flows, the profiler span, counters).
IGNORED_CATEGORIES = {
    "ac2g", "async", "async_cpu_to_gpu", "async_gpu", "fwdbwd", "trace", "external_correlation",
    "cuda_event", "collective_comm", "mtia_runtime", "mtia_ccp_events", "mtia_insight", "mtia_counters",
    "glow_runtime", "hpu_op", "xpu_runtime", "xpu_driver", "xpu_scope_profiler", "xpu_sync",
    "hardware_counters", "",
    "gpuadvise",  # the findings track `--perfetto` adds: re-analysing that file gives the same report
}

# The document around the events array (deviceProperties, distributedInfo, …), decoded on its own.
HEADER = msgspec.json.Decoder(Header)

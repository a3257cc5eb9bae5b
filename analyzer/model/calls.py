"""Names of the runtime calls and CPU annotations that the analysis gives a meaning to.

One list per meaning, shared by the metrics, the what-if replay, the rules and the TUI, so that a call
added here (a new CUDA or HIP entry point) counts the same everywhere. CUDA and HIP spellings sit
side by side: a ROCm trace uses the same profiler events with `hip` names.
"""

from __future__ import annotations

import re

# Calls that put a kernel (or a whole CUDA graph) on a stream.
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cudaGraphLaunch", "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel", "hipExtLaunchKernel",
    "hipGraphLaunch", "hipLaunchCooperativeKernel",
})
# The launches among them that replay a captured graph: one call, many kernels.
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
# Calls that put a copy or a memset on a stream (the blocking ones are in SYNC_CALLS too).
COPY_CALLS = frozenset({"cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync", "cudaMemset", "cudaMemcpy2DAsync",
                        "hipMemcpyAsync", "hipMemcpy", "hipMemcpyWithStream", "hipMemsetAsync", "hipMemset"})
# Async copies: they return at once, except from or to pageable host memory (then they may wait for the stream).
ASYNC_COPIES = frozenset({"cudaMemcpyAsync", "hipMemcpyAsync"})
# Calls that only enqueue work and return at once, unless the launch queue is full (then they wait for a slot).
QUEUEING_CALLS = LAUNCH_CALLS | ASYNC_COPIES | frozenset({"cudaMemsetAsync", "hipMemsetAsync"})
# Calls that block the CPU until the GPU catches up, with what they wait for.
SYNC_CALLS = {
    "cudaStreamSynchronize": "stream", "cudaDeviceSynchronize": "device", "cudaEventSynchronize": "event",
    "hipStreamSynchronize": "stream", "hipDeviceSynchronize": "device", "hipEventSynchronize": "event",
    "cudaMemcpy": "blocking copy", "hipMemcpy": "blocking copy", "hipMemcpyWithStream": "blocking copy",
    "cudaMemset": "blocking memset", "hipMemset": "blocking memset",
}
# The syncs that wait for every stream, not one.
DEVICE_SYNCS = frozenset({"cudaDeviceSynchronize", "hipDeviceSynchronize"})
# Device memory allocator calls (cudaFree also synchronises the device before it returns).
ALLOC_CALLS = ("cudaMalloc", "hipMalloc")
FREE_CALLS = ("cudaFree", "hipFree")
# CPU ops that read one GPU value back to the host (`.item()`, `float(t)`, `if t:`): each one is a sync.
SCALAR_OPS = frozenset({"aten::_local_scalar_dense", "aten::item"})

# The profiler's annotation of one `next(iter(loader))`: the training loop waiting for a batch.
DATALOADER = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#")
# torch.profiler's per-step annotation; group 1 is the step number.
STEP = re.compile(r"^ProfilerStep#(\d+)$")
# What a training framework does between its steps (evaluation, saving a checkpoint): `gpuadvise profile`
# marks it with a CPU annotation named PHASE_PREFIX + the phase ("gpuadvise: evaluation"), and a step that
# holds one is no ordinary training step.
PHASE_PREFIX = "gpuadvise: "
# A GPU copy's name: "Memcpy HtoD (Pinned -> Device)" gives direction, source and destination memory.
COPY_NAME = re.compile(r"^Memcpy (\w+) \(([\w ]+?) -> ([\w ]+?)\)")

# Training work as traces name it: the autograd engine's backward wrapper, autograd node names, gradient
# accumulation, or the optimizer hook's annotation (a forward-only pass has none of them)
TRAINING = re.compile(r"^autograd::engine::evaluate_function:|Backward\d*$|AccumulateGrad|^Optimizer\.step#")

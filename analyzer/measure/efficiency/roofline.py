"""The roofline of a matmul kernel on a device: the least time its work can take, and the speed-up a
precision fix can give it.

A kernel cannot run faster than any of three limits (model/devices.py gives the device's numbers):

- **compute**: its FLOPs (2·M·K·N per batch) over the dense peak of the units it runs on (fp32 SIMT, or
  the matrix units in TF32 / bf16 / fp16 / fp8);
- **memory**: the bytes it must move at least once (both operands and the result, (MK + KN + MN) per
  batch, at the operand width) over the device's memory bandwidth;
- **latency**: a kernel launched on a GPU takes a few µs however little it does: LATENCY_FLOOR_US.

`bound(...)` is the hardware's own limit (the peaks and the bandwidth as the vendor states them): no
prediction is allowed below it. `attainable(...)` is what a well-tuned kernel reaches: the compute limit
at the efficiency large GEMMs reach (calibrated on the open H100 pairs, measure/efficiency/precision.py), the memory
limit at MEMORY_EFFICIENCY of the bandwidth. A fix moves a kernel from one attainable roofline to another:
a large, compute-bound GEMM runs the ratio of the two peaks faster; a skinny one (M = 8 tokens) is bound
by reading its weight and runs the ratio of the operand widths faster (2× for bf16, 1× for TF32); a tiny
one is bound by its launch and does not get faster at all.

Two predictions, the two ends of a finding's range:
- `predicted_us` (the headline): the kernel keeps the fraction of its attainable roofline it reached
  before (a kernel 3× slower than its bound stays 3× slower than its new one), never below the new
  hardware bound, never slower than it was. A kernel far below its fp32 peak gains its bounds' ratio.
- `reached_us` (the top of the range): the new kernel reaches its attainable roofline, gaining at most
  the peak ratio: what a Tensor Core kernel that is better tuned than the fp32 one gives.
On the H100 (bench/gemm_precision_gpu.py, docs/accuracy.md) large GEMMs land within ~12 % of both; small
and skinny ones between the two (their fp32 SIMT kernels sit 2–4× off their bound, the bf16 ones closer).

Without the shapes the bound is unknown: `unknown_shape_speedup` gives the conservative assumption every
caller states in its basis (the kernel is bound by memory: the operand widths' ratio), and
`peak_speedup` the most a large compute-bound GEMM could gain, for the top of a range.

LATENCY_FLOOR_US = 3.5 µs: the shortest Tensor Core GEMM kernels measured on an H100 (bench/
gemm_precision_gpu.py, CUDA graph of back-to-back matmuls: 512³, 64×1024×1024 and 8×1024×1024 in bf16
took 3.5–3.9 µs; 16×16×16 2.1–4.0 µs on any path), the order of CUDA's kernel launch latency (NVIDIA,
"CUDA C++ Best Practices Guide", kernel launch overhead). A kernel already shorter than the floor keeps
its time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuadvise.analyzer.model.devices import Spec

LATENCY_FLOOR_US = 3.5
# dense large-GEMM efficiency per path: the H100 pairs' forward addmm reached 77 % of the fp32 SIMT peak,
# 78 % of bf16's, 81 % of TF32's (measure/efficiency/precision.py); fp16/fp8 assumed as bf16
COMPUTE_EFFICIENCY = {"fp32": 0.77, "tf32": 0.81, "bf16": 0.78, "fp16": 0.78, "fp8": 0.78}
MEMORY_EFFICIENCY = 0.8  # of the datasheet bandwidth: H100 measured 75 % (TF32) and 83 % (bf16) for 8192×8192×64, 88 % for a copy
OPERAND_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class Bound:
    """The three limits of one kernel, µs."""

    compute_us: float
    memory_us: float
    latency_us: float

    @property
    def us(self) -> float:
        return max(self.compute_us, self.memory_us, self.latency_us)

    @property
    def limiter(self) -> str:
        """"compute", "memory" or "latency": the limit that sets the time."""
        return max((self.compute_us, "compute"), (self.memory_us, "memory"), (self.latency_us, "latency"))[1]


def flops(mkn) -> float:
    batch, m, k, n = mkn
    return 2.0 * batch * m * k * n


def moved_bytes(mkn, dtype: str) -> float:
    """Bytes a GEMM must move at least once: both operands read, the result written, at `dtype`'s width."""
    batch, m, k, n = mkn
    return float(batch * (m * k + k * n + m * n) * OPERAND_BYTES[dtype])


def _limits(mkn, spec: Spec, dtype: str, compute_eff: float, memory_eff: float) -> Bound | None:
    peak = spec.peak(dtype)
    if not peak or mkn is None:
        return None
    compute = flops(mkn) / (peak * compute_eff * 1e6)  # TFLOP/s → FLOP per µs: × 1e6
    memory = moved_bytes(mkn, dtype) / (spec.memory_gbps * memory_eff * 1e3) if spec.memory_gbps else 0.0
    return Bound(compute, memory, LATENCY_FLOOR_US)


def bound(mkn, spec: Spec, dtype: str) -> Bound | None:
    """The hardware's limit for a (batch, M, K, N) GEMM in `dtype` ("fp32" = SIMT): datasheet peak and
    bandwidth. None when the device has no such path or no peak is known."""
    return _limits(mkn, spec, dtype, 1.0, 1.0)


def attainable(mkn, spec: Spec, dtype: str) -> Bound | None:
    """The time a well-tuned kernel takes: the peak at the large-GEMM efficiency, the bandwidth at
    MEMORY_EFFICIENCY, the latency floor."""
    return _limits(mkn, spec, dtype, COMPUTE_EFFICIENCY[dtype], MEMORY_EFFICIENCY)


def speedup(mkn, spec: Spec, dtype: str, current: str = "fp32") -> float | None:
    """How much faster the GEMM's attainable time is in `dtype` than in `current`; None when unknown."""
    old, new = attainable(mkn, spec, current), attainable(mkn, spec, dtype)
    if old is None or new is None:
        return None
    return old.us / new.us


def predicted_us(dur: float, mkn, spec: Spec, dtype: str, current: str = "fp32") -> float | None:
    """A kernel that took `dur` µs in `current`, run in `dtype`: the same fraction of its attainable
    roofline, never below the new hardware bound (nor the latency floor), never slower than today. None
    without the shape or the device's peaks."""
    law = shape_law(mkn, spec, dtype, current)
    return None if law is None else float(apply_law(dur, *law))


def reached_us(dur: float, mkn, spec: Spec, dtype: str, current: str = "fp32") -> float | None:
    """The optimistic end: the kernel in `dtype` reaches its attainable roofline, gaining at most the peak
    ratio; never slower than today. None without the shape or the device's peaks."""
    law = shape_law(mkn, spec, dtype, current, optimistic=True)
    return None if law is None else float(apply_law(dur, *law))


def shape_law(mkn, spec: Spec, dtype: str, current: str = "fp32", optimistic: bool = False) -> tuple | None:
    """What a GEMM's shape sets in `predicted_us` (or `reached_us`, optimistic): the speed-up its time is
    divided by and the time it cannot go below; None without the shape or the device's peaks. Apart from
    the duration, so that many kernels of one shape are worked out at once (`apply_law`)."""
    if optimistic:
        new, peak = attainable(mkn, spec, dtype), peak_speedup(spec, dtype, current)
        return None if new is None or peak is None else (peak, new.us)
    s, hw = speedup(mkn, spec, dtype, current), bound(mkn, spec, dtype)
    return None if s is None or hw is None else (s, hw.us)


def apply_law(dur, divisor: float, floor_us: float):
    """The new duration(s): `dur / divisor`, never below `floor_us` nor the latency floor (or `dur`, when
    shorter), never above `dur`. `dur` a number or an array: the same arithmetic either way."""
    return np.minimum(dur, np.maximum(np.maximum(dur / divisor, floor_us), np.minimum(dur, LATENCY_FLOOR_US)))


def peak_speedup(spec: Spec, dtype: str, current: str = "fp32") -> float | None:
    """The most any GEMM gains: a large compute-bound one, the ratio of the two peaks at their large-GEMM
    efficiencies."""
    new, old = spec.peak(dtype), spec.peak(current)
    if not new or not old:
        return None
    return new * COMPUTE_EFFICIENCY[dtype] / (old * COMPUTE_EFFICIENCY[current])


def unknown_shape_speedup(dtype: str, current: str = "fp32") -> float:
    """The conservative speed-up when the shape is unknown: the kernel is taken as bound by its memory
    traffic, which the fix shrinks by the ratio of the operand widths (bf16 2×, fp8 4×, TF32 1×)."""
    return OPERAND_BYTES[current] / OPERAND_BYTES[dtype]

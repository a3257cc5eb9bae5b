"""What a GPU kernel is, from its name: communication, GEMM/conv, and whether it uses Tensor Cores.

Kernel names are the only precision signal a trace always has. The patterns below were checked token
by token against every GEMM/conv kernel name in shared/traces (V100/A100/H100/H800/B200 cuBLAS and
cuBLASLt `nvjet`, cuBLAS 13 `sm80_xmma_*`, CUTLASS, cuDNN, Triton, AMD Tensile/hipBLASLt, CK and
MIOpen; tests/test_kernels.py keeps a table of them) and against the TensorBoard plugin's (stale) list.
A family name is not a precision: `xmma` and `sm80_` kernels run on the CUDA cores when their name says
`ffma` (cuBLAS 13 on an H100 picks `sm80_xmma_gemm_f32f32_f32f32_f32_*_ffma_*` for fp32 GEMMs without
TF32), so SIMT evidence is checked first and Tensor Cores need an MMA shape, an MMA family (`tensorop`,
`wgmma`, `nvjet`, `mfma`, ...) or a 16/8-bit or TF32 operand type.

The tests below are pure functions of the name and each rule asks them about the same few hundred names:
each answer is kept per name (functools.lru_cache).
"""

from __future__ import annotations

import functools
import re


COMM = re.compile(r"nccl|rccl|^ncclDevKernel|all_?reduce|all_?gather|reduce_?scatter|alltoall", re.I)

# Names are matched on their head: the kernel's own name and template arguments, never its parameter
# list (`bounds_check_indices_kernel(... fbgemm_gpu::...)` is not a GEMM because an argument type says gemm).

# Matrix-multiply, convolution and attention kernels (the work Tensor Cores / matrix cores accelerate).
GEMM = re.compile(
    r"(?<!fb)gemm|cutlass|nvjet|xmma|wgmma|gmma|Cijk_|matmul|_mm_|bmm|xdl|"
    r"Kernel2.*MT\d|triton_tem_fused_.*mm|fmha|flash_(fwd|bwd)|flash_attn|_sdpa_",
    re.I,
)
# `conv` but not `convert`: cuDNN's convert_dq_to_16bits is a cast.
CONV = re.compile(r"conv(?!ert)|wgrad|dgrad|fprop|implicit_gemm|igemm|winograd|fft2d_|scudnn|precomputed_convolve", re.I)
# Kernels that live next to GEMMs/convs but do no matrix math: cuDNN batch-norm and layout kernels,
# split-K reductions and epilogues, workspace and offset set-up, im2col, embeddings (fbgemm), BLAS-1/2
# (dot, scal, gemv: memory-bound, Tensor Cores do not help) and Triton pointwise/reduction kernels whose
# names list the ops they fused (…_convolution_… there is the op the kernel sits next to).
NOT_MATMUL = re.compile(
    r"\bbn_|batch_?norm|nchwToNhwc|nhwcToNchw|pooling|softmax|elementwise|"
    r"splitKreduce|ReduceSplitK|reduction::kernel|epilogue::impl|init_device_workspace|compute\w*Offsets|"
    r"im2col|reduce_wgrad|bounds_check|fbgemm_gpu::|embedding|transpose_readWrite|scal_kernel|dot_kernel|"
    r"reduce_1Block|(?<![A-Za-z])gemv|^triton_(poi|red|per)_|_FP8rowwise|_FP8_q|FP8_quantize",
    re.I,
)

# SIMT evidence wins over everything else: cuBLAS/cuDNN kernels say `ffma` (fp32) or `hfma` (fp16) when
# they run on the CUDA cores, whatever family (`xmma`, `sm80_`) they belong to; CUTLASS says `simt`.
SIMT = re.compile(
    r"ffma|hfma|simt|sgemm|scudnn|dgemm|gcgemm|cgemm|gemmSN|gemmk1|magma_s|"
    r"convolve_sgemm|convolve_common_engine|wgrad_alg\d|dgrad_alg\d|dgrad_engine|dgrad2d_|"
    r"fmha_cutlass\w_f32\w*_sm[567]\d",
    re.I,
)
# Tensor Core / matrix core evidence: MMA shapes and instruction families, a 16-bit/8-bit/TF32 operand
# type, the Hopper/Blackwell GEMM families, AMD MFMA/XDL (Tensile `MI16x16x1`, CK `xdl`).
TENSOR_CORE = re.compile(
    r"h884|s884|h1688|s1688|i8816|hmma|16816|161616|1688|884gemm|tensorop|wgmma|gmma|nvjet|tensor\d+x\d+x\d+|"
    r"tf32|bf16|bfloat16|fp16|f16|half|e4m3|e5m2|fp8|mxfp|int8|i8i8|_4xi8|_F8|"
    r"mfma|xdl|_MI\d+x\d+|_HHS_|_BBS_|_HSS_|_BSS_|_B_BS_|_HH_|_BB_|"
    r"fmha|flash|_sdpa_|first_layer_wgrad|dgrad_1x1_stride_2x2|conv1x1|direct_group",
    re.I,
)
SIXTEEN_BIT = re.compile(r"bf16|bfloat16|fp16|f16|half|__nv_bfloat16|__half", re.I)


@functools.lru_cache(maxsize=1 << 14)
def head(name: str) -> str:
    """The kernel's name and template arguments, without its parameter list."""
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            return name[:i]
    return name


@functools.lru_cache(maxsize=1 << 14)
def is_comm(name: str) -> bool:
    return bool(COMM.search(name))


@functools.lru_cache(maxsize=1 << 14)
def is_matmul_like(name: str) -> bool:
    h = head(name)
    if is_comm(h) or h.startswith(("Memcpy", "Memset")) or NOT_MATMUL.search(h):
        return False
    return bool(GEMM.search(h) or CONV.search(h))


@functools.lru_cache(maxsize=1 << 14)
def uses_tensor_cores(name: str) -> bool:
    h = head(name)
    return not SIMT.search(h) and bool(TENSOR_CORE.search(h))


@functools.lru_cache(maxsize=1 << 14)
def precision_class(name: str) -> str:
    """'tensor-core', 'fp32-simt', 'simt' (CUDA cores on 16-bit data) or 'other' for a GEMM/conv kernel name."""
    h = head(name)
    if SIMT.search(h):
        return "simt" if SIXTEEN_BIT.search(h) else "fp32-simt"
    if TENSOR_CORE.search(h):
        return "tensor-core"
    # cuDNN/cuBLAS kernels without any Tensor Core token (e.g. volta_gcgemm_*, old cuDNN engines) run on
    # the CUDA cores.
    if h.startswith("triton_"):  # tl.dot picks TF32/bf16/fp32 at compile time: the name cannot tell
        return "other"
    return "fp32-simt" if CONV.search(h) or GEMM.search(h) else "other"


# -- compiled work (torch.compile / Inductor) ------------------------------------------------------------
# Inductor names its generated Triton kernels by kind: pointwise, reduction, persistent reduction,
# templated GEMM/conv (`triton_tem_…`); C++ kernels on the CPU are `cpp_fused_…`. The compiled region
# itself is a CPU span: dynamo's `Torch-Compiled Region: 0/0`, AOTAutograd's `CompiledFunction`
# (and `CompiledFunctionBackward`), Inductor's `## Call CompiledFxGraph <hash>` annotation. CUDA-graph
# launches are `calls.GRAPH_LAUNCHES`.
INDUCTOR_KERNEL = re.compile(r"^(triton_(poi|red|per|tem|for)_|cpp_fused_)")
COMPILED_REGION = re.compile(r"^(Torch-Compiled Region|CompiledFunction(Backward)?$|## Call CompiledFxGraph)")

_INDUCTOR_KINDS = {"poi": "pointwise", "red": "reduction", "per": "persistent reduction", "tem": "template GEMM",
                   "for": "foreach"}


def inductor_kind(name: str) -> str | None:
    """What an Inductor-generated kernel does, from its name; None for every other kernel."""
    m = INDUCTOR_KERNEL.match(name)
    if not m:
        return None
    return _INDUCTOR_KINDS.get(m.group(2), "C++ fused") if m.group(2) else "C++ fused"


def is_compiled_region(name: str) -> bool:
    return bool(COMPILED_REGION.match(name))

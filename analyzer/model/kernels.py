"""What a GPU kernel is, from its name: communication, GEMM/conv, and whether it uses Tensor Cores.

Kernel names are the only precision signal a trace always has. The patterns below were checked on the
real traces in shared/traces (V100/A100/H100/H800/B200 cuBLAS, cuBLASLt `nvjet`, CUTLASS, cuDNN, Triton,
AMD Tensile/hipBLASLt and MIOpen) and against the TensorBoard plugin's (stale) list.
"""

from __future__ import annotations

import re

from .trace import Device

COMM = re.compile(r"nccl|rccl|^ncclDevKernel|all_?reduce|all_?gather|reduce_?scatter|alltoall", re.I)

# Matrix-multiply and convolution kernels (the work Tensor Cores / matrix cores accelerate).
GEMM = re.compile(
    r"gemm|gemv|cublas|cutlass|nvjet|xmma|wgmma|gmma|Cijk_|matmul|_mm_|bmm|hgemm|sgemm|dgemm|"
    r"Kernel2.*MT\d|triton_tem_fused_.*mm",
    re.I,
)
# Plain "cudnn"/"miopen" is not enough: batch-norm and layout kernels (bn_fw_tr_1C11, nchwToNhwc) live there too.
CONV = re.compile(r"conv|wgrad|dgrad|fprop|implicit_gemm|igemm|winograd|fft2d_|scudnn|precomputed_convolve", re.I)
NOT_MATMUL = re.compile(r"\bbn_|batch_?norm|nchwToNhwc|nhwcToNchw|pooling|softmax|elementwise", re.I)

# Tensor Core / matrix core evidence in a GEMM or conv kernel name.
TENSOR_CORE = re.compile(
    r"h884|s884|h1688|s1688|i8816|hmma|16816|1688|884gemm|tensorop|xmma|wgmma|gmma|nvjet|"
    r"_tf32|tf32|bf16|fp16|f16|half|e4m3|e5m2|fp8|int8|i8i8|mfma|_MI\d+x\d+|"
    r"sm90|sm100|sm80_xmma|fmha|flash|first_layer_wgrad|dgrad_1x1_stride_2x2|conv1x1|direct_group|"
    r"_HHS_|_BBS_|_HSS_|_BSS_|_4xi8|_F8",
    re.I,
)
# fp32 SIMT kernels (no Tensor Cores): cuBLAS sgemm, cuDNN scudnn, CUTLASS simt, Tensile fp32.
FP32_SIMT = re.compile(r"sgemm|scudnn|simt|gemmSN|gemv2T|gemvNSP|<float>|_SB_|_SS_|fp32|float", re.I)


def is_comm(name: str) -> bool:
    return bool(COMM.search(name))


def is_matmul_like(name: str) -> bool:
    if is_comm(name) or name.startswith(("Memcpy", "Memset")) or NOT_MATMUL.search(name):
        return False
    return bool(GEMM.search(name) or CONV.search(name))


def uses_tensor_cores(name: str) -> bool:
    return bool(TENSOR_CORE.search(name))


def precision_class(name: str) -> str:
    """'tensor-core', 'fp32-simt' or 'other' for a GEMM/conv kernel name."""
    if uses_tensor_cores(name):
        return "tensor-core"
    if FP32_SIMT.search(name):
        return "fp32-simt"
    # cuDNN/cuBLAS kernels without any TC token (e.g. volta_gcgemm_*, implicit_convolve_sgemm) are SIMT.
    return "fp32-simt" if CONV.search(name) or GEMM.search(name) else "other"


ARCH_FROM_NAME = [
    (re.compile(r"sm100|blackwell|fmhaSm100", re.I), (10, 0)),
    (re.compile(r"sm90|hopper|nvjet", re.I), (9, 0)),
    (re.compile(r"ampere|sm80|sm86", re.I), (8, 0)),
    (re.compile(r"turing|sm75", re.I), (7, 5)),
    (re.compile(r"volta|sm70", re.I), (7, 0)),
    (re.compile(r"maxwell|pascal|sm6\d", re.I), (6, 0)),
]


def has_matrix_units(device: Device | None, platform: str, kernel_names) -> bool | None:
    """Whether the GPU has Tensor Cores / matrix cores: True, False, or None when we cannot tell."""
    if device is not None and device.compute_major is not None and device.vendor == "nvidia":
        return device.compute_major >= 7
    if device is not None and device.vendor == "amd":
        n = device.name.lower()
        if "instinct" in n or re.search(r"\bmi\d{3}", n):
            return True  # CDNA (MI100 and later) has matrix cores
        return None
    if device is not None and device.name:
        n = device.name.lower()
        if re.search(r"v100|t4|a100|a10|a30|a40|h100|h800|h200|b200|l4|l40|rtx|titan v", n):
            return True
        if re.search(r"p100|gp100|p40|p4|k80|m40|gtx 10", n):
            return False
    for name in kernel_names:
        for pattern, cc in ARCH_FROM_NAME:
            if pattern.search(str(name)):
                return cc[0] >= 7
    return None

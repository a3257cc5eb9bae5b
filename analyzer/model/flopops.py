"""The ops whose work is matrix math, and where their arguments sit: the matmul family, convolutions
(forward and backward, every backend op PyTorch dispatches to) and attention (every
`scaled_dot_product_attention` backend, forward and backward, and the flash-attn library's ops).

One table, read by three stages: the reader keeps the shapes, dtypes and scalar arguments of these ops
(`record_shapes=True`; analyzer/read/columns.py), `gpuadvise profile`'s shapes probe copies them into the
recorded window (gpuadvise/harness/facts/shapes.py), and measure/efficiency/flops.py counts their FLOPs from them.

Each op's `Signature` says where its tensors and the scalars its FLOPs depend on sit in its argument
list, as PyTorch's native_functions.yaml declares it (the trace records arguments positionally:
`Input Dims` for tensors, `Concrete Inputs` for scalars and int lists). `layout` is how an attention op's
q/k/v are laid out: "bhsd" (batch, heads, sequence, head dim: the SDPA ops and cuDNN's) or "bshd" (the
flash and memory-efficient kernels' own ops, and the flash-attn library's). `causal` is the index of
the is_causal flag, or of the memory-efficient kernel's `custom_mask_type` (0 none, 1 causal from the
top left, 2 from the bottom right) when `mask_type` is set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .collectives import SIZED_CALLS


@dataclass(frozen=True)
class Signature:
    family: str  # "matmul", "conv", "attention"
    backward: bool = False  # a backward op (its FLOPs are the gradients'); matmuls run in either pass
    # matmul: the two operands; conv: input and weight (and grad_output first for the backward)
    tensors: tuple[int, ...] = ()
    # conv: the scalars its output shape depends on (None: not an argument of this op)
    stride: int | None = None
    padding: int | None = None
    dilation: int | None = None
    transposed: int | bool | None = False  # an index (aten::convolution's flag) or the op's own kind
    output_padding: int | None = None
    groups: int | None = None
    output_mask: int | None = None  # convolution_backward: which gradients it computes
    # attention
    layout: str = "bhsd"
    causal: int | None = None
    mask_type: bool = False  # `causal` indexes custom_mask_type (memory-efficient kernel), not a flag
    bottom_right: bool = False  # is_causal aligns the mask at the bottom right (flash-attn library)
    grad_out: int | None = None  # backward attention: where grad_output sits (q, k, v follow it)


def _mm(*tensors: int) -> Signature:
    return Signature("matmul", tensors=tensors)


def _conv(stride, padding, dilation, transposed=False, output_padding=None, groups=None) -> Signature:
    return Signature("conv", tensors=(0, 1), stride=stride, padding=padding, dilation=dilation,
                     transposed=transposed, output_padding=output_padding, groups=groups)


def _attn(causal: int | None, layout: str = "bhsd", **kw) -> Signature:
    return Signature("attention", layout=layout, causal=causal, **kw)


def _attn_bwd(causal: int | None, layout: str = "bhsd", **kw) -> Signature:
    return Signature("attention", backward=True, layout=layout, causal=causal, grad_out=0, **kw)


SIGNATURES: dict[str, Signature] = {
    # matmuls: 2·M·K·N per product
    "aten::mm": _mm(0, 1),
    "aten::addmm": _mm(1, 2),
    "aten::_addmm_activation": _mm(1, 2),
    "aten::bmm": _mm(0, 1),
    "aten::baddbmm": _mm(1, 2),
    "aten::_scaled_mm": _mm(0, 1),
    "aten::matmul": _mm(0, 1),
    "aten::linear": _mm(0, 1),
    # einsum: the equation is a string argument, which the profiler does not record; its FLOPs are
    # counted on the bmm/mm it calls
    "aten::einsum": Signature("matmul"),
    # convolutions, forward: the composite ops and each backend's own
    "aten::conv1d": _conv(3, 4, 5, groups=6),
    "aten::conv2d": _conv(3, 4, 5, groups=6),
    "aten::conv3d": _conv(3, 4, 5, groups=6),
    "aten::conv_transpose1d": _conv(3, 4, 7, True, 5, 6),
    "aten::conv_transpose2d": _conv(3, 4, 7, True, 5, 6),
    "aten::conv_transpose3d": _conv(3, 4, 7, True, 5, 6),
    "aten::convolution": _conv(3, 4, 5, 6, 7, 8),
    "aten::_convolution": _conv(3, 4, 5, 6, 7, 8),
    "aten::cudnn_convolution": _conv(3, 2, 4, groups=5),
    "aten::cudnn_convolution_transpose": _conv(4, 2, 5, True, 3, 6),
    "aten::cudnn_convolution_relu": _conv(3, 4, 5, groups=6),
    "aten::cudnn_convolution_add_relu": _conv(5, 6, 7, groups=8),
    "aten::miopen_convolution": _conv(4, 3, 5, groups=6),
    "aten::miopen_convolution_transpose": _conv(5, 3, 6, True, 4, 7),
    "aten::miopen_depthwise_convolution": _conv(4, 3, 5, groups=6),
    "aten::mkldnn_convolution": _conv(4, 3, 5, groups=6),
    "aten::_slow_conv2d_forward": _conv(4, 5, None),
    "aten::slow_conv3d_forward": _conv(4, 5, None),
    "aten::slow_conv_dilated2d": _conv(4, 5, 6),
    "aten::slow_conv_dilated3d": _conv(4, 5, 6),
    "aten::slow_conv_transpose2d": _conv(4, 5, 7, True, 6),
    "aten::slow_conv_transpose3d": _conv(4, 5, 7, True, 6),
    "aten::_conv_depthwise2d": _conv(4, 5, 6),
    "aten::conv_depthwise3d": _conv(4, 5, 6),
    "aten::_nnpack_spatial_convolution": _conv(4, 3, None),
    # convolutions, backward: grad_output, input, weight, then the forward's arguments and the mask
    "aten::convolution_backward": Signature("conv", backward=True, tensors=(0, 1, 2), stride=4, padding=5,
                                            dilation=6, transposed=7, output_padding=8, groups=9, output_mask=10),
    # attention: what scaled_dot_product_attention dispatched to (the composite op itself picks a backend
    # and has no formula of its own: the math backend's bmm/matmul ops carry its FLOPs)
    "aten::_scaled_dot_product_flash_attention": _attn(4),
    "aten::_scaled_dot_product_flash_attention_backward": _attn_bwd(11),
    "aten::_scaled_dot_product_efficient_attention": _attn(6),
    "aten::_scaled_dot_product_efficient_attention_backward": _attn_bwd(11),
    "aten::_scaled_dot_product_cudnn_attention": _attn(6),
    "aten::_scaled_dot_product_cudnn_attention_backward": _attn_bwd(14),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attn(4),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _attn_bwd(7),
    "aten::_scaled_dot_product_fused_attention_overrideable": _attn(5),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": _attn_bwd(13),
    # ... and the kernels' own ops inside them
    "aten::_flash_attention_forward": _attn(8, "bshd"),
    "aten::_flash_attention_backward": _attn_bwd(11, "bshd"),
    "aten::_efficient_attention_forward": _attn(9, "bshd", mask_type=True),
    "aten::_efficient_attention_backward": _attn_bwd(14, "bshd", mask_type=True),
    "aten::_cudnn_attention_forward": _attn(10),
    "aten::_cudnn_attention_backward": _attn_bwd(14),
    # the flash-attn library (Dao-AILab/flash-attention), registered as torch ops
    "flash_attn::_flash_attn_forward": _attn(5, "bshd", bottom_right=True),
    "flash_attn::_flash_attn_backward": _attn_bwd(11, "bshd", bottom_right=True),
}

# The SDPA call and its math backend: no formula (the ops they call carry the FLOPs), but `unfused-attention`
# reads their arguments (an explicit `attn_mask`, the dtype, the head dim).
ATTENTION_CALLS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math")
# Ops the reader keeps shapes and arguments for: those above, ATTENTION_CALLS, and the other ops the rules read
# shapes of (every convolution and matmul spelling: `cudnn-benchmark`, `matmul-alignment`).
_OTHER_SHAPED = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|conv|convolution|cudnn_conv|"
                           r"_convolution)")


def shaped(name: str) -> bool:
    """Whether the reader keeps this op's shapes, dtypes and scalar arguments (and the c10d calls whose
    tensors say their process group's size: model/collectives.SIZED_CALLS)."""
    return name in SIGNATURES or name in ATTENTION_CALLS or bool(_OTHER_SHAPED.match(name)) or name in SIZED_CALLS


def family(name: str) -> str | None:
    sig = SIGNATURES.get(name)
    return sig.family if sig is not None else None

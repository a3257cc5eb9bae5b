"""channels-last: convolutions convert NCHW tensors to NHWC and back around every call.

## What it detects
Layout-conversion kernels launched by convolution ops: cuDNN's `nchwToNhwcKernel` / `nhwcToNchwKernel`
and `convertTensor_kernel`, MIOpen's `batched_transpose_*` / `general_4d_reorder_*` /
`transpose_NCHW2NHWC` (analyzer/measure/efficiency/layout.py). A conversion counts only when its External id (or
its launch call's) is a convolution op's (`aten::cudnn_convolution`, `aten::convolution_backward`,
`aten::miopen_convolution`, …), so another library's transpose is never blamed on a convolution. The
finding names the convolutions (op and input shape) that convert the most.

## Why it matters
The fastest Tensor Core convolution kernels of cuDNN and MIOpen read and write NHWC (channels last).
PyTorch tensors are NCHW (contiguous) by default, so each convolution first converts its input (and its
weights, in the backward pass its gradients) to NHWC and its output back: pure memory traffic, on the
GPU's critical path. On the H100 convnet traces here they take 17–19 % of all kernel time; with the
model and its inputs in `channels_last`, the convolutions read the tensors as they are and the
conversions disappear.

## Fix
```python
model = model.to(memory_format=torch.channels_last)   # once, before torch.compile and the optimizer
for x, y in loader:
    x = x.to("cuda", memory_format=torch.channels_last, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # channels_last works under AMP too
        loss = criterion(model(x), y)
```
Convert the inputs as well as the model: a channels-last model fed NCHW batches converts the first
layer's input every step. Batch norm, ReLU and pooling keep the layout, so nothing else changes.

## Thresholds
Fires when the conversion kernels launched by convolutions take at least 5 % of the median step's kernel
time (the median step's conversion time over its kernel time; below that the conversions are a negligible
share). The predicted saving is the critical-path replay of the steps with those kernels and their launch
calls removed and the batch-norm kernels that ran on NCHW tensors at the time of cuDNN's (on AMD,
MIOpen's) NHWC batch-norm kernels, which pass over memory fewer times: 2/3 of the forward's time
(activation read once instead of twice, written once), 3/5 of the backward's (activation and gradient
read once instead of twice, input gradient written once); the range starts at the conversions alone. Convolution kernels that get faster
on NHWC tensors are not counted. Measured on an H100 (ResNet-50, batch 64, torch 2.11;
bench/h100-pairs): channels_last saved 24.8 % in fp32 and 36.0 % under bf16 autocast, where PyTorch's
own NCHW batch-norm kernels are slower still (docs/accuracy.md has the predictions). Where the GPU waits
for something else (the input pipeline), the saving is small today and the finding says what the step is
bound by.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.efficiency import layout
from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.settings.switches_on import compiled_evidence, is_on
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule

TO_NHWC = ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
           "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)")
TO_NCHW = ("void cudnn::engines_precompiled::nhwcToNchwKernel<float, float, float, false, true, "
           "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nhwc2nchw_params_t<float>, float const*, float*)")
FPROP = "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn"
DGRAD = "sm90_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn"
WGRAD = "sm90_xmma_wgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn"
BN = "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>"


class ChannelsLast(Rule):
    code = "GA112"
    name = "channels-last"
    title = "Convolutions convert NCHW tensors to NHWC and back (no channels_last)"
    thresholds = {"min_pct_of_kernel_time": 5.0}

    def check(self, a: Analysis):
        model, m = a.model, a.metrics
        conv = layout.conversions(model)
        if not len(conv) or m.per_step.empty:
            return []
        if is_on("channels_last", a) is not None:  # NHWC convolutions without conversions: nothing to ask
            return []
        conv_us = perstep.sums(m, conv["ts"], conv["dur"])
        kernel_us = m.per_step["kernel_us"].to_numpy(float)
        per_step_us = perstep.median(conv_us)
        of_kernels = 100.0 * per_step_us / max(perstep.median(kernel_us), 1e-9)
        if of_kernels < self.thresholds["min_pct_of_kernel_time"]:
            return []
        of_step = 100.0 * per_step_us / max(m.median_step_us, 1e-9)
        count = perstep.median(perstep.sums(m, conv["ts"]))
        corr = set(conv["correlation"].to_numpy().tolist())
        bn = layout.batch_norm_kernels(model)
        bn_scale = dict(zip(bn["correlation"].to_numpy().tolist(), bn["passes"].to_numpy().tolist()))
        bn_us = perstep.median(perstep.sums(m, bn["ts"], bn["dur"])) if len(bn) else 0.0

        def scale(ops):
            c = ops["correlation"]
            return np.where(c.isin(corr).to_numpy(), 0.0, c.map(bn_scale).fillna(1.0).to_numpy(float))

        def launches(calls):
            return calls["correlation"].isin(corr).to_numpy()

        conversions_only, _ = a.predicted_saving(Scenario(
            "the layout-conversion kernels and their launches removed", remove=launches,
            gpu_scale=lambda ops: np.where(ops["correlation"].isin(corr).to_numpy(), 0.0, 1.0)))
        saving, basis = a.predicted_saving(Scenario(
            "the layout-conversion kernels and their launches removed, batch norm at its NHWC kernels' passes "
            "over memory (model and inputs in channels_last)", remove=launches, gpu_scale=scale))
        if saving is None:
            saving, basis = 0.0, "not predicted: the trace has no GPU timeline to replay"
        span = (conversions_only, saving) if conversions_only is not None and bn_us > 0 else None
        by_dir = conv.assign(direction=[layout.direction(str(n)) for n in conv["name"]])
        split = ", ".join(f"{perstep.count_text(perstep.median(perstep.sums(m, g['ts'])))} "
                          + (d if d != "layout conversion" else "whose names do not say the direction")
                          for d, g in by_dir.groupby("direction", sort=True))
        if m.steps:
            step = perstep.the_median_step(m)
            message = (f"Convolutions convert between NCHW and NHWC: {perstep.a_median(m)}"
                       f"{perstep.count_of(count, 'conversion kernel')} per step ({split}) take {per_step_us / 1e3:.2f} ms, "
                       f"{of_kernels:.1f} % of {step}'s kernel time and {of_step:.1f} % of {step}.")
        else:  # no ProfilerStep: the traced window is the one "step"
            message = (f"Convolutions convert between NCHW and NHWC: {perstep.count_of(count, 'conversion kernel')} "
                       f"in the trace ({split}) take {per_step_us / 1e3:.2f} ms, {of_kernels:.1f} % of the kernel time "
                       f"and {of_step:.1f} % of the traced window.")
        if bn_us > 0:
            message += (f" Batch norm runs its NCHW kernels beside them ({bn_us / 1e3:.2f} ms "
                        f"{'per step' if m.steps else 'in the trace'}); in "
                        f"channels_last it runs {_library(a)}'s NHWC kernels, which pass over memory fewer times.")
        if saving < 1.0:
            message += f" Little of it is on the step's critical path today: {a.bound_by()}."
        ops = by_dir.assign(op=[o or "(no op recorded)" for o in by_dir["op"]],
                            shape=[_shape(d) for d in by_dir["op_dims"]])
        top = (ops.groupby(["op", "shape"], sort=False, observed=True)["dur"].agg(["size", "sum"])
               .sort_values("sum", ascending=False).head(6))
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            items=[{"name": op, "input_shape": shape, "conversions": int(r["size"]),
                    "total_ms": round(float(r["sum"]) / 1e3, 3)} for (op, shape), r in top.iterrows()],
            numbers={"conversion_pct_of_kernel_time": round(of_kernels, 1),
                     "conversion_pct_of_step": round(of_step, 1),
                     "conversion_ms_per_step": round(per_step_us / 1e3, 3),
                     "conversions_per_step": round(count, 1),
                     "nchw_batch_norm_ms_per_step": round(bn_us / 1e3, 3),
                     "conversions_alone_saving_pct": None if conversions_only is None else round(conversions_only, 1),
                     "statistic": "median step" if m.steps else "traced window"},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, range_pct=span,
                             advice=_advice(a), fix=_fix(a))]

    def positive(self) -> TraceBuilder:
        return _convnet(channels_last=False)

    def negative(self) -> TraceBuilder:
        return _convnet(channels_last=True)  # the same convnet in channels_last: NHWC kernels, no conversions


def _shape(dims: str) -> str:
    """The op's first input shape, in people's words ("64×3×224×224"), or "not recorded"."""
    dims = (dims or "").strip()
    if not dims.startswith("[["):
        return "not recorded"
    first = dims[2:].split("]", 1)[0]
    return "×".join(p.strip() for p in first.split(",") if p.strip()) or "not recorded"


def _advice(a: Analysis) -> str:
    text = ("Put the model and its inputs in channels_last (`model.to(memory_format=torch.channels_last)`, and "
            "each batch `x.to(device, memory_format=torch.channels_last)`): the convolutions then read NHWC "
            "tensors as they are.")
    if compiled_evidence(a) or is_on("compile", a) is not None:
        text += " Convert the model before `torch.compile` sees it: the compiled graph keeps the layout."
    if is_on("autocast", a) is not None:
        text += " channels_last works under autocast too: keep your autocast region as it is."
    return text


def _fix(a: Analysis) -> str:
    """The Fix block with the autocast line only when the run is not under autocast already, in the 16-bit type
    the GPU's Tensor Cores take (fp16 on Volta and Turing, bf16 elsewhere)."""
    amp = is_on("autocast", a) is not None
    lines = ["```python",
             "model = model.to(memory_format=torch.channels_last)   # once, before torch.compile and the optimizer",
             "for x, y in loader:",
             "    x = x.to(\"cuda\", memory_format=torch.channels_last, non_blocking=True)"]
    if amp:
        lines.append("    loss = criterion(model(x), y)                   # your autocast region stays as it is")
    else:
        spec = a.device_spec
        if spec.fp16 is not None and spec.bf16 is None:  # fp16-only Tensor Cores (Volta, Turing): fp16, scaled
            lines += ["    with torch.autocast(\"cuda\", dtype=torch.float16):  # channels_last works under AMP too "
                      "(with a GradScaler)",
                      "        loss = criterion(model(x), y)"]
        else:
            lines += ["    with torch.autocast(\"cuda\", dtype=torch.bfloat16):  # channels_last works under AMP too",
                      "        loss = criterion(model(x), y)"]
    lines += ["```", "Convert the inputs as well as the model: a channels-last model fed NCHW batches converts the "
              "first layer's input every step. Batch norm, ReLU and pooling keep the layout."]
    return "\n".join(lines)


def _library(a: Analysis) -> str:
    """The convolution library in the GPU's vendor's name: MIOpen on AMD (a device the trace does not name
    included: its runtime calls or kernels say), cuDNN elsewhere."""
    return "MIOpen" if a.vendor == "amd" else "cuDNN"


def _convnet(channels_last: bool) -> TraceBuilder:
    """Four steps of a small fp32 convnet on an H100: three convolutions forward and backward, batch norm
    between them; NCHW tensors make cuDNN convert around each convolution, channels_last does not."""
    b = TraceBuilder(device="NVIDIA H100 80GB HBM3", compute=(9, 0))
    for step in range(4):
        with b.step():
            b.idle(200)
            for ch in (3, 64, 128):
                dims = [[64, ch, 56, 56], [64, ch, 3, 3], [], [], [], [], [], [], []]
                with b.op("aten::conv2d", **{"Input Dims": dims}):
                    with b.op("aten::cudnn_convolution", **{"Input Dims": dims[:2]}):
                        if not channels_last:
                            b.kernel(TO_NHWC, 120)
                        b.kernel(FPROP, 400)
                        if not channels_last:
                            b.kernel(TO_NCHW, 120)
                with b.op("aten::cudnn_batch_norm"):
                    b.kernel(BN, 90)
            for _ in range(3):
                with b.op("aten::convolution_backward"):
                    if not channels_last:
                        b.kernel(TO_NHWC, 120)
                    b.kernel(DGRAD, 450)
                    b.kernel(WGRAD, 450)
                    if not channels_last:
                        b.kernel(TO_NCHW, 120)
            b.sync()
    b.finish()
    return b


RULE = ChannelsLast()

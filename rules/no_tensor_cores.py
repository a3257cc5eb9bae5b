"""no-tensor-cores: matmul and convolution time spent in fp32 SIMT kernels on a GPU with Tensor Cores.

## What it detects
GEMM and convolution kernels whose names show plain fp32 arithmetic (`sgemm`, `scudnn`, CUTLASS
`simt`, cuDNN `<float>` engines, Tensile `_SB_`) on a GPU that has Tensor Cores (NVIDIA compute
capability 7.0+) or matrix cores (AMD Instinct). Kernels with TF32 (`tensorop`, `s1688`, `xmma`,
`tf32`), fp16/bf16 (`hmma`, `16816`, `bf16`), `nvjet`, `wgmma`/`gmma`, FP8 or MFMA in their names use
them. The device table (analyzer/model/devices.py) decides which fixes exist: TF32 from Ampere on (never
on Volta or Turing, which get fp16), bf16 from Ampere and CDNA 2, fp8 on Ada, Hopper, Blackwell and
CDNA 3 when an fp8 library (Transformer Engine, torchao float8) is in use. GPUs without matrix units
(Pascal and older) are never told to use them.

## Why it matters
Tensor Cores run matrix math many times faster than the fp32 SIMT pipeline: dense bf16 on an H100 is
989 TFLOP/s against 67 TFLOP/s of fp32 (14.8×), TF32 495 (7.4×); on an A100 16× and 8×; on a GeForce
RTX 4090 bf16 is 2×, TF32 1×. Under autocast the memory-bound kernels around the matmuls (activations,
their gradients) also move half the bytes. When matmuls and convolutions dominate GPU time, leaving them
on SIMT leaves most of the GPU unused.

## Fix
```python
# Any Tensor Core GPU: automatic mixed precision (bf16 from Ampere on; fp16 + GradScaler on V100/T4)
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = model(x).loss
# Ampere and newer, one line, no other change: TF32 for fp32 matmuls/convs (the matmuls only)
torch.set_float32_matmul_precision("high")
torch.backends.cudnn.allow_tf32 = True
```
With fp16 use `torch.amp.GradScaler("cuda")` and keep matrix dimensions multiples of 8.

## Thresholds
Fires when fp32 SIMT kernels take at least 50 % of GEMM/conv time and GEMM/conv kernels take at least
10 % of kernel time. Each fix the GPU offers is predicted separately by replaying the steps with the
kernels it changes (analyzer/measure/efficiency/precision.py, constants calibrated on the open H100 pairs). Each
matmul kernel is bounded by its roofline on the device (analyzer/measure/efficiency/roofline.py: FLOPs over the
fix's peak, bytes over the memory bandwidth, a 3.5 µs launch/latency floor), from its op's recorded
shapes: a large GEMM runs the peak ratio faster, a skinny one (M = 8) bound by reading its weight the
ratio of the operand widths (bf16 2×, TF32 1×), a tiny one not at all. Under autocast also the
memory-bound kernels outside the optimizer at 0.6× and the weight casts added. Without shapes the bound
is unknown: the headline takes those kernels as memory-bound (bf16 2×, TF32 1×); the basis says so.
The headline keeps each kernel as far from its roofline as it was in fp32; the top of the range has the
new kernels reach their roofline (at most the peak ratio faster) and takes kernels without shapes as
large GEMMs (the peak ratio). The headline is autocast (the recommended fix); the range spans every fix's low to high end;
`saving_by_fix_pct` has each, `roofline_by_fix` what bounds the kernels with shapes. Without the device
in the table, the kernels are taken as 2× faster (a floor any Tensor Core GPU clears) and the finding
says so. Under 1 % predicted (the matmuls hide behind CPU work) the finding is informational. On an
NVIDIA GPU whose Tensor Cores take fp16 only (Volta, Turing: no bf16, no TF32) the finding's fix is fp16
autocast with its GradScaler, without the bf16 and TF32 lines above.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.efficiency import precision, roofline
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import switches_on

from .base import Rule


class NoTensorCores(Rule):
    code = "GA106"
    name = "no-tensor-cores"
    title = "Matmuls and convolutions run without Tensor Cores"
    costly = True  # (rulequeue.py: taken first)
    thresholds = {"min_simt_share_pct": 50.0, "min_matmul_share_pct": 10.0, "fallback_speedup": 2.0,
                  "min_kernel_us": precision.MIN_KERNEL_US, "min_saving_pct": 1.0}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        kt = m.kernels
        if kt.empty or a.matrix_units is not True:
            return []
        mm = kt[kt["matmul"].astype(bool)]
        mm_us = float(mm["total_us"].sum())
        all_us = float(kt["total_us"].sum())
        simt = mm[mm["precision"] == "fp32-simt"]
        simt_us = float(simt["total_us"].sum())
        if mm_us <= 0 or 100 * simt_us / mm_us < t["min_simt_share_pct"] or 100 * mm_us / all_us < t["min_matmul_share_pct"]:
            return []
        spec = a.device_spec
        dev_name = a.device.name if a.device and a.device.name else "this GPU"
        work = precision.work(a.model, m.launches, set(simt["name"]), a.trains)
        fixes = _fixes(spec, a)
        savings: dict[str, tuple[float | None, float | None]] = {}  # fix → (headline, the range's other end)
        basis = ""
        for key in fixes or ["assumed"]:
            head, basis_head = self._replay(a, work, spec, key, "conservative")
            top = head
            if key != "assumed":  # the kernels reaching their roofline; those without shapes as large GEMMs
                top = self._replay(a, work, spec, key, "optimistic")[0]
            savings[key] = (head, top)
            basis = basis or basis_head  # the replay's own words, from the headline fix
        head_key = (fixes or ["assumed"])[0]
        saving = savings[head_key][0]
        if saving is None:
            saving, basis = 0.0, "no replay possible"
        basis += "; " + _how(spec, work, fixes, savings, t)
        values = [v for pair in savings.values() for v in pair if v is not None]
        span = (min(values), max(values)) if values and max(values) - min(values) > 0.05 else None
        recorded = runfacts.settings(a.facts)
        # advice names the framework's own switch (TrainingArguments, …), never one the run had on
        advice = _advice(spec, dev_name, fixes, savings, saving, runfacts.framework(a.facts), switches_on(a))
        if runfacts.flag(a.facts, "matmul_allow_tf32") is False and "tf32" in fixes:
            advice += " The run had TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`)."
        message = (f"{100 * simt_us / mm_us:.0f}% of matmul/convolution time ({simt_us / 1e3:.1f} ms, "
                   f"{100 * simt_us / all_us:.0f}% of all kernel time) runs in fp32 SIMT kernels that do not use "
                   f"the Tensor Cores {dev_name} has.")
        achieved = work.achieved_tflops()
        evidence = Evidence(
            items=[{"name": r.name, "count": int(r.count), "total_ms": a.ms(r.total_us), "share_pct": round(r.share_pct, 1)}
                   for r in simt.head(8).itertuples()],
            numbers={"simt_share_of_matmul_pct": round(100 * simt_us / mm_us, 1),
                     "matmul_share_of_kernels_pct": round(100 * mm_us / all_us, 1),
                     "tensor_core_matmul_ms": a.ms(mm_us - simt_us), "simt_matmul_ms": a.ms(simt_us),
                     "device_row": spec.describe(), "speedups": {k: spec.speedup(k) or t["fallback_speedup"] for k in savings},
                     "saving_by_fix_pct": {k: round(v, 1) for k, (v, _) in savings.items() if v is not None},
                     "saving_range_by_fix_pct": {k: [round(min(v), 1), round(max(v), 1)] for k, v in savings.items()
                                                 if None not in v},
                     "roofline_by_fix": {k: precision.limits(work, spec, k) for k in fixes},
                     "flops_known_share_pct": round(100 * work.known_share, 1),
                     "simt_achieved_tflops": round(achieved, 1) if achieved is not None else None,
                     "recorded_settings": {k: recorded[k] for k in ("matmul_allow_tf32", "cudnn_allow_tf32",
                                                                    "float32_matmul_precision") if k in recorded}},
        )
        severity = None
        if saving < t["min_saving_pct"]:
            # true, but the matmuls hide behind other work today: faster ones would not shorten the step, so
            # the fix is not advertised with its near-zero figure; the reason is given instead
            severity = "info"
            message += f" Tensor Cores would not shorten the step yet: {a.bound_by()}."
            how = ("bf16 autocast or TF32 (`torch.set_float32_matmul_precision('high')`)" if "tf32" in fixes else
                   "fp16 autocast with a GradScaler" if fixes == ["fp16"] else "autocast")
            advice = ("Not worth changing for step time until the step is bound by these kernels "
                      f"({a.bound_by()}). Once it is, {how} moves them onto the Tensor Cores.")
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             range_pct=span, severity=severity, fix=_fix(spec, fixes))]

    def _replay(self, a: Analysis, work, spec, key: str, end: str) -> tuple[float | None, str]:
        if key == "assumed":
            new = precision.assumed(work, self.thresholds["fallback_speedup"])
            name = f"fp32 SIMT matmul/conv kernels {self.thresholds['fallback_speedup']:g}× faster"
        else:
            new = precision.durations(work, spec, key, end)
            name = f"{LABEL[key]}: matmuls on the matrix units, each bounded by its roofline" + (
                ", memory-bound kernels at half the bytes, weight casts added" if key in precision.AUTOCAST else "")
        return a.predicted_saving(Scenario(name, gpu_time=lambda ops, new=new: precision.apply(new, ops)))

    def positive(self) -> TraceBuilder:
        return _loop("NVIDIA A100-SXM4-80GB", (8, 0), "ampere_sgemm_128x64_nn")

    def negative(self) -> TraceBuilder:
        # the same work on a Pascal GPU: no Tensor Cores to use
        return _loop("Tesla P100-PCIE-16GB", (6, 0), "maxwell_sgemm_128x64_nn")


def _loop(device: str, compute: tuple[int, int], gemm: str) -> TraceBuilder:
    b = TraceBuilder(device=device, compute=compute)
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel(gemm, 800)
                b.kernel("void at::native::vectorized_elementwise_kernel<4, relu>", 40)
            b.sync()
    b.finish()
    return b


RULE = NoTensorCores()


LABEL = {"bf16": "bf16 autocast", "fp16": "fp16 autocast", "tf32": "TF32", "fp8": "fp8 (your fp8 library)",
         "assumed": "Tensor Cores"}


def _fixes(spec, a: Analysis) -> list[str]:
    """The precision fixes this GPU offers, the recommended one first: autocast in the 16-bit type it has,
    TF32 where it exists (never on Volta/Turing), fp8 where it exists and an fp8 library is in use."""
    out = ["bf16" if spec.bf16 else "fp16"] if (spec.bf16 or spec.fp16) else []
    if spec.tf32:
        out.append("tf32")
    if spec.fp8 and precision.fp8_library(a.model):
        out.append("fp8")
    return out


FP16_ONLY_FIX = """```python
# Tensor Cores without bf16 or TF32 (Volta, Turing): fp16 automatic mixed precision with a gradient scaler
scaler = torch.amp.GradScaler("cuda")
with torch.autocast(device_type="cuda", dtype=torch.float16):
    loss = model(x).loss
scaler.scale(loss).backward()
scaler.step(optimizer)
scaler.update()
```
Keep matrix dimensions multiples of 8: fp16 Tensor Cores work on tiles of 8."""


def _fix(spec, fixes: list[str]) -> str | None:
    """The fix block for this GPU: on NVIDIA GPUs whose Tensor Cores take fp16 only (no bf16, no TF32), fp16
    autocast with its GradScaler; elsewhere the general Fix (None)."""
    if fixes == ["fp16"] and spec.vendor != "amd":
        return FP16_ONLY_FIX
    return None


def _how(spec, work, fixes: list[str], savings: dict, t: dict) -> str:
    """The basis after the replay's own words: the device row, what the shapes gave, each fix's figure."""
    if not fixes:
        return (f"the GPU is not in the device table (no name or architecture recorded), so the Tensor Core speedup "
                f"is assumed {t['fallback_speedup']:g}× (real ones are larger)")
    peaks = ", ".join(f"{k} {spec.peak(k):g}" for k in ("fp32", *fixes))
    parts = []
    for k in fixes:
        head, top = savings[k]
        if head is None:
            continue
        parts.append(f"{LABEL[k]} {head:.1f} %" + (f" (up to {top:.1f} % if the new kernels reach their roofline"
                                                  + (" and those without shapes are large GEMMs" if work.known_share < 0.995 else "")
                                                  + ")" if top is not None and top - head > 0.05 else ""))
    memory = f", memory {spec.memory_gbps:g} GB/s" if spec.memory_gbps else ""
    return (f"{spec.describe()} dense peaks (TFLOP/s: {peaks}){memory}; "
            f"{_shapes(spec, work, fixes)}, the memory-bound kernels at "
            f"{precision.AUTOCAST_MEMORY_FACTOR:g}× under autocast{_casts(work, fixes)}: " + ", ".join(parts))


def _shapes(spec, work, fixes: list[str]) -> str:
    """What the roofline says of the kernels with recorded shapes, and what is assumed of the others."""
    known = work.known_share
    achieved = work.achieved_tflops()
    out = []
    if achieved is not None and known > 0:
        head = fixes[0]
        lim = precision.limits(work, spec, head)
        by = ", ".join(f"{v:.0f} % {k}-bound" for k, v in lim["limited_by_pct"].items() if v >= 0.5)
        out.append(f"roofline from recorded shapes for {100 * known:.0f} % of the SIMT matmul time (achieved "
                   f"{achieved:.1f} TFLOP/s fp32, {100 * achieved / spec.fp32:.0f} % of peak; in {head} {by}: "
                   f"{lim['speedup']:g}× faster, against the peak ratio's {lim['peak_speedup']:g}×)")
    if known < 0.995:
        widths = ", ".join(f"{k} {roofline.unknown_shape_speedup(k):g}×" for k in fixes)
        out.append(f"no shapes recorded for {100 * (1 - known):.0f} % of it: its roofline is unknown, so those "
                   f"kernels are taken as memory-bound ({widths}: the operand widths' ratio; record shapes with "
                   "`record_shapes=True` to bound them)")
    return "; ".join(out)


def _casts(work, fixes: list[str]) -> str:
    if not any(k in precision.AUTOCAST for k in fixes):
        return ""
    if work.cast_bytes > 0:
        return f"; autocast's weight casts {work.cast_bytes / 1e9:.2f} GB added"
    return "; autocast's weight casts not counted (no shapes)"


def _advice(spec, dev_name: str, fixes: list[str], savings: dict, saving: float, fw=None, on=None) -> str:
    """`on`: the switches the input shows on (measure/settings/switches_on.py); none of them is asked for again."""
    on = on or {}
    if "autocast" in on and switches.already(fw, "bf16") is None:  # the framework's own words win (below)
        return (f"Autocast is on already ({on['autocast'].source}: {on['autocast'].what}), yet these matmuls ran in "
                "fp32: they run outside the autocast region (called outside `forward`, or forced to float32). "
                "Move them inside it, or cast their inputs to bf16.")
    if not fixes:
        return f"{dev_name} has Tensor Cores: run matmuls in bf16 with `torch.autocast` (or fp16 with a GradScaler)."
    amp = fixes[0]
    if spec.vendor == "amd":
        return f"{dev_name} has matrix cores: run matmuls in {amp} with `torch.autocast` ({saving:.0f} % of the step)."
    if "tf32" not in fixes:
        return (f"{dev_name} ({spec.arch}) has fp16 Tensor Cores but no TF32: use AMP with fp16 "
                f"(`torch.autocast('cuda', dtype=torch.float16)` and a GradScaler; {saving:.0f} % of the step).")
    had = switches.already(fw, "bf16") if amp == "bf16" else None
    if had:  # the framework's autocast left these matmuls in fp32 (where it acted on none, the engine says so first)
        where = ("they run outside the autocast region the framework opens (called outside `forward`, or forced to "
                 f"float32); inside it they save about {saving:.0f} % of the step.")
        advice = f"{had} is set, yet these matmuls ran in fp32: {where}" if "autocast" in on else switches.sentence(where)
    else:
        first = (switches.bf16(fw) if amp == "bf16" and fw is not None else
                 f"run the forward pass under `torch.autocast('cuda', dtype=torch.{'bfloat16' if amp == 'bf16' else 'float16'})`")
        advice = f"{switches.sentence(first)} ({saving:.0f} % of the step)."
    tf32 = savings["tf32"][0] if "tf32" not in on else None  # TF32 on already: not asked for again
    if tf32 is not None and round(tf32) > 0 and fw is not None:
        advice += f" If you cannot change precision that far, {switches.tf32(fw)} (TF32) saves about {tf32:.0f} %."
    elif tf32 is not None and round(tf32) > 0:
        advice += (" If you cannot change precision that far, TF32 is one line, "
                   f"`torch.set_float32_matmul_precision('high')`, and saves about {tf32:.0f} %.")
    elif tf32 is not None and savings["tf32"][1] is not None and round(savings["tf32"][1]) > 0:
        how = switches.tf32(fw) if fw is not None else "`torch.set_float32_matmul_precision('high')`"
        advice += (f" TF32 ({how}) saves up to {savings['tf32'][1]:.0f} % if these "
                   "are large GEMMs; without recorded shapes they are taken as memory-bound, where TF32 gains nothing.")
    elif tf32 is not None:
        advice += f" TF32 alone would not shorten the step measurably: {amp} halves the bytes as well."
    if "fp8" in fixes and savings["fp8"][0] is not None:
        advice += f" Your fp8 library could take it to about {savings['fp8'][0]:.0f} %."
    return advice

"""cpu-half-precision: autocast runs the CPU's matmuls in a 16-bit type the CPU has no instructions for.

## What it detects
A run without a GPU timeline (the steps ran on the CPU) whose script entered `torch.autocast` on the CPU
with bfloat16 or float16 (run.json's `autocast`, enabled), on a CPU whose flags (run.json's
`environment.machine.cpu.flags`, from /proc/cpuinfo) give that type no arithmetic of its own: bfloat16
needs `avx512_bf16` or `amx_bf16` (x86) or `bf16` (Arm); float16 needs `avx512_fp16` or `amx_fp16` (x86)
or `asimdhp` (Arm). The trace must show the casts autocast adds inside the recorded steps
(`aten::_to_copy`: each weight and input converted to 16 bits before its op, and back in the backward
pass): a context that was built but ran nothing in the steps is not a finding.

## Why it matters
Without the instructions the CPU converts each 16-bit value to float32 and back around every operation:
the matmuls run slower than in float32, not faster, and every op autocast wraps first copies its
inputs. Measured on this project's two-core test machine (AVX-512 without `avx512_fp16`), a
256×768 by 768×50257 linear layer's forward and backward took 3.6 s in float32, 2.3 s under bfloat16
autocast (which that CPU has) and 153 s under float16 autocast (which it has not).

## Fix
```python
# 16-bit autocast only where the hardware computes in it (a GPU); float32 on this CPU
use_amp = device_type == "cuda"
amp = torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=use_amp)
with amp:
    logits, loss = model(x, y)
```
Under transformers' Trainer, leave `bf16` and `fp16` off in `TrainingArguments` on this machine.

Under Lightning, use `precision="32-true"` on this machine.

## Thresholds
Fires when the casts take any time in the median step (at least one cast per step); silent without
run.json's CPU flags or autocast record (a trace alone has neither). The predicted saving, in the median
step: the casts' own time (the union of the `aten::_to_copy` ops on the training thread), plus what the
matmuls and attention autocast ran in the 16-bit type (`aten::mm`, `addmm`, `bmm`, convolutions, CPU flash
attention and its backward) save in float32: their time × (1 − 1/x), x being how many times as long one
128×128 matmul took in that type as in float32 on the same CPU and threads (`gpuadvise profile` times it
once, after the window, when the script autocast to a 16-bit type on the CPU: run.json
`environment.machine.cpu.matmul`). Without that timing only the casts are predicted. The other ops run
in the 16-bit type (activations, normalisation) are left as they are: the prediction is a floor (build-
nanoGPT's tiny GPT on this project's two-core test machine under float16 autocast: 80 % predicted from
its trace; the unprofiled step went from 322 ms to 40 ms, 87 %, with autocast off). Severity follows the
predicted saving.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.job.ranktime import training_thread
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.runjson import run_json

from .base import Rule

CAST = "aten::_to_copy"  # the conversion inside aten::to: what autocast's casts are
# the ops autocast runs in the 16-bit type on a CPU (torch's autocast CPU lower-precision list)
MATMULS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_convolution",
                     "aten::mkldnn_convolution", "aten::conv_tbc", "aten::_scaled_dot_product_flash_attention_for_cpu",
                     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})
WORDS = {"bfloat16": "bfloat16", "float16": "float16"}
NEEDS = {"bfloat16": "avx512_bf16 or amx_bf16 (x86), bf16 (Arm)", "float16": "avx512_fp16 or amx_fp16 (x86), asimdhp (Arm)"}


class CpuHalfPrecision(Rule):
    code = "GA170"
    name = "cpu-half-precision"
    title = "Autocast runs the CPU's matmuls in a 16-bit type it has no instructions for"
    thresholds = {}

    def check(self, a: Analysis):
        m = a.metrics
        if m is None or m.has_gpu:
            return []
        native = runfacts.cpu_16bit(a.facts)
        if native is None:
            return []
        emulated = [c for c in runfacts.autocasts(a.facts) if c.acted and c.device_type == "cpu"
                    and native.get(_dtype(c.dtype)) is False]
        if not emulated:
            return []
        dtype = _dtype(emulated[0].dtype)
        casts, mm = _thread_ops(a, {CAST}), _thread_ops(a, MATMULS)
        cast_us = perstep.covered(m, *casts)
        n_casts = perstep.median(perstep.issued(m, casts[0]))
        cast_ms, step_ms = perstep.median(cast_us) / 1e3, m.median_step_us / 1e3
        if cast_ms <= 0 or step_ms <= 0 or n_casts < 1:
            return []  # the context ran nothing in the recorded steps: the trace decides what ran
        mm_ms = perstep.median(perstep.covered(m, *mm)) / 1e3
        slower = _slower(a.facts, dtype)  # how much slower the CPU's matmul is in the type (run.json), or None
        gain_ms = mm_ms * (1 - 1 / slower) if slower else 0.0
        saving = 100.0 * min(cast_ms + gain_ms, step_ms) / step_ms
        cpu = runfacts.cpu_model(a.facts)
        where = ", ".join(sorted({c.created_at for c in emulated if c.created_at != "?"}))
        med = perstep.a_median(m)
        speed = (f"; the same matmul took {slower:.1f}× as long in {WORDS[dtype]} as in float32 on this CPU "
                 "(gpuadvise profile timed one)" if slower else "")
        message = (f"The script runs autocast to {WORDS[dtype]} on a CPU{f' ({cpu})' if cpu else ''} without "
                   f"{WORDS[dtype]} instructions (run.json's CPU flags have none of {NEEDS[dtype]}): the CPU "
                   f"converts every value to float32 and back. The matmuls and attention it runs in {WORDS[dtype]} "
                   f"take {med}{mm_ms:.2f} ms of {perstep.each_step(m)} {step_ms:.2f} ms step "
                   f"({100 * mm_ms / step_ms:.1f}%){speed}, and the casts autocast adds {cast_ms:.2f} ms "
                   f"({perstep.count_of(n_casts, 'cast')}).")
        fw = runfacts.framework(a.facts)
        switch = ("leave `bf16` and `fp16` off in `TrainingArguments` on this machine" if fw and fw.name == "transformers"
                  else "use `precision=\"32-true\"` on this machine" if fw and fw.name == "lightning"
                  else f"build the autocast{f' at {where}' if where else ''} with `enabled=False` on the CPU "
                       "(or leave it out there)")
        advice = (f"Run the CPU's steps in float32: {switch}. 16-bit autocast pays on a GPU, or on a CPU "
                  f"with {WORDS[dtype]} instructions.")
        evidence = Evidence(
            steps=[s.number for s in m.steps],
            sources=[c.created_at for c in emulated if c.created_at][:3],
            numbers={"autocast_dtype": WORDS[dtype], "cpu_flags_needed": NEEDS[dtype], "casts_per_step": n_casts,
                     "casts_ms_per_step": round(cast_ms, 3), "matmuls_ms_per_step": round(mm_ms, 3),
                     **({"matmul_slower_x": round(slower, 2)} if slower else {}),
                     "median_step_ms": round(step_ms, 3), "statistic": "median step"})
        basis = (f"the casts autocast adds ({cast_ms:.2f} ms of the median step) removed"
                 + (f", and its {WORDS[dtype]} matmuls and attention ({mm_ms:.2f} ms) run in float32, {slower:.1f}× "
                    f"faster as one matmul timed on this CPU: {gain_ms:.2f} ms less; the other ops it ran in "
                    f"{WORDS[dtype]} are left as they are" if slower else
                    f"; the {WORDS[dtype]} matmuls' gain from running in float32 is not predicted (run.json has no "
                    "timing of the CPU's matmuls: time a step without autocast)"))
        fix = self.fix.replace("torch.bfloat16", f"torch.{dtype}")  # the type the script asked for
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice, fix=fix)]

    def positive(self) -> TraceBuilder:
        b = _cpu_autocast_loop(casts=True)
        b.facts = _cpu_facts("torch.float16", flags=["avx2", "avx512f", "avx512_bf16"])  # bf16 yes, fp16 no
        return b

    def negative(self) -> TraceBuilder:
        # the same loop on a CPU that computes in float16 (Sapphire Rapids' AMX-FP16): nothing to fix
        b = _cpu_autocast_loop(casts=True)
        b.facts = _cpu_facts("torch.float16", flags=["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_fp16"])
        return b


def _slower(facts: dict, dtype: str) -> float | None:
    """How many times as long the CPU's matmul took in `dtype` as in float32 (run.json), when over 1."""
    timed = runfacts.cpu_matmul_ms(facts)
    if timed is None or not timed[1].get(dtype) or timed[1]["float32"] <= 0:
        return None
    x = timed[1][dtype] / timed[1]["float32"]
    return x if x > 1 else None


def _dtype(text: str) -> str:
    return text.replace("torch.", "")


def _thread_ops(a: Analysis, names) -> tuple[np.ndarray, np.ndarray]:
    """The ops named `names` on the training thread: (starts, ends)."""
    cpu = a.model.cpu
    tid = training_thread(a.model, a.metrics)
    if cpu.empty or tid is None:
        return np.zeros(0), np.zeros(0)
    rows = cpu[(cpu["tid"].to_numpy() == tid) & cpu["name"].isin(names).to_numpy()]
    return rows["ts"].to_numpy(dtype=float), rows["end"].to_numpy(dtype=float)


def _cpu_facts(dtype: str, flags: list[str]) -> dict:
    cpu = {"logical": 8, "usable": 8, "cgroup_limit": None, "model": "a test CPU", "flags": flags,
           "matmul": {"n": 128, "ms": {"float32": 0.06, dtype.replace("torch.", ""): 1.2}}}
    return run_json(cuda_available=False, cpu=cpu,
                    autocast=[{"created_at": "train.py:40", "device_type": "cpu", "dtype": dtype, "enabled": True}])


def _cpu_autocast_loop(casts: bool, steps: int = 4) -> TraceBuilder:
    """A CPU training loop under autocast: each linear layer casts its weight and input, then multiplies."""
    b = TraceBuilder(device=None)
    for _ in range(steps):
        with b.step():
            for _ in range(3):
                with b.op("aten::linear"):
                    if casts:
                        for us in (300.0, 200.0):
                            with b.op("aten::to"):
                                b.cpu(CAST, us)
                    with b.op("aten::linear"):
                        b.cpu("aten::addmm", 2_000)
                b.idle(100)
            b.cpu("aten::mm", 1_500)
            b.idle(500)
    return b


RULE = CpuHalfPrecision()

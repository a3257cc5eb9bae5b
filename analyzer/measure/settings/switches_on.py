"""Which of the usual speed switches the run already had on, and the evidence that shows it: run.json's
facts from `gpuadvise profile`, **or** the trace alone (a trace somebody recorded with plain
`torch.profiler` has no run.json). Advice never asks for what is on: a rule asks `is_on(switch, a)`
before recommending a switch, and words its advice and fix from what is off.

One table, `SWITCHES`: each switch has a label in people's words, how run.json shows it on, how the trace
shows it on, and `asks` (the phrases of a recommendation to turn it on, used by the test that walks every
rule over the corpus and the fixtures: no finding may ask for a switch its input shows on).

The trace decides what ran. run.json records where a switch was built; a switch it shows on is off where
the trace shows it did not act (`against`), and so is one run.json itself records as built but off in the
recorded steps (`built_off`): `switch_off(switch, a)` gives the conflict in words (`Off`), `switches_off(a)`
all of them (each a note of the report, analyzer/run/single.py).

| switch | built, but off (run.json) | on in run.json, not acting in the trace |
|---|---|---|
| `autocast` | `enabled=False`; never entered in the recorded steps (where they run no compiled code, whose graphs enter it unseen); for the CPU on a GPU run | every matmul kernel fp32 or TF32 by name (on the CPU: every matmul op's inputs fp32) |
| `tf32` | the flag changed while the recorded steps ran | on a GPU with TF32, fp32 GEMMs on cuBLAS's general SIMT kernels and none on TF32 |
| `compile` | | no compiled frame, graph or Inductor kernel in the steps, or a compiled helper beside an eager model |
| `workers`, `pin_memory` | a loader with it the recorded steps took no batch from, while they took theirs from one without | (workers) every DataLoader `__next__` in the trace single-process |
| `fused_optimizer` | a foreach/fused optimizer that did not step in the recorded steps, while one without did | optimizer steps with ops inside and no foreach/fused op or kernel anywhere |
| `cudnn_benchmark` | the flag changed while the recorded steps ran | |
| `no_sync` | called but never entered; every backward pass all-reduced though it was called | |

| switch | run.json | trace |
|---|---|---|
| `compile` | `compiled.calls`/`compiles`, the framework's `torch_compile` | compiled frames or graph spans inside the steps, Inductor kernels (measure/compiled/compiledtrace.py); not when the compiled code launched under a quarter of the model's 20 or more matmul kernels (a compiled helper beside an eager model) |
| `cuda_graphs` | `compiled.cudagraphs.replays` above 0 | `cudaGraphLaunch` / `hipGraphLaunch` calls |
| `autocast` | an autocast context in bf16/fp16, enabled and entered in the recorded steps, the framework's `bf16`/`precision` | most matmul kernel time in 16-bit kernels |
| `tf32` | `matmul_allow_tf32` (or `float32_matmul_precision` high/medium), the framework's `tf32` | fp32 GEMMs (not convolutions: cuDNN's TF32 is on by default) on TF32 Tensor Core kernels |
| `cudnn_benchmark` | `cudnn_benchmark` | (not visible in a trace) |
| `pin_memory` | a training DataLoader with `pin_memory=True`, the framework's `dataloader_pin_memory` | `aten::pin_memory` on a thread other than the training loop's (the DataLoader's pin thread) |
| `workers` | a training DataLoader (the one the recorded steps iterate, where counted) with `num_workers > 0` | multi-process DataLoader iteration (`_MultiProcessingDataLoaderIter`) |
| `fused_optimizer` | an optimizer that stepped in the recorded steps with `foreach=True` or `fused=True` | `_foreach_` ops, `multi_tensor_apply` or fused optimizer kernels |
| `set_to_none` | (not recorded) | `Optimizer.zero_grad` spans that write no zeros |
| `no_sync` | fewer synced backward passes than backward passes; else `no_sync()` entered on a DDP wrapper | (not visible without run.json) |
| `channels_last` | (not recorded) | most convolution kernel time in NHWC kernels, and no layout-conversion kernel |
| `expandable_segments` | `PYTORCH_CUDA_ALLOC_CONF` in the environment | the allocator settings a snapshot records |

Whether a trace is compiled is `compiled_evidence(a)`: the one function that reads the trace's compile facts
(`a.compiled`, measure/compiled/compiledtrace.py), so that richer ones plug in there.

`asked_for(text)` recognises a recommendation by its phrases; in prose a sentence that says "already"
reports what is on and asks for nothing. `without_what_is_on(fix, on)` drops the code lines of a fix that
ask for a switch that is on (with the comments right above them and the block a line opens); the engine
applies it to every finding (analyzer/run/single.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from gpuadvise.analyzer.model import runfacts, switches as framework_switches
from gpuadvise.analyzer.model.calls import GRAPH_LAUNCHES
from gpuadvise.analyzer.model.kernels import CONV, GEMM, head
from gpuadvise.analyzer.model.trace import name_mask

from ..basics import perstep
from ..basics.spans import annotation_spans, gpu_ops_launched_in, ops_inside

# a GEMM kernel (not a convolution) on TF32 Tensor Cores, by name
TF32_GEMM = re.compile(r"tf32|s1688gemm|s884gemm|_s1688|1688tf32", re.I)
# 16-bit matmul kernels, by name
HALF_MATMUL = re.compile(r"bf16|bfloat16|fp16|f16|half|h884|h1688|hmma|_HHS_|_BBS_|_HH_|_BB_", re.I)
# convolution kernels that run on NHWC tensors (cuDNN's `nhwc`/`nhwckrsc` kernels, MIOpen's `_nhwc_` igemm)
NHWC_CONV = re.compile(r"nhwc", re.I)
# 16-bit input types of an op, as the profiler records them ("c10::BFloat16", "c10::Half")
HALF_INPUT = re.compile(r"BFloat16|Half", re.I)
# the ops that run a matmul themselves (aten::linear and aten::matmul dispatch to them: autocast casts in between)
CPU_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# the optimizer's multi-tensor paths
MULTI_TENSOR = re.compile(r"_foreach_|multi_tensor_apply|_fused_adam|fused_adam|_fused_sgd|FusedAdam|fused_optimizer", re.I)
MULTI_PROCESS_LOADER = "_MultiProcessingDataLoaderIter"
PIN_OPS = ("aten::pin_memory", "aten::_pin_memory")


@dataclass(frozen=True)
class On:
    """Evidence that a switch was on: where it comes from ("run.json" or "the trace") and what it says."""

    switch: str
    source: str
    what: str

    def __str__(self) -> str:
        return f"{SWITCHES[self.switch].label} is on ({self.source}: {self.what})"


@dataclass(frozen=True)
class Off:
    """A switch run.json records as built that did not act in the recorded steps, in people's words naming
    the conflict (`text`): `source` "run.json" where run.json itself shows it (built with `enabled=False`,
    never entered or iterated while the steps ran, changed during them), "the trace" where run.json shows it
    on and the trace shows it did not act (fp32 matmuls under an autocast, eager kernels under a compile)."""

    switch: str
    source: str
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Switch:
    key: str
    label: str  # in people's words
    asks: re.Pattern  # a recommendation to turn it on
    from_facts: Callable  # Analysis → str or None: run.json shows it on (built, and used in the recorded steps)
    from_trace: Callable  # Analysis → str or None: the trace shows it on
    built_off: Callable = None  # Analysis → str or None: run.json shows it built but off in the recorded steps
    against: Callable = None  # Analysis → str or None: the trace shows it did not act ("the trace shows …")


def is_on(switch: str, a) -> On | None:
    """Evidence that `switch` was on in `a`'s input (run.json first, then the trace); None when nothing shows
    it on (off, or not visible in this input: advice may then ask for it). The trace decides what ran: a
    switch run.json shows on that the trace shows did not act is off, and so is one run.json records as
    built but disabled or unused (`switch_off` says which, in words). The answer is kept in `a` (the rules
    and the engine ask each switch many times of one analysis, whose input does not change)."""
    answers = vars(a).setdefault("_switches_on", {}) if hasattr(a, "__dict__") else {}
    if switch not in answers:
        answers[switch] = _is_on(switch, a, _offs(a))
    return answers[switch]


def _offs(a) -> dict:
    return vars(a).setdefault("_switches_off", {}) if hasattr(a, "__dict__") else {}


def _is_on(switch: str, a, offs: dict) -> On | None:
    s = SWITCHES[switch]
    traced = a.model is not None and a.metrics is not None
    what = s.from_facts(a)
    if what:
        against = (s.against or _invisible)(a) if traced else None
        if not against:
            return On(switch, "run.json", what)
        offs[switch] = Off(switch, "the trace", f"run.json records {what}, but {against}")
    elif (built := (s.built_off or _invisible)(a)):
        offs[switch] = Off(switch, "run.json", built)
    if traced:
        what = s.from_trace(a)
        if what:
            offs.pop(switch, None)
            return On(switch, "the trace", what)
    return None


def switches_on(a) -> dict[str, On]:
    """Every switch the input shows on, by key."""
    return {k: e for k in SWITCHES if (e := is_on(k, a)) is not None}


def switch_off(switch: str, a) -> Off | None:
    """How run.json's record of `switch` conflicts with what ran (see `Off`); None where it does not."""
    is_on(switch, a)
    return _offs(a).get(switch)


def switches_off(a) -> dict[str, Off]:
    """Every switch run.json records as built that did not act in the recorded steps, by key. Only the
    switches run.json speaks of are judged (a plain trace costs nothing here)."""
    for k, s in SWITCHES.items():
        if s.from_facts(a) or (s.built_off or _invisible)(a):
            is_on(k, a)
    return dict(_offs(a))


def conflict_notes(a) -> list[str]:
    """The report's notes: each conflict (`switches_off`) once, with the switches the findings take as off."""
    by_text: dict[str, list[str]] = {}
    for key, off in switches_off(a).items():
        by_text.setdefault(off.text, []).append(SWITCHES[key].label)
    return [f"{text}: the findings take {' and '.join(labels)} as off" for text, labels in by_text.items()]


def with_conflicts_named(advice: str, fix: str, a) -> str:
    """A finding's advice with, ahead of it, the conflict behind each switch its advice or fix asks for that
    run.json records but the recorded steps did not use (`switch_off`): the user who set it reads why it is
    asked for. A conflict the advice already names is not repeated."""
    asked = asked_for(advice + "\n" + fix)
    if not asked:
        return advice
    named = list(dict.fromkeys(o.text for k in SWITCHES if k in asked and (o := switch_off(k, a)) is not None
                               and o.text[1:] not in advice))  # one loader's conflict names its workers and pinning
    if not named:
        return advice
    return " ".join(_sentence(t) for t in named) + (" " + advice if advice else "")


def _sentence(text: str) -> str:
    """A clause as a sentence: its first letter up (not a file's or code's name: run.json, `torch.…`), a full stop."""
    text = text if text.startswith(("run.json", "`")) else framework_switches.sentence(text)
    return text if text.endswith(".") else text + "."


def asked_for(text: str) -> set[str]:
    """The switches a piece of advice or fix text recommends turning on. Every line of a code block counts;
    in prose, a sentence that says "already" reports what is on ("`torch_compile=True` is set already")
    and asks for nothing."""
    asked: set[str] = set()
    code = False
    for line in (text or "").split("\n"):
        if line.strip().startswith("```"):
            code = not code
            continue
        parts = [line] if code else [p for p in re.split(r"(?<=[.;:])\s+", line) if "already" not in p.lower()]
        for part in parts:
            asked |= {k for k, s in SWITCHES.items() if s.asks.search(part)}
    return asked


# -- torch.compile -------------------------------------------------------------------------------------

def compiled_evidence(a) -> str | None:
    """The trace shows torch.compile's work (compiled frames, graph spans, Inductor kernels or CUDA graph
    replays), in words; None when it does not. Compiled code that launches under a quarter of the model's
    matmul kernels (of 20 or more, in the steps), where the trace shows its regions, is a compiled helper
    beside an eager model: torch.compile is not on for the model, and advice may ask to compile it."""
    c = a.compiled
    if c is None:
        return None
    if c.steps and not any(s.regions or s.compiled_us > 0 for s in c.steps):
        return None  # compiled code ran, but not in the training steps (a helper, a warm-up call)
    if c.beside_eager_model:
        return None  # compiled code ran, but the model's matmuls were launched outside it: a compiled helper
    parts = []
    regions = max((s.regions for s in c.steps), default=0)
    if regions:
        parts.append(f"{regions} compiled-frame call{'s' if regions != 1 else ''} a step")
    elif c.graph_spans:
        parts.append("compiled graphs run in the steps" if c.steps else "compiled graphs run")
    if c.inductor_kernels:
        parts.append(perstep.count_of(sum(v["count"] for v in c.inductor_kernels.values()), "Inductor kernel"))
    if not parts and c.cuda_graph_launches:
        return None  # CUDA graphs without compiled code: captured by hand, not torch.compile
    return ", ".join(parts) or None


def _compile_against(a) -> str | None:
    """The recorded steps ran eagerly: no compiled frame, graph or Inductor kernel in them (a trace that
    records CPU ops shows each compiled frame it runs), or compiled code that launched too few of the
    model's matmuls to be the model. Where CUDA graphs replay without compiled frames, it cannot tell."""
    m = a.metrics
    if not m.steps or not len(a.model.cpu) or compiled_evidence(a):
        return None
    c = a.compiled
    if c is not None and c.cuda_graph_launches:
        return None
    if c is not None and c.beside_eager_model:
        inside, total = c.matmuls
        return (f"the trace shows the model ran eagerly: {inside} of its {total} matmul kernels were launched "
                "inside compiled code (the compiled module is not the one the steps call)")
    return ("the trace shows no compiled code in the recorded steps (no compiled frame, graph or Inductor kernel): "
            "they ran eagerly (the compiled module is not the one the steps call)")


def _compile_facts(a) -> str | None:
    comp = runfacts.compiled(a.facts)
    calls = [c for c in (comp.get("calls") or []) if isinstance(c, dict)]
    if calls:
        where = calls[0].get("called_at")
        return "torch.compile called" + (f" at {where}" if isinstance(where, str) else "")
    if runfacts.compile_events(a.facts):
        return "torch.compile compiled frames"
    fw = runfacts.framework(a.facts)
    return framework_switches.already(fw, "compile")


# -- CUDA graphs ---------------------------------------------------------------------------------------

def _graphs_facts(a) -> str | None:
    graphs = runfacts.compiled(a.facts).get("cudagraphs")
    if isinstance(graphs, dict) and isinstance(graphs.get("replays"), int) and graphs["replays"] > 0:
        return f"{graphs['replays']} CUDA graph replays"
    return None


def _graphs_trace(a) -> str | None:
    rt = a.model.runtime
    n = int(rt["name"].isin(GRAPH_LAUNCHES).sum()) if len(rt) else 0
    return perstep.count_of(n, "CUDA graph launch", "CUDA graph launches") if n else None


# -- precision -----------------------------------------------------------------------------------------

def _half_autocasts(a) -> list:
    """The 16-bit autocast contexts run.json records, those for the CPU left out where the trace ran GPU
    kernels (they leave the GPU's matmuls as they are)."""
    half = [c for c in runfacts.autocasts(a.facts) if c.half]
    if a.metrics is not None and a.metrics.has_gpu:
        half = [c for c in half if c.device_type != "cpu"]
    return half


def _acted(c, a) -> bool:
    """Whether autocast context `c` could act on the recorded steps: enabled, and entered in them; a context
    entered inside compiled code is entered by torch.compile's graph, not by Python (so never counted),
    and where the trace shows compiled code in the steps an uncounted entry says nothing."""
    return c.acted or (c.enabled is not False and a.model is not None and a.metrics is not None
                       and compiled_evidence(a) is not None)


def _autocast_facts(a) -> str | None:
    acting = [c for c in _half_autocasts(a) if _acted(c, a)]
    if acting:
        return acting[0].describe()
    fw = runfacts.framework(a.facts)
    return framework_switches.already(fw, "bf16")


def _autocast_built_off(a) -> str | None:
    """An autocast built with `enabled=False`, never entered in the recorded steps, or for the CPU on a GPU run."""
    built = [c for c in runfacts.autocasts(a.facts) if c.half]
    if not built or any(_acted(c, a) for c in _half_autocasts(a)):
        return None
    c = next((c for c in built if c.enabled is False), None)
    if c is not None:
        where = f" at {c.created_at}" if c.created_at != "?" else ""
        return f"autocast is built{where} with enabled=False"
    c = next((c for c in built if _acted(c, a)), None)
    if c is not None:  # acts, but on the CPU: a GPU run's matmuls are left as they are
        return f"{c.describe()} is for the CPU (device_type='cpu'), not for the GPU's matmuls"
    return f"{built[0].describe()} was not entered while the recorded steps ran"


def _autocast_against(a) -> str | None:
    """The trace shows the matmuls of the recorded steps in fp32 and none in 16-bit: by the kernels' names on
    a GPU, by the matmul ops' recorded input types on the CPU."""
    mm = _matmuls(a)
    if mm is not None and len(mm):
        simt = (mm["precision"] == "fp32-simt").to_numpy(bool)
        tf32 = mm["name"].astype(str).map(lambda n: bool(TF32_GEMM.search(head(n)))).to_numpy(bool)
        total = float(mm["total_us"].sum())
        if total <= 0 or not (simt | tf32).all():
            return None
        kinds = " and ".join(k for k, there in (("fp32", simt.any()), ("TF32", tf32.any())) if there)
        return (f"the trace shows it did not act: all {total / 1e3:.1f} ms of matmul kernel time ran in {kinds} "
                "kernels, none in 16-bit (it is disabled, or entered around none of these matmuls)")
    if a.metrics.has_gpu:
        return None
    types = _cpu_matmul_types(a)
    if not types or any(HALF_INPUT.search(t) for t in types) or not all(t.startswith("float") for t in types):
        return None
    return (f"the trace shows it did not act: its {len(types)} matmul ops took fp32 inputs, none 16-bit (it is "
            "disabled, or entered around none of them)")


def _cpu_matmul_types(a) -> list[str]:
    """The recorded input types ("float,float", "c10::BFloat16,…") of the trace's matmul ops (CPU side)."""
    cpu = a.model.cpu
    if not len(cpu) or "input_type" not in cpu:
        return []
    types = cpu.loc[cpu["name"].isin(CPU_MATMUL_OPS).to_numpy(bool), "input_type"].astype(str)
    return [t for t in types if t and t not in ("nan", "None")]


def _matmuls(a):
    k = a.metrics.kernels
    if k is None or not len(k):
        return k
    return k[k["matmul"].astype(bool)]


def _autocast_trace(a) -> str | None:
    mm = _matmuls(a)
    if mm is None or not len(mm):
        return None
    total = float(mm["total_us"].sum())
    half = mm["name"].map(lambda n: bool(HALF_MATMUL.search(head(str(n))))).to_numpy(bool)
    share = 100.0 * float(mm.loc[half, "total_us"].sum()) / total if total > 0 else 0.0
    return f"{share:.0f} % of matmul kernel time in 16-bit kernels" if share >= 50.0 else None


def _tf32_facts(a) -> str | None:
    if runfacts.flag(a.facts, "matmul_allow_tf32") is True:
        return "torch.backends.cuda.matmul.allow_tf32 = True"
    prec = runfacts.settings(a.facts).get("float32_matmul_precision")
    if prec in ("high", "medium") and "float32_matmul_precision" not in runfacts.changed_in_window(a.facts):
        return f"float32_matmul_precision = {prec!s}"
    return framework_switches.already(runfacts.framework(a.facts), "tf32")


def _changed(a, names: tuple[str, ...], on) -> str | None:
    """A backend flag the script changed while the recorded steps ran, where it was on at one end (`on`:
    value → whether that is on): in words."""
    changed = runfacts.changed_in_window(a.facts)
    for name in names:
        if name in changed and any(on(v) for v in changed[name]):
            start, end = changed[name]
            return (f"`{name}` changed while the recorded steps ran ({start} at their start, {end} at their end): "
                    "it held no one value in them")
    return None


def _tf32_built_off(a) -> str | None:
    return _changed(a, ("matmul_allow_tf32", "float32_matmul_precision"), lambda v: v is True or v in ("high", "medium"))


# cuBLAS's special small-shape SIMT kernels, picked whatever the precision setting
SIMT_SMALL = re.compile(r"gemmSN|gemmk1", re.I)


def _tf32_against(a) -> str | None:
    """On a GPU with TF32, fp32 GEMMs on the CUDA cores (cuBLAS's general SIMT kernels) and none on TF32."""
    spec = a.device_spec
    mm = _matmuls(a)
    if not spec.tf32 or mm is None or not len(mm):
        return None
    heads = mm["name"].astype(str).map(head)
    gemm = heads.map(lambda n: bool(GEMM.search(n)) and not CONV.search(n)).to_numpy(bool)
    if heads[gemm].map(lambda n: bool(TF32_GEMM.search(n))).any():
        return None
    simt = gemm & (mm["precision"] == "fp32-simt").to_numpy(bool) & ~heads.map(lambda n: bool(SIMT_SMALL.search(n))).to_numpy(bool)
    if not simt.any():
        return None
    ms = float(mm.loc[simt, "total_us"].sum()) / 1e3
    return (f"the trace shows fp32 GEMMs on the CUDA cores ({perstep.count_of(int(mm.loc[simt, 'count'].sum()), 'kernel')}, "
            f"{ms:.1f} ms) and none on TF32 Tensor Cores")


def _tf32_trace(a) -> str | None:
    mm = _matmuls(a)
    if mm is None or not len(mm):
        return None
    names = mm["name"].astype(str)
    gemm = names.map(lambda n: bool(GEMM.search(head(n))) and not CONV.search(head(n)))
    tf32 = names.map(lambda n: bool(TF32_GEMM.search(head(n))))
    n = int((gemm & tf32).sum())
    return f"{n} GEMM kernel{'s' if n != 1 else ''} on TF32 Tensor Cores" if n else None


# -- cudnn.benchmark -----------------------------------------------------------------------------------

def _benchmark_facts(a) -> str | None:
    return "torch.backends.cudnn.benchmark = True" if runfacts.flag(a.facts, "cudnn_benchmark") is True else None


def _benchmark_built_off(a) -> str | None:
    return _changed(a, ("cudnn_benchmark",), lambda v: v is True)


def _invisible(a) -> str | None:
    return None


# -- input pipeline ------------------------------------------------------------------------------------

def _pin_facts(a) -> str | None:
    pinned = [d for d in runfacts.training_loaders(a.facts) if d.pin_memory]
    if pinned:
        return f"the DataLoader created at {pinned[0].where} pins its batches"
    return framework_switches.already(runfacts.framework(a.facts), "pin_memory")


def _loader_built_off(a, has) -> str | None:
    """A DataLoader built with a setting (`has`: DataLoaderFact → bool) that the recorded steps took no batch
    from, while they took theirs from one without it."""
    fed = runfacts.iterated_loaders(a.facts)
    if fed is None or any(has(d) for d in fed):
        return None
    idle = next((d for d in runfacts.dataloaders(a.facts) if has(d) and not d.batches_in_window), None)
    if idle is None:
        return None
    return (f"the DataLoader built at {idle.where} has {_loader_settings(idle)}, but the recorded steps take their "
            f"batches from the one built at {fed[0].where} ({_loader_settings(fed[0])})")


def _loader_settings(d) -> str:
    return f"num_workers={d.num_workers}, pin_memory={d.pin_memory}"


def _pin_built_off(a) -> str | None:
    return _loader_built_off(a, lambda d: bool(d.pin_memory))


def _pin_trace(a) -> str | None:
    cpu = a.model.cpu
    if not len(cpu):
        return None
    pins = cpu[cpu["name"].isin(PIN_OPS)]
    loop = a.metrics.launch_thread
    if loop is not None and len(pins):
        pins = pins[pins["tid"].to_numpy() != loop[1]]
    return f"{len(pins)} pin_memory calls on the DataLoader's pin thread" if len(pins) else None


def _workers_facts(a) -> str | None:
    with_workers = [d for d in runfacts.training_loaders(a.facts) if d.num_workers]
    if with_workers:
        d = with_workers[0]
        return f"the DataLoader created at {d.where} has num_workers={d.num_workers}"
    return None


def _workers_built_off(a) -> str | None:
    return _loader_built_off(a, lambda d: bool(d.num_workers))


def _workers_against(a) -> str | None:
    dl = a.metrics.dataloader
    if dl is None or not len(dl) or not dl["single_process"].astype(bool).all():
        return None
    return ("the trace shows the recorded steps take their batches in the training process "
            "(_SingleProcessDataLoaderIter: num_workers=0)")


def _workers_trace(a) -> str | None:
    dl = a.metrics.dataloader
    if dl is None or not len(dl):
        return None
    multi = (~dl["single_process"].astype(bool)).to_numpy()
    return "the DataLoader is iterated by worker processes (_MultiProcessingDataLoaderIter)" if multi.any() else None


# -- optimizer -----------------------------------------------------------------------------------------

def _fused_facts(a) -> str | None:
    for o in runfacts.optimizers(a.facts):
        if o.fused or o.foreach:
            return f"{o.cls} with {'fused' if o.fused else 'foreach'}=True"
    return None


def _fused_built_off(a) -> str | None:
    """A foreach/fused optimizer that did not step while the recorded steps ran, where others did."""
    stepped = runfacts.optimizers(a.facts)
    if not any(o.steps_in_window for o in stepped) or any(o.fused or o.foreach for o in stepped):
        return None
    idle = next((o for o in runfacts.optimizers(a.facts, in_window_only=False) if (o.fused or o.foreach)
                 and not o.steps_in_window), None)
    if idle is None:
        return None
    return (f"{idle.cls} with {'fused' if idle.fused else 'foreach'}=True did not step while the recorded steps "
            f"ran: {stepped[0].cls} did, with neither")


def _fused_against(a) -> str | None:
    """Optimizer steps in the trace with ops inside or kernels launched from them, and no foreach or fused op
    or kernel anywhere."""
    spans = annotation_spans(a.model, "Optimizer.step#")
    if not len(spans) or _fused_trace(a):
        return None
    if not len(ops_inside(a.model, spans)) and not len(gpu_ops_launched_in(a.model, a.metrics.launches, spans)):
        return None
    return "the trace shows its updates one tensor at a time: no foreach or fused op or kernel in its optimizer steps"


def _fused_trace(a) -> str | None:
    k, cpu = a.model.kernels, a.model.cpu
    hits = int(name_mask(k["name"], lambda n: bool(MULTI_TENSOR.search(n))).sum()) if len(k) else 0
    if hits:
        return f"{hits} multi-tensor/fused optimizer kernels"
    ops = int(name_mask(cpu["name"], lambda n: n.startswith("aten::_foreach_") or n.startswith("aten::_fused_"))
              .sum()) if len(cpu) else 0
    return f"{ops} foreach/fused optimizer ops" if ops else None


def _set_to_none_trace(a) -> str | None:
    cpu = a.model.cpu
    if not len(cpu):
        return None
    spans = cpu[name_mask(cpu["name"], lambda n: n.startswith("Optimizer.zero_grad#"))]
    if not len(spans):
        return None
    zeros = cpu[cpu["name"].isin(("aten::zero_", "aten::fill_"))]
    starts, ends = spans["ts"].to_numpy(float), spans["end"].to_numpy(float)
    if len(zeros):
        ts = zeros["ts"].to_numpy(float)
        i = np.searchsorted(starts, ts, side="right") - 1
        inside = (i >= 0) & (ts < ends[np.clip(i, 0, None)])
        if inside.any():
            return None
    return f"{len(spans)} zero_grad calls that write no zeros (gradients set to None)"


# -- distributed ---------------------------------------------------------------------------------------

def _accumulating(a):
    """run.json's backward passes per optimizer step, where there are several (gradient accumulation)."""
    acc = runfacts.accumulation(a.facts)
    return acc if acc is not None and acc.backward_per_step > 1 else None


def _no_sync_facts(a) -> str | None:
    """What ran first: fewer all-reducing backward passes than backward passes; else `no_sync()` contexts
    entered (calls, from a harness that counted no entries)."""
    acc = _accumulating(a)
    if acc is not None:
        if acc.synced_backward_per_step < acc.backward_per_step:
            return (f"{acc.synced_backward_per_step:g} of {acc.backward_per_step:g} backward passes per optimizer "
                    "step all-reduce")
        return None
    for d in runfacts.ddp(a.facts):
        entered = d.no_sync_entered if d.no_sync_entered is not None else d.no_sync_calls
        if entered:
            return f"no_sync() entered {entered} times"
    return None


def _no_sync_built_off(a) -> str | None:
    calls = sum(d.no_sync_calls or 0 for d in runfacts.ddp(a.facts))
    if not calls:
        return None
    acc = _accumulating(a)
    if acc is not None:
        return (f"no_sync() was called {calls} times, yet every backward pass all-reduced ({acc.synced_backward_per_step:g} "
                f"of {acc.backward_per_step:g} per optimizer step): the backward passes ran outside its context")
    if all(d.no_sync_entered == 0 for d in runfacts.ddp(a.facts) if d.no_sync_calls):
        return f"no_sync() was called {calls} times but its context never entered (called without `with`)"
    return None


# -- layout and memory ---------------------------------------------------------------------------------

def _channels_last_trace(a) -> str | None:
    from ..efficiency.layout import conv_kernels, has_conversion_kernels

    if has_conversion_kernels(a.model):  # any conversion by name: not a layout without conversions
        return None
    conv = conv_kernels(a.model)
    if not len(conv):
        return None
    nhwc = name_mask(conv["name"], lambda n: bool(NHWC_CONV.search(head(n))))
    if float(conv.loc[np.asarray(nhwc, bool), "dur"].sum()) < 0.5 * float(conv["dur"].sum()):
        return None
    return "convolutions run NHWC kernels and no layout conversions"


def _expandable_facts(a) -> str | None:
    conf = runfacts.env_vars(a.facts).get("PYTORCH_CUDA_ALLOC_CONF", "")
    if re.search(r"expandable_segments\s*:\s*True", conf, re.I):
        return f"PYTORCH_CUDA_ALLOC_CONF={conf}"
    mem = a.memory
    if mem is not None and mem.allocator_settings.get("expandable_segments"):
        return "the allocator snapshot records expandable_segments"
    return None


SWITCHES: dict[str, Switch] = {s.key: s for s in (
    Switch("compile", "torch.compile",
           re.compile(r"torch\.compile\(model\)|compile the model|(?:fuse|fusing) [\w ,]*with torch\.compile|"
                      r"\(`torch\.compile`\)|`torch_compile=True`|dynamo_backend=", re.I),
           _compile_facts, compiled_evidence, against=_compile_against),
    Switch("cuda_graphs", "CUDA graphs",
           re.compile(r"replay the step as a CUDA graph|capture (?:the step|CUDA graphs)|mode=\\?\"reduce-overhead\\?\"|"
                      r"make_graphed_callables|torch\.cuda\.CUDAGraph", re.I),
           _graphs_facts, _graphs_trace),
    Switch("autocast", "bf16/fp16 autocast",
           re.compile(r"with torch\.autocast\(|(?:run|runs) [\w ]*(?:under|with) `torch\.autocast|bf16 autocast saves|"
                      r"`bf16=True`|precision=\"bf16-mixed\"|mixed_precision=\"bf16\"", re.I),
           _autocast_facts, _autocast_trace, _autocast_built_off, _autocast_against),
    Switch("tf32", "TF32 matmuls",
           re.compile(r"set_float32_matmul_precision|allow_tf32 = True|`tf32=True`", re.I),
           _tf32_facts, _tf32_trace, _tf32_built_off, _tf32_against),
    Switch("cudnn_benchmark", "cudnn.benchmark",
           re.compile(r"cudnn\.benchmark = True|turn cudnn\.benchmark on", re.I),
           _benchmark_facts, _invisible, _benchmark_built_off),
    Switch("pin_memory", "pinned DataLoader batches",
           # the loader's switch, not a pinned buffer of one's own (`torch.empty(..., pin_memory=True)`)
           re.compile(r"^(?!.*torch\.(?:empty|zeros|ones)\([^)]*pin_memory=True).*pin_memory=True", re.I | re.M),
           _pin_facts, _pin_trace, _pin_built_off),
    Switch("workers", "DataLoader worker processes",
           re.compile(r"give it worker processes|`num_workers` \(more than 0\)|in parallel worker processes", re.I),
           _workers_facts, _workers_trace, _workers_built_off, _workers_against),
    Switch("fused_optimizer", "a foreach/fused optimizer",
           re.compile(r"foreach=True|fused=True|adamw_torch_fused", re.I),
           _fused_facts, _fused_trace, _fused_built_off, _fused_against),
    Switch("set_to_none", "zero_grad(set_to_none=True)",
           re.compile(r"set_to_none=True", re.I),
           _invisible, _set_to_none_trace),
    Switch("no_sync", "DDP no_sync() during accumulation",
           re.compile(r"no_sync\(\)", re.I),
           _no_sync_facts, _invisible, _no_sync_built_off),
    Switch("channels_last", "channels_last memory format",
           re.compile(r"memory_format=torch\.channels_last", re.I),
           _invisible, _channels_last_trace),
    Switch("expandable_segments", "expandable_segments",
           re.compile(r"expandable_segments:True", re.I),
           _expandable_facts, _invisible),
)}


def without_what_is_on(fix: str, on: dict) -> str:
    """A rule's Fix text with the lines of its code blocks that ask for a switch the input shows on left out
    (`on`: `switches_on(a)`), so that no fix block asks a user who compiled to compile. Prose is the rule's
    own to word (it builds its advice from what is off)."""
    if not on or "```" not in fix:
        return fix
    lines = fix.split("\n")
    drop = [False] * len(lines)
    code = False
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            code = not code
            continue
        if not code or not any(SWITCHES[k].asks.search(line) for k in on):
            continue
        drop[i] = True
        indent = len(line) - len(line.lstrip())
        j = i - 1  # the comment lines right above it describe it
        while j >= 0 and lines[j].strip().startswith("#") and len(lines[j]) - len(lines[j].lstrip()) == indent:
            drop[j] = True
            j -= 1
        if line.split("#", 1)[0].rstrip().endswith(":"):  # a block it opens goes with it
            j = i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].strip().startswith("```") \
                    and len(lines[j]) - len(lines[j].lstrip()) > indent:
                drop[j] = True
                j += 1
    out = [line for line, gone in zip(lines, drop) if not gone]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out))
    text = re.sub(r"```python\n\n+", "```python\n", re.sub(r"\n\n+```\n", "\n```\n", text))
    return re.sub(r"```python\n```\n?", "", text).strip()  # a block left with no line goes too

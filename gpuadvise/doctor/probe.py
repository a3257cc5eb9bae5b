"""Facts about this machine and this torch build: one module for `gpuadvise doctor` and for the run.json
that `gpuadvise profile` writes, so the two never disagree.

Every function takes the torch module as an argument (or None when torch is missing): nothing here
imports torch itself except `load_torch()`, which `gpuadvise doctor` calls and which reports a missing
or broken torch instead of raising. Each fact is read on its own, guarded: a torch build that lacks an
API (older releases, CPU-only or ROCm builds) leaves that fact None, never an exception.

The CUDA calls are PyTorch's documented ones: `torch.cuda.is_available`, `device_count`,
`get_device_properties` (name, major, minor, total_memory, multi_processor_count; `gcnArchName` on
ROCm), `get_arch_list`, `mem_get_info`, `torch.version.cuda/hip`, `torch.backends.cudnn.version`,
`torch.cuda.nccl.version`. The NVIDIA driver version comes from /proc/driver/nvidia/version (torch
does not expose it), read as a file.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Callable


# ---------------------------------------------------------------------------------------------------
# Environment variables


def _truthy(v: str) -> bool:
    return v.strip().lower() not in ("", "0", "false", "no", "off")


def _when(verdict: str, test: Callable[[str], bool]) -> Callable[[str], str]:
    return lambda v: verdict if test(v) else "ok"


@dataclass(frozen=True)
class EnvVar:
    name: str
    judge: Callable[[str], str]  # value → "ok" | "info" | "warn" | "bad"
    why: str


# Variables that change how fast training runs. "bad": a debugging switch that costs real time when left
# on; "warn": costs time in some loops; "info": worth knowing, no verdict.
ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("CUDA_LAUNCH_BLOCKING", _when("bad", _truthy),
           "every CUDA kernel launch waits until the kernel has finished, so the CPU can never queue work ahead "
           "of the GPU (a debugging switch)"),
    EnvVar("HIP_LAUNCH_BLOCKING", _when("bad", _truthy),
           "ROCm's CUDA_LAUNCH_BLOCKING: every kernel launch waits for the kernel (a debugging switch)"),
    EnvVar("AMD_SERIALIZE_KERNEL", _when("bad", lambda v: v.strip() in ("1", "2", "3")),
           "ROCm waits for the GPU before and/or after every kernel (a debugging switch)"),
    EnvVar("PYTORCH_NO_CUDA_MEMORY_CACHING", _when("bad", _truthy),
           "turns the caching allocator off: every tensor is a cudaMalloc and a cudaFree, and cudaFree "
           "synchronises the device"),
    EnvVar("NVIDIA_TF32_OVERRIDE", _when("warn", lambda v: v.strip() == "0"),
           "0 turns TF32 off in every NVIDIA library, whatever torch's TF32 settings say"),
    EnvVar("TORCH_SHOW_CPP_STACKTRACES", _when("warn", _truthy),
           "every error raised from C++ also collects and symbolises a C++ stack trace: slow wherever the "
           "loop raises and catches exceptions"),
    EnvVar("NCCL_DEBUG", lambda v: {"TRACE": "bad", "INFO": "warn"}.get(v.strip().upper(), "ok"),
           "INFO logs every communicator and channel set-up, TRACE every collective call; WARN is the level "
           "to leave on"),
    EnvVar("NCCL_DEBUG_SUBSYS", lambda v: "info", "the NCCL subsystems NCCL_DEBUG logs"),
    EnvVar("TORCH_DISTRIBUTED_DEBUG", lambda v: {"DETAIL": "warn", "INFO": "info"}.get(v.strip().upper(), "ok"),
           "DETAIL checks every collective for consistency across ranks (an extra collective each time) and "
           "logs DDP's per-iteration statistics"),
    EnvVar("TORCH_CPP_LOG_LEVEL", lambda v: "info" if v.strip().upper() == "INFO" else "ok",
           "c10d's C++ log level; INFO prints distributed set-up details"),
    EnvVar("TORCH_NCCL_BLOCKING_WAIT", _when("warn", _truthy),
           "the training thread blocks in every collective until it completes, instead of NCCL running "
           "asynchronously"),
    EnvVar("NCCL_BLOCKING_WAIT", _when("warn", _truthy),
           "the old name of TORCH_NCCL_BLOCKING_WAIT: the training thread blocks in every collective"),
    EnvVar("TORCH_USE_CUDA_DSA", _when("warn", _truthy),
           "device-side assertions: extra checks in kernels (in builds compiled with them)"),
    EnvVar("TORCH_COMPILE_DEBUG", _when("warn", _truthy),
           "torch.compile writes debug traces and the generated code of every graph it compiles"),
    EnvVar("TORCHDYNAMO_DISABLE", _when("warn", _truthy),
           "torch.compile is switched off: compiled models run eagerly"),
    EnvVar("TORCHINDUCTOR_FORCE_DISABLE_CACHES", _when("warn", _truthy),
           "Inductor's caches are off: every run compiles every graph from scratch"),
    EnvVar("TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS", lambda v: "info",
           "dynamo traces `.item()` into the graph instead of breaking it there"),
    EnvVar("TORCH_TRACE", lambda v: "info" if v.strip() else "ok",
           "torch.compile writes its structured trace (tlparse) to this folder"),
    EnvVar("TORCH_LOGS", lambda v: "info" if v.strip() else "ok",
           "torch.compile / distributed logging; verbose artifacts slow compilation down"),
    EnvVar("CUBLAS_WORKSPACE_CONFIG", lambda v: "info" if v.strip() else "ok",
           "set for deterministic cuBLAS; ':16:8' trades speed for a smaller workspace"),
    EnvVar("CUDNN_LOGINFO_DBG", _when("warn", _truthy), "cuDNN logs every API call"),
    EnvVar("CUDNN_LOGLEVEL_DBG", _when("warn", lambda v: v.strip() not in ("", "0")), "cuDNN logs API calls"),
    EnvVar("CUBLAS_LOGINFO_DBG", _when("warn", _truthy), "cuBLAS logs every API call"),
    EnvVar("CUBLASLT_LOG_LEVEL", _when("warn", lambda v: v.strip() not in ("", "0")), "cuBLASLt logs API calls"),
    EnvVar("CUDA_VISIBLE_DEVICES", lambda v: "info", "the GPUs this process may use"),
    EnvVar("OMP_NUM_THREADS", lambda v: "info", "CPU threads each process uses inside ops"),
    EnvVar("PYTORCH_CUDA_ALLOC_CONF", lambda v: "info", "caching-allocator settings"),
    EnvVar("PYTORCH_ALLOC_CONF", lambda v: "info", "caching-allocator settings (the newer, device-generic name)"),
    EnvVar("PYTORCH_HIP_ALLOC_CONF", lambda v: "info", "caching-allocator settings on ROCm"),
)
ENV_BY_NAME = {e.name: e for e in ENV_VARS}
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def env_facts(environ=None) -> dict[str, str]:
    """The watched variables that are set, with their values."""
    environ = os.environ if environ is None else environ
    return {e.name: str(environ[e.name]) for e in ENV_VARS if e.name in environ}


def judge_env(name: str, value: str) -> tuple[str, str]:
    """(verdict, why) for one watched variable's value."""
    e = ENV_BY_NAME.get(name)
    if e is None:
        return "info", ""
    try:
        return e.judge(str(value)), e.why
    except Exception:  # a value the judge cannot read: say nothing about it
        return "info", e.why


def slow_env(env: dict | None) -> list[dict]:
    """The set variables whose values slow training ("warn" or "bad"), worst first."""
    out = []
    for name, value in (env or {}).items():
        if not isinstance(value, str):
            continue
        verdict, why = judge_env(name, value)
        if verdict in ("warn", "bad"):
            out.append({"name": name, "value": value, "verdict": verdict, "why": why})
    return sorted(out, key=lambda d: (d["verdict"] != "bad", d["name"]))


# ---------------------------------------------------------------------------------------------------
# torch


def load_torch():
    """(torch, None), or (None, why) when torch is missing or fails to import."""
    try:
        import importlib

        return importlib.import_module("torch"), None
    except ModuleNotFoundError as exc:
        if exc.name == "torch" or "torch" in str(exc):
            return None, "not installed"
        return None, f"import failed: {type(exc).__name__}: {exc}"
    except Exception as exc:  # a broken install (missing shared library, ABI mismatch, ...)
        return None, f"import failed: {type(exc).__name__}: {exc}"


@contextlib.contextmanager
def warnings_held(record: bool = False):
    """Ignore (with `record`: collect, as a list of `warnings.WarningMessage`) the warnings the body raises,
    and leave the script's own warnings as they were.

    `catch_warnings`, `simplefilter` and `filterwarnings` cannot do that inside a running script: each change
    to the filters bumps the warnings module's version, which empties every module's record of the warnings
    it has shown, so every once-per-location warning the script already printed prints again (a run.json
    write a step did that to each of them). Here one filter goes in front of the list in place and comes out
    again, the version untouched: "ignore" and "always" leave no record behind, so a warning the body
    raised still shows when the script raises it. Another thread's warning in those microseconds is
    ignored (it shows the next time it is raised) or, while recording, shown."""
    filters = warnings.filters
    entry = ("always" if record else "ignore", None, Warning, None, 0)
    caught: list = []
    shown = getattr(warnings, "_showwarnmsg", None)  # what the C warnings code calls to show one
    record = record and callable(shown)
    me = threading.get_ident()

    def keep(msg):
        if threading.get_ident() == me:
            caught.append(msg)
        else:
            shown(msg)

    filters.insert(0, entry)
    if record:
        warnings._showwarnmsg = keep
    try:
        yield caught
    finally:
        if record:
            warnings._showwarnmsg = shown
        for i, f in enumerate(filters):
            if f is entry:
                del filters[i]
                break


def _get(fn, default=None):
    try:
        with warnings_held():  # deprecation notes of the TF32 getters and the like
            return fn()
    except Exception:
        return default


def cuda_available(torch) -> tuple[bool, str | None]:
    """Whether torch can use a GPU, and torch's own explanation when it cannot (the warning
    `torch.cuda.is_available()` raises on a driver/runtime mismatch)."""
    try:
        with warnings_held(record=True) as caught:
            ok = bool(torch.cuda.is_available())
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    why = next((str(w.message).strip().splitlines()[0] for w in caught if "CUDA" in str(w.message) or "HIP" in str(w.message)), None)
    return ok, why


def _nccl_version(torch) -> str | None:
    if not hasattr(torch, "_C") or not hasattr(torch._C, "_nccl_version"):
        return None  # built without NCCL (CPU-only, macOS, Windows)

    def read():
        import torch.cuda.nccl as nccl

        v = nccl.version()
        return ".".join(str(x) for x in v[:3]) + ("".join(str(x) for x in v[3:]) if len(v) > 3 else "")

    return _get(read)


def torch_facts(torch) -> dict:
    v = getattr(torch, "version", None)
    cuda, hip = getattr(v, "cuda", None), getattr(v, "hip", None)
    out = {"installed": True, "version": str(getattr(torch, "__version__", "?")),
           "build": "rocm" if hip else "cuda" if cuda else "cpu", "cuda": cuda, "hip": hip,
           "debug_build": getattr(v, "debug", None)}
    available, why = cuda_available(torch)
    out["cuda_available"] = available
    if why and not available and (cuda or hip):
        out["cuda_error"] = why
    out["device_count"] = _get(torch.cuda.device_count, 0) if available else 0
    out["arch_list"] = _get(torch.cuda.get_arch_list, []) if (cuda or hip) else []
    out["cudnn"] = {"available": bool(_get(torch.backends.cudnn.is_available, False)),
                    "version": _get(torch.backends.cudnn.version) if (cuda or hip) else None,
                    "enabled": _get(lambda: bool(torch.backends.cudnn.enabled))}
    out["nccl"] = _nccl_version(torch) if (cuda or hip) else None
    out["threads"] = _get(torch.get_num_threads)
    return out


def backend_flags(torch) -> dict:
    """The settings that change speed, as they are now in this process."""
    b = torch.backends
    return {
        "cudnn_benchmark": _get(lambda: bool(b.cudnn.benchmark)),
        "cudnn_deterministic": _get(lambda: bool(b.cudnn.deterministic)),
        "cudnn_enabled": _get(lambda: bool(b.cudnn.enabled)),
        "cudnn_allow_tf32": _get(lambda: bool(b.cudnn.allow_tf32)),
        "matmul_allow_tf32": _get(lambda: bool(b.cuda.matmul.allow_tf32)),
        "float32_matmul_precision": _get(torch.get_float32_matmul_precision),
        # the per-backend precision API of newer torch ("ieee", "tf32", "none" = inherit); None before it
        "matmul_fp32_precision": _get(lambda: b.cuda.matmul.fp32_precision),
        "conv_fp32_precision": _get(lambda: b.cudnn.conv.fp32_precision),
        "deterministic_algorithms": _get(lambda: bool(torch.are_deterministic_algorithms_enabled())),
        "deterministic_warn_only": _get(lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled())),
        "anomaly_detection": _get(lambda: bool(torch.is_anomaly_enabled())),
        "anomaly_check_nan": _get(lambda: bool(torch.is_anomaly_check_nan_enabled())),
        # the threads torch runs an op on, and those between ops (inter-op), as the script set them
        "num_threads": _get(lambda: torch.get_num_threads()),
        "num_interop_threads": _get(lambda: torch.get_num_interop_threads()),
    }


# Tensor Core generations by compute capability (NVIDIA's architecture whitepapers).
_NVIDIA_TC = [
    ((7, 0), "1st gen (Volta)", {"fp16"}),
    ((7, 2), "1st gen (Volta)", {"fp16"}),
    ((7, 5), "2nd gen (Turing)", {"fp16", "int8"}),
    ((8, 0), "3rd gen (Ampere)", {"fp16", "bf16", "tf32", "int8"}),
    ((8, 6), "3rd gen (Ampere)", {"fp16", "bf16", "tf32", "int8"}),
    ((8, 7), "3rd gen (Ampere)", {"fp16", "bf16", "tf32", "int8"}),
    ((8, 9), "4th gen (Ada)", {"fp16", "bf16", "tf32", "int8", "fp8"}),
    ((9, 0), "4th gen (Hopper)", {"fp16", "bf16", "tf32", "int8", "fp8"}),
]
_AMD_MATRIX = [
    (re.compile(r"^gfx908"), "matrix cores (CDNA 1, MI100)", {"fp16", "bf16"}),
    (re.compile(r"^gfx90a"), "matrix cores (CDNA 2, MI200)", {"fp16", "bf16"}),
    (re.compile(r"^gfx94\d"), "matrix cores (CDNA 3, MI300)", {"fp16", "bf16", "fp8"}),
    (re.compile(r"^gfx95\d"), "matrix cores (CDNA 4, MI350)", {"fp16", "bf16", "fp8"}),
    (re.compile(r"^gfx11\d\d"), "WMMA (RDNA 3)", {"fp16", "bf16"}),
    (re.compile(r"^gfx12\d\d"), "WMMA (RDNA 4)", {"fp16", "bf16"}),
]


def tensor_cores(vendor: str, capability, arch: str | None = None) -> dict:
    """{"generation": str | None, "formats": [...]}: None when the GPU has no Tensor Cores / matrix cores."""
    if vendor == "amd":
        for pattern, label, formats in _AMD_MATRIX:
            if arch and pattern.match(arch):
                return {"generation": label, "formats": sorted(formats)}
        return {"generation": None, "formats": []}
    try:
        major, minor = int(capability[0]), int(capability[1])
    except (TypeError, ValueError, IndexError):
        return {"generation": None, "formats": []}
    if major < 7:
        return {"generation": None, "formats": []}
    if major >= 10:
        return {"generation": "5th gen (Blackwell)" if major <= 12 else f"newer than Blackwell (sm_{major}{minor})",
                "formats": sorted({"fp16", "bf16", "tf32", "int8", "fp8", "fp4"})}
    best = None
    for cc, label, formats in _NVIDIA_TC:
        if cc <= (major, minor):
            best = (label, formats)
    return {"generation": best[0], "formats": sorted(best[1])} if best else {"generation": None, "formats": []}


def gpu_facts(torch, free_memory: bool = False) -> list[dict]:
    """Each visible GPU. `free_memory` asks the driver how much is free, which creates a CUDA context on
    every GPU: doctor does, a profiled training process must not."""
    out = []
    hip = getattr(getattr(torch, "version", None), "hip", None)
    count = _get(torch.cuda.device_count, 0) if cuda_available(torch)[0] else 0
    for i in range(count or 0):
        p = _get(lambda: torch.cuda.get_device_properties(i))
        if p is None:
            out.append({"index": i, "error": "get_device_properties failed"})
            continue
        arch = getattr(p, "gcnArchName", None) if hip else None
        vendor = "amd" if hip else "nvidia"
        g = {"index": i, "name": str(getattr(p, "name", "?")), "vendor": vendor,
             "capability": [int(p.major), int(p.minor)], "memory_bytes": int(p.total_memory),
             "multiprocessors": getattr(p, "multi_processor_count", None), "arch": arch,
             "tensor_cores": tensor_cores(vendor, (p.major, p.minor), arch)}
        if free_memory:
            free = _get(lambda: torch.cuda.mem_get_info(i))
            g["free_bytes"] = int(free[0]) if free else None
        out.append(g)
    return out


# ---------------------------------------------------------------------------------------------------
# The machine


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096)
    except OSError:
        return None


_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def driver_facts() -> dict:
    nv = _read("/proc/driver/nvidia/version")
    m = _NVRM.search(nv or "")
    amd = _read("/sys/module/amdgpu/version")
    return {"nvidia": m.group(1) if m else None, "nvidia_loaded": nv is not None or os.path.exists("/dev/nvidiactl"),
            "amdgpu": amd.strip() if amd else None, "amdgpu_loaded": os.path.exists("/dev/kfd")}


def _cgroup_cpus() -> float | None:
    """The container's CPU quota in cores (cgroup v2 cpu.max, else v1 cfs quota), None when unlimited."""
    text = _read("/sys/fs/cgroup/cpu.max")
    if text:
        parts = text.split()
        if len(parts) >= 2 and parts[0] != "max":
            try:
                return round(int(parts[0]) / int(parts[1]), 2)
            except (ValueError, ZeroDivisionError):
                return None
        return None
    quota, period = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return round(q / p, 2) if q > 0 and p > 0 else None


# the CPU flags that say which 16-bit float types the CPU computes in (Linux /proc/cpuinfo's names): x86's
# AVX-512 and AMX bf16/fp16 instructions, Arm's BF16 and half-precision SIMD; the vector extensions beside them
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "amx_tile",
             "bf16", "asimdhp", "fphp", "sve")


def cpu_facts() -> dict:
    usable = None
    if hasattr(os, "sched_getaffinity"):
        try:
            usable = len(os.sched_getaffinity(0))
        except OSError:
            usable = None
    return {"logical": os.cpu_count(), "usable": usable, "cgroup_limit": _cgroup_cpus(), **_cpu_model()}


def _cpu_model(path: str = "/proc/cpuinfo") -> dict:
    """The CPU's model name and which of CPU_FLAGS it has ("flags": None where /proc/cpuinfo is not there
    to read: not Linux)."""
    try:  # the first core's block: a few KB, its flags line the longest (the AMX flags come last)
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 16)
    except OSError:
        text = None
    if not text:
        return {"model": platform.processor() or None, "flags": None}
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and model is None:
            model = value.strip() or None
        elif key in ("flags", "features") and not flags:  # x86's flags, Arm's features: the first core's
            flags = set(value.split())
    return {"model": model, "flags": sorted(f for f in CPU_FLAGS if f in flags)}


def shm_facts(path: str = "/dev/shm") -> dict | None:
    """Size of the shared-memory filesystem DataLoader workers hand batches through (Linux)."""
    if not os.path.isdir(path):
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return {"path": path, "total_bytes": st.f_frsize * st.f_blocks, "free_bytes": st.f_frsize * st.f_bavail}


def triton_facts() -> dict:
    """Whether Triton (torch.compile's GPU code generator) is importable, without importing it."""
    import importlib.metadata
    import importlib.util

    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        found = False
    version = None
    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "triton-rocm"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"installed": found, "version": version if found else None}


def compile_facts(torch=None) -> dict:
    """What `gpuadvise profile` can record about torch.compile with this torch (found without importing
    dynamo): the structured trace (torch >= 2.2: graph breaks with their file:line, recompiles with their
    guard, compile time per frame) or only dynamo's counters (older torch)."""
    import importlib.util

    if torch is None:
        return {"structured_trace": None}
    try:
        found = importlib.util.find_spec("torch._logging._internal") is not None
    except (ImportError, ValueError):
        found = False
    return {"structured_trace": found}


def python_facts() -> dict:
    return {"version": platform.python_version(), "implementation": platform.python_implementation(),
            "executable": sys.executable}


def collect(torch=None, torch_error: str | None = None, free_memory: bool = False) -> dict:
    """Every fact doctor reports (run.json keeps the same dict under environment.machine)."""
    facts = {
        "python": python_facts(),
        "platform": {"system": platform.system(), "machine": platform.machine(), "release": platform.release()},
        "torch": {"installed": False, "error": torch_error or "not installed"},
        "gpus": [],
        "settings": {},
        "env": env_facts(),
        "cpu": cpu_facts(),
        "shm": shm_facts(),
        "driver": driver_facts(),
        "triton": triton_facts(),
    }
    if torch is not None:
        facts["torch"] = torch_facts(torch)
        facts["gpus"] = gpu_facts(torch, free_memory=free_memory)
        facts["settings"] = backend_flags(torch)
        facts["compile"] = compile_facts(torch)
    return facts


def environment(torch) -> dict:
    """run.json's `environment`: the summary keys analyze has always read, plus every doctor fact."""
    facts = collect(torch)
    t = facts["torch"]
    env = {"torch": t.get("version"), "cuda": t.get("cuda"), "hip": t.get("hip"),
           "python": facts["python"]["version"], "cuda_available": bool(t.get("cuda_available")),
           "cudnn": (t.get("cudnn") or {}).get("version")}
    device = current_device(torch, facts["gpus"])
    if device:
        env["device"] = device
    facts["python"].pop("executable", None)  # a run folder travels; the interpreter's path says nothing
    env["machine"] = facts
    return env


def current_device(torch, gpus: list[dict]) -> dict | None:
    """The GPU this process computes on (torch.cuda.current_device(): the rank's own under torchrun)."""
    gpus = [g for g in gpus if "name" in g]
    if not gpus:
        return None
    idx = _get(torch.cuda.current_device, 0) or 0
    g = next((g for g in gpus if g["index"] == idx), gpus[0])
    return {"name": g["name"], "capability": g["capability"], "total_memory": g["memory_bytes"], "count": len(gpus)}

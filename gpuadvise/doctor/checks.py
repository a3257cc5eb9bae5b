"""Verdicts on the facts `probe.collect()` gathered: one line per thing a user would check.

A check is a dict: `id` (stable, for scripts), `label`, `value` (what was found, as text), `verdict`
(ok: fine; info: worth knowing; warn: costs speed in some loops; bad: broken or costs speed in every
loop) and `note` (why, and what to do). `judge` is a pure function of the facts, so every branch,
GPU ones included, is testable on any machine.
"""

from __future__ import annotations

import re

from . import probe

VERDICTS = ("ok", "info", "warn", "bad")
GiB = 2**30
MiB = 2**20
SHM_BAD = 256 * MiB  # Docker's default is 64 MiB: workers die with "bus error" at the first big batch
SHM_WARN = 2 * GiB  # 8 workers × prefetch_factor 2 × one 150 MB image batch already need 2.4 GB


def judge(facts: dict, workers: int | None = None) -> list[dict]:
    out: list[dict] = []

    def add(id_, label, value, verdict, note=""):
        out.append({"id": id_, "label": label, "value": value, "verdict": verdict, "note": note})

    py = facts.get("python") or {}
    add("python", "Python", f"{py.get('version', '?')} ({py.get('implementation', '?')})", "ok")

    t = facts.get("torch") or {}
    drv = facts.get("driver") or {}
    gpus = [g for g in facts.get("gpus") or [] if "name" in g]
    if not t.get("installed"):
        why = t.get("error") or "not installed"
        add("torch", "torch", why, "bad",
            "`gpuadvise profile` needs torch (pip install torch); `analyze`, `view` and `doctor` work without it. "
            "The checks that need torch are skipped.")
    else:
        _torch_lines(add, t, drv, gpus)
        _gpu_lines(add, t, gpus)
        _setting_lines(add, facts.get("settings") or {}, t, gpus)
    _alloc_conf_line(add, facts.get("env") or {})
    _env_lines(add, facts.get("env") or {})
    _cpu_line(add, facts.get("cpu") or {}, t, len(gpus), workers)
    _shm_line(add, facts.get("shm"))
    _triton_line(add, facts.get("triton") or {}, t)
    _compile_line(add, facts.get("compile") or {}, t)
    return out


def summary(checks: list[dict]) -> dict:
    return {v: sum(1 for c in checks if c["verdict"] == v) for v in VERDICTS}


# ---------------------------------------------------------------------------------------------------


def _torch_lines(add, t: dict, drv: dict, gpus: list[dict]) -> None:
    build = t.get("build")
    what = {"cpu": "CPU-only build", "cuda": f"CUDA {t.get('cuda')} build", "rocm": f"ROCm/HIP {t.get('hip')} build"}.get(build, build)
    verdict, note = "ok", ""
    if build == "cpu" and drv.get("nvidia_loaded"):
        verdict, note = "bad", ("this machine has an NVIDIA driver but torch is a CPU-only build, so training runs on "
                                "the CPU: install a CUDA build (pytorch.org/get-started)")
    elif build == "cpu":
        verdict, note = "info", "fine for this machine, which has no NVIDIA driver loaded"
    if t.get("debug_build"):
        verdict, note = "warn", "a debug build of torch: every op runs much slower than in a release build"
    add("torch", "torch", f"{t.get('version')} ({what})", verdict, note)

    label = "ROCm/HIP" if build == "rocm" else "CUDA"
    if build == "cpu":
        add("cuda", label, "not in this build", "info")
    elif t.get("cuda_available"):
        runtime = t.get("hip") if build == "rocm" else t.get("cuda")
        add("cuda", label, f"runtime {runtime}, {t.get('device_count', 0)} GPU(s) visible", "ok")
    else:
        add("cuda", label, "not available", "bad",
            (t.get("cuda_error") or "no GPU visible to this build") +
            " (check the driver, CUDA_VISIBLE_DEVICES and that the driver supports this CUDA runtime)")

    if drv.get("nvidia"):
        add("driver", "NVIDIA driver", drv["nvidia"], "ok" if build == "cuda" else "info")
    elif drv.get("amdgpu") or drv.get("amdgpu_loaded"):
        add("driver", "amdgpu driver", drv.get("amdgpu") or "loaded", "ok" if build == "rocm" else "info")
    elif build == "cuda" and not t.get("cuda_available"):
        add("driver", "NVIDIA driver", "not loaded", "bad", "/proc/driver/nvidia/version is missing: no NVIDIA kernel driver")
    else:
        add("driver", "GPU driver", "none loaded", "info" if build == "cpu" else "ok")

    if build in ("cuda", "rocm"):
        lib = "MIOpen" if build == "rocm" else "cuDNN"
        cd = t.get("cudnn") or {}
        if not cd.get("available"):
            add("cudnn", lib, "not in this build", "warn", "convolutions use PyTorch's slower native kernels")
        elif cd.get("enabled") is False:
            add("cudnn", lib, _cudnn_version(cd.get("version"), build), "warn",
                "torch.backends.cudnn.enabled is False: convolutions skip it")
        else:
            add("cudnn", lib, _cudnn_version(cd.get("version"), build), "ok")
        if t.get("nccl"):
            add("nccl", "NCCL" if build == "cuda" else "RCCL", t["nccl"], "ok")
        else:
            add("nccl", "NCCL", "not in this build", "info", "multi-GPU DistributedDataParallel needs NCCL (gloo is far slower on GPUs)")


def _cudnn_version(v, build: str) -> str:
    if not isinstance(v, int):
        return "unknown version"
    if build == "rocm":
        return str(v)
    # cuDNN 9 encodes major*10000 + minor*100 + patch, cuDNN 8 and older major*1000 + minor*100 + patch
    major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


_ARCH = re.compile(r"^(sm|compute|gfx)_?(\d+)([a-z]?)")


def arch_supported(arch_list: list, capability) -> bool | None:
    """Whether a build's `get_arch_list()` can run on a GPU of this compute capability: a cubin for the same
    major and an equal or lower minor (sm_80 runs on 8.6), or PTX (compute_XY) at or below it, which the
    driver compiles. Arch-specific targets (sm_90a) run only on that exact GPU. None: cannot tell."""
    if not arch_list or not capability:
        return None
    major, minor = int(capability[0]), int(capability[1])
    dev = major * 10 + minor
    seen = False
    for a in arch_list:
        m = _ARCH.match(str(a))
        if not m or m.group(1) == "gfx":
            continue
        seen = True
        num = int(m.group(2))
        if m.group(1) == "sm":
            if m.group(3):  # sm_90a, sm_100a: no forward compatibility
                if num == dev:
                    return True
            elif num // 10 == major and num <= dev:
                return True
        elif num <= dev:
            return True
    return False if seen else None


def _gpu_lines(add, t: dict, gpus: list[dict]) -> None:
    for g in gpus:
        cap = g.get("capability") or [0, 0]
        tc = (g.get("tensor_cores") or {}).get("generation")
        arch = g.get("arch") or f"sm_{cap[0]}{cap[1]}"
        mem = g.get("memory_bytes") or 0
        value = f"{g['name']}, {arch}, {mem / GiB:.1f} GiB, Tensor Cores: {tc or 'none'}"
        verdict, notes = "ok", []
        if tc is None:
            verdict = "warn"
            notes.append("no Tensor Cores / matrix cores: fp16/bf16 autocast will not speed matmuls up much")
        elif "tf32" not in (g.get("tensor_cores") or {}).get("formats", []) and g.get("vendor") == "nvidia":
            notes.append("no TF32 or bf16 on this generation: use fp16 autocast with a GradScaler")
        free = g.get("free_bytes")
        if isinstance(free, int) and mem and free < 0.5 * mem:
            verdict = "warn"
            notes.append(f"{(mem - free) / GiB:.1f} GiB of it is already in use (another process?)")
        if g.get("vendor") == "nvidia" and arch_supported(t.get("arch_list") or [], cap) is False:
            verdict = "bad"
            notes.append(f"this torch build has no kernels for sm_{cap[0]}{cap[1]} (it targets "
                         f"{', '.join(t.get('arch_list') or [])}): install a build that supports this GPU")
        add(f"gpu{g.get('index', 0)}", f"GPU {g.get('index', 0)}", value, verdict, "; ".join(notes))


def _onoff(v) -> str:
    return "?" if v is None else ("on" if v else "off")


def _setting_lines(add, s: dict, t: dict, gpus: list[dict]) -> None:
    tf32_gpu = any("tf32" in (g.get("tensor_cores") or {}).get("formats", []) for g in gpus)
    matmul_tf32 = s.get("matmul_allow_tf32") or s.get("float32_matmul_precision") in ("high", "medium")
    value = (f"matmul {_onoff(matmul_tf32)} (float32_matmul_precision={s.get('float32_matmul_precision')!r}), "
             f"cuDNN conv {_onoff(s.get('cudnn_allow_tf32'))}")
    if not gpus:
        add("tf32", "TF32 default", value, "info", "TF32 only matters on Ampere or newer NVIDIA GPUs")
    elif tf32_gpu and not matmul_tf32:
        add("tf32", "TF32 default", value, "warn",
            "fp32 matmuls run on the slower fp32 path by default: torch.set_float32_matmul_precision('high') "
            "(TF32) or bf16 autocast puts them on Tensor Cores")
    else:
        add("tf32", "TF32 default", value, "ok")

    if (t.get("cudnn") or {}).get("available"):
        add("cudnn_benchmark", "cudnn.benchmark default", _onoff(s.get("cudnn_benchmark")), "info",
            "off by default: set torch.backends.cudnn.benchmark = True in convnets whose input shapes do not "
            "change (see `gpuadvise explain cudnn-benchmark`)" if not s.get("cudnn_benchmark") else "")
    det = s.get("deterministic_algorithms")
    if det or s.get("cudnn_deterministic"):
        add("deterministic", "deterministic algorithms", f"torch {_onoff(det)}, cuDNN {_onoff(s.get('cudnn_deterministic'))}",
            "warn", "on by default in this environment: deterministic kernels are often slower")
    else:
        add("deterministic", "deterministic algorithms", "off", "ok")
    anomaly = s.get("anomaly_detection")
    add("anomaly", "autograd anomaly detection", _onoff(anomaly), "bad" if anomaly else "ok",
        "on by default in this environment: every backward op is checked for NaNs (a device sync each)" if anomaly else "")


def _alloc_conf_line(add, env: dict) -> None:
    set_ = {k: env[k] for k in probe.ALLOC_CONF_VARS if k in env}
    if not set_:
        add("alloc_conf", "allocator config", "(defaults)", "info",
            "PYTORCH_CUDA_ALLOC_CONF is unset; expandable_segments:True helps when memory fragments "
            "(see `gpuadvise explain memory-fragmentation`)")
        return
    value = ", ".join(f"{k}={v}" for k, v in set_.items())
    conf = ",".join(set_.values()).replace(" ", "").lower()
    notes = []
    if "expandable_segments:true" in conf:
        notes.append("expandable segments on: the allocator grows segments instead of fragmenting")
    if "backend:cudamallocasync" in conf:
        notes.append("CUDA's own asynchronous allocator instead of PyTorch's caching allocator")
    if len(set_) > 1:
        notes.append("several allocator variables are set: keep one so it is clear which settings apply")
    add("alloc_conf", "allocator config", value, "info", "; ".join(notes))


def _env_lines(add, env: dict) -> None:
    slowing = False
    for e in probe.ENV_VARS:
        if e.name not in env or e.name in probe.ALLOC_CONF_VARS:
            continue
        verdict, why = probe.judge_env(e.name, env[e.name])
        if verdict == "ok":
            continue
        slowing = slowing or verdict in ("warn", "bad")
        add(f"env:{e.name}", e.name, env[e.name], verdict, why)
    if not slowing:
        add("env", "debug environment variables", "none set", "ok")


def _cpu_line(add, cpu: dict, t: dict, ngpus: int, workers: int | None) -> None:
    logical, usable, limit = cpu.get("logical"), cpu.get("usable"), cpu.get("cgroup_limit")
    cores = min(x for x in (logical, usable, int(limit) if limit else None) if x) if (logical or usable) else None
    parts = [f"{logical} logical"]
    if usable is not None and usable != logical:
        parts.append(f"{usable} usable (CPU affinity)")
    if limit:
        parts.append(f"container limit {limit:g}")
    if t.get("threads"):
        parts.append(f"torch uses {t['threads']} threads per process")
    value = ", ".join(parts)
    procs = max(ngpus, 1)
    if cores is None:
        add("cpu", "CPU cores", value, "info")
        return
    if workers is None:
        per = max(cores // procs - 1, 0)
        add("cpu", "CPU cores", value, "info",
            f"about {per} DataLoader workers per training process fit: {cores} cores for {_procs(procs)} (one per "
            "GPU), each also busy in its own main loop; `gpuadvise doctor --workers N` checks a value")
        return
    need = procs * (workers + 1)
    if need > cores:
        add("cpu", "CPU cores", value, "warn",
            f"{workers} workers for each of {_procs(procs)}, plus the main loops, make {need} busy processes on "
            f"{cores} cores: they compete for CPU and batches arrive late; try num_workers={max(cores // procs - 1, 0)}")
    else:
        add("cpu", "CPU cores", value, "ok", f"{workers} workers for each of {_procs(procs)}, plus the main loops, "
                                             f"fit in {cores} cores")


def _procs(n: int) -> str:
    return f"{n} training process{'es' if n != 1 else ''}"


def _shm_line(add, shm: dict | None) -> None:
    if not shm:
        add("shm", "/dev/shm", "not present", "info", "not Linux: DataLoader workers use the platform's own shared memory")
        return
    total, free = shm.get("total_bytes") or 0, shm.get("free_bytes") or 0
    value = f"{_size(total)} ({_size(free)} free)"
    fix = "in Docker: --shm-size=16g or --ipc=host; on Kubernetes: an emptyDir with medium Memory at /dev/shm"
    if total < SHM_BAD:
        add("shm", "/dev/shm", value, "bad",
            "DataLoader workers hand every batch over through /dev/shm: this little fails with 'bus error' or "
            f"'No space left on device' once batches grow; {fix}")
    elif total < SHM_WARN:
        add("shm", "/dev/shm", value, "warn",
            f"workers × prefetch_factor batches live here at once; large image or video batches need more: {fix}")
    else:
        add("shm", "/dev/shm", value, "ok")


def _triton_line(add, tr: dict, t: dict) -> None:
    value = (tr.get("version") or "installed") if tr.get("installed") else "not installed"
    gpu_build = t.get("installed") and t.get("build") in ("cuda", "rocm")
    if tr.get("installed"):
        add("triton", "Triton (torch.compile)", value, "ok" if gpu_build else "info")
    elif gpu_build:
        add("triton", "Triton (torch.compile)", value, "warn",
            "torch.compile's GPU backend (Inductor) generates Triton kernels: without it compile fails on the GPU "
            "(pip install triton; CUDA wheels of torch normally bring it)")
    else:
        add("triton", "Triton (torch.compile)", value, "info", "not needed on the CPU: Inductor generates C++ there")


def _compile_line(add, c: dict, t: dict) -> None:
    """What `gpuadvise profile` can tell about a compiled model with this torch."""
    if not t.get("installed"):
        return
    if c.get("structured_trace"):
        add("compile", "torch.compile recording", "structured trace", "ok",
            "profile records each graph break with its file:line, each recompile with its failing guard, "
            "compile time per step")
    else:
        add("compile", "torch.compile recording", "counters only", "info",
            "this torch has no structured trace (torch < 2.2): profile records graph-break reasons and graph "
            "counts, without file:line or recompile reasons")


def _size(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"

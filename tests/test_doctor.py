"""`gpuadvise doctor`: its JSON, the verdicts on planted environment variables, a machine without torch,
and every GPU branch of the fact probe and the verdicts, on a fake torch that offers exactly PyTorch's
documented CUDA API (this CI machine has no GPU).

The real command runs in subprocesses (planted variables must reach a fresh process); the verdict logic
is a pure function of the facts and is tested directly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest

from gpuadvise.doctor import checks, probe

GiB = 2**30
MiB = 2**20


def doctor(*args: str, env: dict | None = None, drop=(), code: str | None = None) -> subprocess.CompletedProcess:
    """`python -m gpuadvise doctor ARGS` with `env` added to (and `drop` removed from) this environment."""
    e = {k: v for k, v in os.environ.items() if k not in drop and k != "GPUADVISE_DEBUG"}
    for name in probe.ENV_BY_NAME:  # start from a clean slate: only what a test plants
        e.pop(name, None)
    e.update(env or {})
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "gpuadvise", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)


def by_id(doc: dict) -> dict:
    return {c["id"]: c for c in doc["checks"]}


PLANTED = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO", "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
           "TORCH_SHOW_CPP_STACKTRACES": "1", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@pytest.fixture(scope="module")
def planted():
    proc = doctor("--format", "json", env=PLANTED)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return json.loads(proc.stdout)


# ----------------------------------------------------------------------------------------------------
# The command


@pytest.mark.slow
def test_json_has_every_field(planted):
    torch = pytest.importorskip("torch")
    assert set(planted) == {"gpuadvise", "facts", "checks", "summary"}
    f = planted["facts"]
    assert set(f) == {"python", "platform", "torch", "gpus", "settings", "env", "cpu", "shm", "driver", "triton",
                      "compile"}
    assert f["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    t = f["torch"]
    assert t["installed"] is True and t["version"] == torch.__version__
    assert t["build"] == ("rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu")
    assert t["cuda_available"] == torch.cuda.is_available()
    assert len(f["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for key in ("cudnn_benchmark", "matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision",
                "deterministic_algorithms", "anomaly_detection"):
        assert key in f["settings"], key
    assert f["settings"]["cudnn_benchmark"] is False and f["settings"]["anomaly_detection"] is False  # torch's defaults
    assert f["cpu"]["logical"] == os.cpu_count()
    assert set(f["triton"]) == {"installed", "version"}
    assert f["compile"] == {"structured_trace": True}  # torch >= 2.2 ships torch._logging's structured trace
    # checks: ids unique, verdicts known, the summary counts them
    ids = [c["id"] for c in planted["checks"]]
    assert len(ids) == len(set(ids))
    assert all(c["verdict"] in checks.VERDICTS and c["label"] and isinstance(c["value"], str) for c in planted["checks"])
    assert planted["summary"] == {v: sum(c["verdict"] == v for c in planted["checks"]) for v in checks.VERDICTS}
    for required in ("python", "torch", "cuda", "tf32", "deterministic", "anomaly", "alloc_conf", "cpu", "shm", "triton",
                     "compile"):
        assert required in ids, required


@pytest.mark.slow
def test_planted_environment_variables_get_their_verdicts(planted):
    c = by_id(planted)
    assert planted["facts"]["env"] == PLANTED  # recorded as set, nothing else (the test cleared the rest)
    assert c["env:CUDA_LAUNCH_BLOCKING"]["verdict"] == "bad"
    assert c["env:PYTORCH_NO_CUDA_MEMORY_CACHING"]["verdict"] == "bad"
    assert c["env:NCCL_DEBUG"]["verdict"] == "warn" and c["env:NCCL_DEBUG"]["value"] == "INFO"
    assert c["env:TORCH_DISTRIBUTED_DEBUG"]["verdict"] == "warn"
    assert c["env:TORCH_SHOW_CPP_STACKTRACES"]["verdict"] == "warn"
    assert "kernel" in c["env:CUDA_LAUNCH_BLOCKING"]["note"]  # says why
    assert "env" not in c  # the "none set" line only when nothing slows training
    assert "expandable_segments:True" in c["alloc_conf"]["value"] and "expandable" in c["alloc_conf"]["note"]
    assert planted["summary"]["bad"] >= 2


@pytest.mark.slow
def test_near_misses_are_not_flagged():
    proc = doctor("--format", "json", env={"CUDA_LAUNCH_BLOCKING": "0", "NCCL_DEBUG": "WARN",
                                           "TORCH_DISTRIBUTED_DEBUG": "OFF", "TORCH_SHOW_CPP_STACKTRACES": "0"})
    assert proc.returncode == 0, proc.stderr
    c = by_id(json.loads(proc.stdout))
    assert not [k for k in c if k.startswith("env:")]
    assert c["env"]["verdict"] == "ok" and c["env"]["value"] == "none set"
    assert c["alloc_conf"]["value"] == "(defaults)"


@pytest.mark.slow
def test_text_report(tmp_path):
    torch = pytest.importorskip("torch")
    proc = doctor(env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gpuadvise doctor")
    assert any(l.split()[:2] == ["BAD", "CUDA_LAUNCH_BLOCKING"] for l in lines), proc.stdout
    assert any(torch.__version__ in l for l in lines)
    assert " ok, " in lines[-1 if torch.cuda.is_available() else -2]
    if not torch.cuda.is_available():
        assert "No GPU is visible" in lines[-1]


@pytest.mark.slow
def test_a_crafted_value_cannot_drive_the_terminal():
    proc = doctor(env={"TORCH_LOGS": "+dynamo\x1b]0;pwned\x07\x1b[2J"})
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert any("TORCH_LOGS" in l and "+dynamo" in l for l in proc.stdout.splitlines())


@pytest.mark.slow
def test_workers_are_checked_against_the_cores():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    too_many = doctor("--format", "json", "--workers", str(cores + 4))
    fits = doctor("--format", "json", "--workers", "0")
    assert by_id(json.loads(too_many.stdout))["cpu"]["verdict"] == "warn"
    assert by_id(json.loads(fits.stdout))["cpu"]["verdict"] == "ok"


def _warn_here():
    warnings.warn("the script's own warning, shown once here")


def test_reading_the_facts_leaves_the_scripts_warnings_as_they_were(monkeypatch):
    """`gpuadvise profile` reads these facts inside the script's process, each step: a warning the script
    showed once must stay shown once (changing the warnings filters would show it again), and a warning
    raised while a fact is read must still show when the script raises it."""
    torch = pytest.importorskip("torch")
    shown = []
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # once per location, python's default for a UserWarning
        monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: shown.append(str(message)))
        _warn_here()
        probe.backend_flags(torch)
        probe.cuda_available(torch)
        with probe.warnings_held():
            _warn_here()
            warnings.warn("raised while a fact is read")
        _warn_here()
        with probe.warnings_held(record=True) as caught:
            warnings.warn("recorded while a fact is read")
        warnings.warn("raised while a fact is read")
    assert shown == ["the script's own warning, shown once here", "raised while a fact is read"]
    assert [str(w.message) for w in caught] == ["recorded while a fact is read"]


@pytest.mark.parametrize("args", [["--workers", "-1"], ["--workers", "many"], ["--format", "xml"]])
@pytest.mark.slow
def test_bad_arguments_exit_2_with_one_line(args):
    proc = doctor(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "error:" in proc.stderr.splitlines()[-1]


WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None  # as if torch were not installed: `import torch` raises ImportError
from gpuadvise.cli import main
rc = main(["doctor", "--format", "json"])
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None], "something imported torch"
sys.exit(rc)
"""


@pytest.mark.slow
def test_works_without_torch_and_says_so():
    proc = doctor(code=WITHOUT_TORCH, env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["facts"]["torch"] == {"installed": False, "error": "not installed"}
    assert doc["facts"]["gpus"] == [] and doc["facts"]["settings"] == {}
    c = by_id(doc)
    assert c["torch"]["verdict"] == "bad" and "pip install torch" in c["torch"]["note"]
    assert "cuda" not in c  # the torch checks are skipped, the machine's are not
    assert c["env:CUDA_LAUNCH_BLOCKING"]["verdict"] == "bad"
    assert {"cpu", "shm", "triton", "alloc_conf"} <= set(c)


@pytest.mark.slow
def test_importing_doctor_imports_no_torch():
    code = ("import sys; import gpuadvise.doctor.cli, gpuadvise.doctor.probe, gpuadvise.doctor.checks, "
            "gpuadvise.analyzer.model.runfacts; print('torch' in sys.modules)")
    proc = doctor(code=code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# ----------------------------------------------------------------------------------------------------
# The probe's GPU branches, on a fake torch with PyTorch's documented API


def fake_torch(gpus=(("NVIDIA H100 80GB HBM3", 9, 0, 80 * GiB),), hip: str | None = None, arch_list=None,
               free=None, broken_props=False, available=True):
    def props(i):
        if broken_props:
            raise RuntimeError("CUDA error: unknown error")
        name, major, minor, mem = gpus[i]
        p = SimpleNamespace(name=name, major=major, minor=minor, total_memory=mem, multi_processor_count=132)
        if hip:
            p.gcnArchName = "gfx942:sramecc+:xnack-"
        return p

    cuda = SimpleNamespace(
        is_available=lambda: available, device_count=lambda: len(gpus), get_device_properties=props,
        get_arch_list=lambda: list(arch_list if arch_list is not None else ["sm_80", "sm_90", "compute_90"]),
        current_device=lambda: 0, mem_get_info=lambda i: (free if free is not None else gpus[i][3] - GiB, gpus[i][3]),
        nccl=SimpleNamespace(version=lambda: (2, 21, 5)))
    cudnn = SimpleNamespace(is_available=lambda: True, version=lambda: 91900, enabled=True, benchmark=False,
                            deterministic=False, allow_tf32=True, conv=SimpleNamespace(fp32_precision="tf32"))
    backends = SimpleNamespace(cudnn=cudnn, cuda=SimpleNamespace(matmul=SimpleNamespace(allow_tf32=False, fp32_precision="ieee")))
    torch = SimpleNamespace(
        __version__="2.11.0+cu130", version=SimpleNamespace(cuda=None if hip else "13.0", hip=hip, debug=False),
        cuda=cuda, backends=backends, _C=SimpleNamespace(_nccl_version=lambda: 0),
        get_num_threads=lambda: 8, get_float32_matmul_precision=lambda: "highest",
        are_deterministic_algorithms_enabled=lambda: False, is_deterministic_algorithms_warn_only_enabled=lambda: False,
        is_anomaly_enabled=lambda: False, is_anomaly_check_nan_enabled=lambda: True)
    # `import torch.cuda.nccl` inside the probe must find the fake's module
    sys.modules["torch"], sys.modules["torch.cuda"], sys.modules["torch.cuda.nccl"] = torch, cuda, cuda.nccl
    return torch


@pytest.fixture
def fake(monkeypatch):
    for name in ("torch", "torch.cuda", "torch.cuda.nccl"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))  # restored after the test
    return fake_torch


def test_documented_cuda_api_exists_in_the_installed_torch():
    """The fake stands for these names: they must be real in the torch this project runs with."""
    pytest.importorskip("torch")
    import torch.cuda.nccl

    for obj, name in [(torch.cuda, n) for n in ("is_available", "device_count", "get_device_properties",
                                                "get_arch_list", "current_device", "mem_get_info")] + \
                     [(torch.backends.cudnn, "version"), (torch.backends.cudnn, "is_available"),
                      (torch.cuda.nccl, "version"), (torch, "get_float32_matmul_precision"),
                      (torch, "are_deterministic_algorithms_enabled"), (torch, "is_anomaly_enabled")]:
        assert callable(getattr(obj, name, None)), name
    assert hasattr(torch.version, "cuda") and hasattr(torch.version, "hip")
    # get_device_properties' fields, from the type stub every build ships (a CPU build lacks the class itself)
    from pathlib import Path

    stub = (Path(torch.__file__).parent / "_C" / "__init__.pyi").read_text()
    body = re.search(r"class _CudaDeviceProperties:\n((?:    .*\n)+)", stub).group(1)
    declared = set(re.findall(r"^    (\w+):", body, flags=re.M))
    assert {"name", "major", "minor", "total_memory", "multi_processor_count", "gcnArchName"} <= declared


def test_probe_reads_a_cuda_machine(fake):
    t = fake(gpus=(("NVIDIA H100 80GB HBM3", 9, 0, 80 * GiB), ("NVIDIA H100 80GB HBM3", 9, 0, 80 * GiB)), free=10 * GiB)
    facts = probe.collect(t, free_memory=True)
    assert facts["torch"]["build"] == "cuda" and facts["torch"]["cuda_available"] is True
    assert facts["torch"]["device_count"] == 2 and facts["torch"]["nccl"] == "2.21.5"
    assert facts["torch"]["cudnn"] == {"available": True, "version": 91900, "enabled": True}
    g = facts["gpus"][1]
    assert g["index"] == 1 and g["capability"] == [9, 0] and g["memory_bytes"] == 80 * GiB and g["free_bytes"] == 10 * GiB
    assert g["tensor_cores"]["generation"] == "4th gen (Hopper)" and "fp8" in g["tensor_cores"]["formats"]
    assert facts["settings"]["matmul_fp32_precision"] == "ieee"
    env = probe.environment(t)  # what run.json keeps: the old summary keys plus the machine
    assert env["device"] == {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "total_memory": 80 * GiB, "count": 2}
    assert env["cuda_available"] is True and env["cudnn"] == 91900 and env["machine"]["gpus"][0]["name"].startswith("NVIDIA")
    assert "free_bytes" not in env["machine"]["gpus"][0]  # a training process creates no context on every GPU


def test_probe_survives_a_failing_driver_call(fake):
    t = fake(broken_props=True)
    facts = probe.collect(t)
    assert facts["gpus"] == [{"index": 0, "error": "get_device_properties failed"}]
    found = checks.judge(facts)
    assert not any(c["id"].startswith("gpu") for c in found)  # nothing to judge, and no crash


def test_probe_reads_a_rocm_machine(fake):
    t = fake(gpus=(("AMD Instinct MI300X", 9, 4, 192 * GiB),), hip="6.2.41133")
    facts = probe.collect(t)
    assert facts["torch"]["build"] == "rocm"
    g = facts["gpus"][0]
    assert g["vendor"] == "amd" and g["arch"].startswith("gfx942")
    assert g["tensor_cores"]["generation"] == "matrix cores (CDNA 3, MI300)"
    c = by_id({"checks": checks.judge(facts)})
    assert c["cuda"]["label"] == "ROCm/HIP" and c["cudnn"]["label"] == "MIOpen" and c["nccl"]["label"] == "RCCL"


# ----------------------------------------------------------------------------------------------------
# Verdicts on GPU facts


def gpu_facts(**over) -> dict:
    facts = {
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "torch": {"installed": True, "version": "2.11.0+cu130", "build": "cuda", "cuda": "13.0", "hip": None,
                  "cuda_available": True, "device_count": 1, "arch_list": ["sm_80", "sm_90", "compute_90"],
                  "cudnn": {"available": True, "version": 91900, "enabled": True}, "nccl": "2.27.3", "threads": 8},
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "vendor": "nvidia", "capability": [9, 0],
                  "memory_bytes": 80 * GiB, "free_bytes": 79 * GiB,
                  "tensor_cores": probe.tensor_cores("nvidia", (9, 0))}],
        "settings": {"cudnn_benchmark": False, "matmul_allow_tf32": False, "cudnn_allow_tf32": True,
                     "float32_matmul_precision": "highest", "deterministic_algorithms": False, "anomaly_detection": False},
        "env": {}, "cpu": {"logical": 32, "usable": 32, "cgroup_limit": None},
        "shm": {"path": "/dev/shm", "total_bytes": 64 * GiB, "free_bytes": 64 * GiB},
        "driver": {"nvidia": "570.86.15", "nvidia_loaded": True}, "triton": {"installed": True, "version": "3.3.0"},
    }
    for k, v in over.items():
        facts[k] = v if not isinstance(v, dict) or not isinstance(facts.get(k), dict) else {**facts[k], **v}
    return facts


def test_healthy_gpu_machine():
    c = by_id({"checks": checks.judge(gpu_facts())})
    assert c["torch"]["verdict"] == "ok" and c["cuda"]["value"] == "runtime 13.0, 1 GPU(s) visible"
    assert c["cudnn"]["value"] == "9.19.0" and c["driver"]["value"] == "570.86.15"
    assert c["gpu0"]["verdict"] == "ok" and "Tensor Cores: 4th gen (Hopper)" in c["gpu0"]["value"]
    assert c["tf32"]["verdict"] == "warn"  # fp32 matmuls without TF32 on a GPU that has it: torch's default
    assert c["shm"]["verdict"] == "ok" and c["triton"]["verdict"] == "ok"


def test_tf32_on_is_ok():
    settings = {**gpu_facts()["settings"], "float32_matmul_precision": "high"}
    assert by_id({"checks": checks.judge(gpu_facts(settings=settings))})["tf32"]["verdict"] == "ok"


@pytest.mark.parametrize("cap,generation,verdict", [((6, 1), None, "warn"), ((7, 0), "1st gen (Volta)", "ok"),
                                                     ((7, 5), "2nd gen (Turing)", "ok"), ((8, 6), "3rd gen (Ampere)", "ok"),
                                                     ((8, 9), "4th gen (Ada)", "ok"), ((10, 0), "5th gen (Blackwell)", "ok"),
                                                     ((12, 0), "5th gen (Blackwell)", "ok")])
def test_tensor_core_generation(cap, generation, verdict):
    assert probe.tensor_cores("nvidia", cap)["generation"] == generation
    g = {**gpu_facts()["gpus"][0], "capability": list(cap), "tensor_cores": probe.tensor_cores("nvidia", cap)}
    t = {**gpu_facts()["torch"], "arch_list": [f"sm_{cap[0]}{cap[1]}"]}
    assert by_id({"checks": checks.judge(gpu_facts(gpus=[g], torch=t))})["gpu0"]["verdict"] == verdict


@pytest.mark.parametrize("arch_list,cap,ok", [
    (["sm_80", "sm_90"], (8, 6), True),  # sm_80 cubins run on 8.6
    (["sm_80", "sm_90"], (12, 0), False),  # Blackwell consumer card, no kernels, no PTX
    (["sm_80", "compute_90"], (12, 0), True),  # PTX, compiled by the driver
    (["sm_90a"], (9, 0), True), (["sm_90a"], (10, 0), False),  # arch-specific: that GPU only
    (["sm_70", "sm_75"], (6, 1), False),
])
def test_build_supports_the_gpu(arch_list, cap, ok):
    assert checks.arch_supported(arch_list, cap) is ok
    g = {**gpu_facts()["gpus"][0], "capability": list(cap), "tensor_cores": probe.tensor_cores("nvidia", cap)}
    verdict = by_id({"checks": checks.judge(gpu_facts(gpus=[g], torch={"arch_list": arch_list}))})["gpu0"]["verdict"]
    assert (verdict == "bad") is (not ok)


def test_gpu_memory_in_use_by_another_process():
    g = {**gpu_facts()["gpus"][0], "free_bytes": 20 * GiB}
    c = by_id({"checks": checks.judge(gpu_facts(gpus=[g]))})["gpu0"]
    assert c["verdict"] == "warn" and "60.0 GiB of it is already in use" in c["note"]


def test_cpu_build_on_a_machine_with_an_nvidia_driver():
    t = {"build": "cpu", "cuda": None, "cuda_available": False, "device_count": 0, "arch_list": []}
    c = by_id({"checks": checks.judge(gpu_facts(torch=t, gpus=[]))})
    assert c["torch"]["verdict"] == "bad" and "CPU-only" in c["torch"]["note"]


def test_cuda_build_that_cannot_see_the_gpu():
    t = {"cuda_available": False, "device_count": 0,
         "cuda_error": "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."}
    c = by_id({"checks": checks.judge(gpu_facts(torch=t, gpus=[]))})
    assert c["cuda"]["verdict"] == "bad" and "too old" in c["cuda"]["note"]


@pytest.mark.parametrize("total,verdict", [(64 * MiB, "bad"), (1 * GiB, "warn"), (16 * GiB, "ok")])
def test_shm_size(total, verdict):
    c = by_id({"checks": checks.judge(gpu_facts(shm={"path": "/dev/shm", "total_bytes": total, "free_bytes": total}))})
    assert c["shm"]["verdict"] == verdict
    if verdict == "bad":
        assert "--shm-size" in c["shm"]["note"]


def test_triton_missing_on_a_gpu_build_is_a_warning():
    c = by_id({"checks": checks.judge(gpu_facts(triton={"installed": False, "version": None}))})
    assert c["triton"]["verdict"] == "warn"


@pytest.mark.parametrize("gpus,workers,verdict", [(8, 3, "ok"), (8, 4, "warn"), (1, 31, "ok"), (1, 32, "warn")])
def test_workers_per_gpu_process(gpus, workers, verdict):
    g = gpu_facts()["gpus"][0]
    facts = gpu_facts(gpus=[{**g, "index": i} for i in range(gpus)])  # 32 cores
    assert by_id({"checks": checks.judge(facts, workers=workers)})["cpu"]["verdict"] == verdict


def test_container_cpu_quota_counts():
    facts = gpu_facts(cpu={"logical": 64, "usable": 64, "cgroup_limit": 4.0})
    c = by_id({"checks": checks.judge(facts, workers=8)})["cpu"]
    assert c["verdict"] == "warn" and "container limit 4" in c["value"]


@pytest.mark.parametrize("name,value,verdict", [
    ("CUDA_LAUNCH_BLOCKING", "1", "bad"), ("CUDA_LAUNCH_BLOCKING", "0", "ok"), ("NCCL_DEBUG", "TRACE", "bad"),
    ("NCCL_DEBUG", "info", "warn"), ("NCCL_DEBUG", "WARN", "ok"), ("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "warn"),
    ("TORCH_DISTRIBUTED_DEBUG", "INFO", "info"), ("NVIDIA_TF32_OVERRIDE", "0", "warn"), ("NVIDIA_TF32_OVERRIDE", "1", "ok"),
    ("TORCH_NCCL_BLOCKING_WAIT", "1", "warn"), ("CUDNN_LOGLEVEL_DBG", "0", "ok"), ("CUDNN_LOGLEVEL_DBG", "2", "warn"),
])
def test_environment_variable_verdicts(name, value, verdict):
    assert probe.judge_env(name, value)[0] == verdict
    assert [e["name"] for e in probe.slow_env({name: value})] == ([name] if verdict in ("warn", "bad") else [])


def test_cudnn_version_formats():
    assert checks._cudnn_version(91900, "cuda") == "9.19.0"
    assert checks._cudnn_version(90100, "cuda") == "9.1.0"
    assert checks._cudnn_version(8902, "cuda") == "8.9.2"


def test_compile_recording_says_what_an_older_torch_cannot_give():
    new = by_id({"checks": checks.judge(gpu_facts(compile={"structured_trace": True}))})["compile"]
    old = by_id({"checks": checks.judge(gpu_facts(compile={"structured_trace": False}))})["compile"]
    assert new["verdict"] == "ok" and "file:line" in new["note"]
    assert old["verdict"] == "info" and "without file:line" in old["note"]

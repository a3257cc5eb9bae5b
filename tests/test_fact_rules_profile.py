"""End to end on the CPU: `gpuadvise profile` runs tiny scripts that plant the facts (a debug variable and
anomaly detection, evaluation without no_grad, tensors created on the CPU each step, a model on the CPU),
and `gpuadvise analyze` of the run folder reports them.

What a CPU-only machine cannot show is checked as far as it goes, and said: there are no kernel launches
to block and no host→device copies. cpu-created-tensors is therefore checked on the real trace's CPU side
(the op names torch writes for `torch.tensor`, `arange`, `ones().tril().bool()`) with copy calls placed
where a GPU run makes them; the copies themselves, and the replay's prediction, are tested on synthetic
traces in test_fact_rules.py. model-on-cpu needs a GPU in the process: the test records the parameters'
devices for real, then states the GPU in run.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # every test reads a real profiled run

from gpuadvise.analyzer.run.engine import analyze_paths  # noqa: E402
from gpuadvise.analyzer.read.loader import load_trace  # noqa: E402
from gpuadvise.analyzer.measure.basics.metrics import compute  # noqa: E402
from gpuadvise.doctor import probe  # noqa: E402
from gpuadvise.rules.cpu_created_tensors import created_on_cpu  # noqa: E402

PROBES = Path(__file__).resolve().parent / "probes"
WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2"]


def profile(tmp_path: Path, script: str, *args: str, env: dict | None = None) -> Path:
    e = {k: v for k, v in os.environ.items() if k not in probe.ENV_BY_NAME and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    e.update(env or {})
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", str(out), *WINDOW,
                           str(PROBES / script), *args], cwd=tmp_path, capture_output=True, text=True, env=e, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    return out


def analyze(run: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gpuadvise", "analyze", str(run), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def topic(report: dict, name: str) -> list[dict]:
    return [f for f in report["findings"] if f["topic"] == name]


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("debug"), "debug_train.py", env={"CUDA_LAUNCH_BLOCKING": "1"})


def test_debug_settings_are_recorded_as_the_window_ran(debug_run):
    run = json.loads((debug_run / "run.json").read_text())
    # the script turned anomaly detection on after import and off before it exited
    assert run["settings"]["anomaly_detection"] is True and run["settings"]["read_at"] == "window end"
    assert run["environment"]["machine"]["env"]["CUDA_LAUNCH_BLOCKING"] == "1"
    assert run["environment"]["machine"]["settings"]["anomaly_detection"] is True
    assert run["environment"]["torch"] == torch.__version__  # the keys analyze always read are still there


def test_debug_settings_finding(debug_run):
    (f,) = topic(analyze(debug_run), "debug-settings")
    names = [i["name"] for i in f["evidence"]["items"]]
    assert names == ["CUDA_LAUNCH_BLOCKING=1", "autograd anomaly detection"]
    # no GPU here: the variable cost nothing in this run, and the finding says so
    assert "launched 0 GPU kernels" in f["message"] and "cost nothing here" in f["message"]
    # anomaly mode's NaN checks are in the CPU trace: an isnan after each backward function
    checks = f["evidence"]["numbers"]["nan_checks"]
    assert checks["checks"] > 0 and checks["checks"] >= 0.5 * checks["backward_functions"]
    assert f["severity"] in ("medium", "high") and "lower bound" in f["impact"]["basis"]


def test_doctor_judges_the_variable_as_the_rule_does(debug_run):
    """One table for both: doctor in the same environment rates CUDA_LAUNCH_BLOCKING=1 bad."""
    e = {k: v for k, v in os.environ.items() if k not in probe.ENV_BY_NAME}
    e["CUDA_LAUNCH_BLOCKING"] = "1"
    proc = subprocess.run([sys.executable, "-m", "gpuadvise", "doctor", "--format", "json"], capture_output=True,
                          text=True, env=e, timeout=300)
    c = {x["id"]: x for x in json.loads(proc.stdout)["checks"]}
    assert c["env:CUDA_LAUNCH_BLOCKING"]["verdict"] == "bad"
    assert [x["name"] for x in probe.slow_env({"CUDA_LAUNCH_BLOCKING": "1"})] == ["CUDA_LAUNCH_BLOCKING"]


@pytest.mark.parametrize("grad", [True, False], ids=["without-no_grad", "with-no_grad"])
def test_evaluation_without_no_grad(tmp_path, grad):
    run = profile(tmp_path, "eval_loop.py", *(["--grad"] if grad else []))
    found = topic(analyze(run), "inference-with-grad")
    model = load_trace(run / "trace.pt.trace.json.gz")
    linear = model.cpu[model.cpu["name"] == "aten::linear"]
    if grad:
        (f,) = found
        assert f["evidence"]["numbers"]["steps_affected"] == f["evidence"]["numbers"]["steps"] == 2
        assert min(f["evidence"]["numbers"]["autograd_nodes_per_step"]) >= 5  # 3 linear + 2 relu per batch
        assert (linear["seq"] >= 0).all()  # what the loader keeps of torch's "Sequence number"
    else:
        assert found == []
        assert (linear["seq"] == -1).all()


@pytest.fixture(scope="module")
def tensors_run(tmp_path_factory):
    return profile(tmp_path_factory.mktemp("tensors"), "cpu_tensors.py")


def test_the_trace_alone_agrees_with_the_run_folder(debug_run, tensors_run):
    """Each run folder and its trace without run.json (as another tool's trace would come): the same topics,
    savings within 5 points, but for those docs/rule-api.md lists as needing run.json."""
    from _trace_alone import disagreements
    from gpuadvise.analyzer.model.report import all_findings

    found = []
    for name, folder in (("debug_train.py", debug_run), ("cpu_tensors.py", tensors_run)):
        recorded = all_findings(analyze_paths([str(folder)], jobs=1))
        alone = all_findings(analyze_paths([str(folder / "trace.pt.trace.json.gz")], jobs=1))
        assert recorded, f"{name}: no findings to compare"
        found += disagreements(recorded, alone, name)
    assert not found, "\n".join(found)


def test_cpu_created_tensors_need_a_gpu_trace(tensors_run):
    """On the CPU the `.to(device)` calls copy nothing: the rule has no copies to point at and stays quiet."""
    assert topic(analyze(tensors_run), "cpu-created-tensors") == []


def test_cpu_created_tensors_matcher_on_the_real_cpu_side(tensors_run):
    model = load_trace(tensors_run / "trace.pt.trace.json.gz")
    steps = compute(model).steps
    cpu = model.cpu
    marks = cpu[cpu["is_annotation"] & cpu["name"].astype(str).str.startswith("move:")]
    # where a GPU run copies: the aten::to inside each move:* mark; place a copy call there
    rows = []
    for n, (name, ts, end, tid) in enumerate(zip(marks["name"].astype(str), marks["ts"], marks["end"], marks["tid"])):
        to = cpu[(cpu["name"] == "aten::to") & (cpu["ts"] >= ts) & (cpu["end"] <= end) & (cpu["tid"] == tid)]
        assert len(to) == 1, name
        rows.append({"name": "cudaMemcpyAsync", "ts": float(to["ts"].iloc[0]) + 0.1, "dur": 0.2, "pid": 0,
                     "tid": int(tid), "correlation": 10_000 + n, "external_id": -1, "what": name})
    calls = pd.DataFrame(rows)
    calls["end"] = calls["ts"] + calls["dur"]
    runtime = pd.concat([model.runtime, calls.drop(columns="what")], ignore_index=True)
    runtime["name"] = runtime["name"].astype("category")
    found = created_on_cpu(dataclasses.replace(model, runtime=runtime), calls["correlation"].to_numpy())
    by_move = dict(zip(calls["correlation"], calls["what"]))
    created = {}
    for corr, op in zip(found["correlation"], found["created_by"]):
        created.setdefault(by_move[corr], set()).add(op)
    in_window = sum(1 for w in calls["what"] if w == "move:positions")
    assert in_window >= len(steps) >= 2
    assert created.get("move:positions") == {"aten::arange"}
    assert created.get("move:mask") == {"aten::ones"}  # through tril and bool(), both on the CPU
    assert created.get("move:weights") and created["move:weights"] <= {"aten::detach_", "aten::lift_fresh"}
    assert "move:batch" not in created  # the DataLoader's batch is not a per-step creation
    # every per-step creation is matched; the window's edge may cut one creation op off its copy
    assert sum(found["correlation"].map(by_move) == "move:positions") >= in_window - 1


def test_model_on_cpu_from_the_recorded_parameters(tensors_run, tmp_path):
    run = json.loads((tensors_run / "run.json").read_text())
    (opt,) = run["optimizers"]
    assert opt["param_devices"] == {"cpu": 4}  # recorded from the optimizer's parameter groups
    assert topic(analyze(tensors_run), "model-on-cpu") == []  # this machine has no GPU: nothing to say
    # the same run folder as a machine with a GPU would have written it
    gpu = tmp_path / "gpu-run"
    gpu.mkdir()
    (gpu / "trace.json.gz").write_bytes((tensors_run / "trace.pt.trace.json.gz").read_bytes())
    run["environment"]["cuda_available"] = True
    run["environment"]["device"] = {"name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "total_memory": 85 * 2**30, "count": 1}
    (gpu / "run.json").write_text(json.dumps(run))
    (report,) = analyze_paths([str(gpu)], jobs=1)
    (f,) = [f for f in report.findings if f.topic == "model-on-cpu"]
    assert "all 4 parameters" in f.message and "NVIDIA H100" in f.message and f.severity == "high"
    assert np.isclose(f.impact.est_step_saving_pct, 0.0) and f.impact.basis.startswith("not predicted")

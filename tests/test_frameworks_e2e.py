"""End to end, on the CPU: gpuadvise where users already train, launched the way they launch.

- `gpuadvise profile hf_train.py` on transformers' Trainer (gradient accumulation, an evaluation inside
  the window);
- `python hf_callback.py` with `gpuadvise.integrations.huggingface.GpuadviseCallback` (a checkpoint inside
  the window);
- `python lightning_callback.py` with `gpuadvise.integrations.lightning.GpuadviseCallback` (gradient
  accumulation, the sanity check, a validation inside the window);
- `gpuadvise profile lightning_ddp.py` on Lightning's Trainer with `strategy="ddp"`, `devices=2`: Lightning
  starts the second process itself, and it is profiled too;
- `accelerate launch --multi_gpu --num_processes 2 -m gpuadvise profile … accelerate_train.py` (two CPU
  processes on gloo: `--cpu` would start one, it needs mpirun for more);
- the hand-written loop with the same planted problem, which every framework run is held to.

Each probe (tests/probes/frameworks/) plants the same problem: a dataset that sleeps 10 ms a sample read
with num_workers=0. Each run is one module fixture shared by its assertions (a run imports torch and its
framework: seconds); a framework that is not installed skips its tests, saying which extra installs it.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # every test reads a real training run under gpuadvise profile

PROBES = Path(__file__).resolve().parent / "probes" / "frameworks"
WINDOW = ["--wait", "2", "--warmup", "1", "--active", "3"]  # recorded: steps 3, 4 and 5
TIMEOUT = 300
JOB_RULES = ("straggler", "comm-overlap")  # findings about a job of several ranks: a single loop has none


def _need(module: str, extra: str):
    try:
        __import__(module)
    except ImportError:
        pytest.skip(f"{module} is not installed (pip install 'gpuadvise[{extra}]')")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPUADVISE_DEBUG")}
    # nothing downloaded, nothing reported: the models are built from configs
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_DISABLED="true",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=os.pathsep.join(filter(None, [str(PROBES), os.environ.get("PYTHONPATH")])))
    return env


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _profile(script: str, run: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "gpuadvise", "profile", "-o", str(run), *WINDOW, str(PROBES / script), *extra], cwd)


def _analyze(run: Path, cwd: Path) -> dict:
    proc = _run([sys.executable, "-m", "gpuadvise", "analyze", str(run), "--format", "json"], cwd)
    return json.loads(proc.stdout)


def _findings(report: dict) -> dict[str, dict]:
    return {f["topic"]: f for f in report["findings"]}


def _run_json(run: Path, name: str = "run.json") -> dict:
    return json.loads((run / name).read_text())


def _no_library_paths(text: str) -> None:
    assert "site-packages" not in text and "dist-packages" not in text, text


def _line_of(script: str, needle: str) -> str:
    """`script:N`: the line of the probe that holds `needle` (what a finding must point at)."""
    lines = (PROBES / script).read_text().splitlines()
    return f"{script}:{next(i for i, line in enumerate(lines, 1) if needle in line)}"


class Run:
    def __init__(self, folder: Path, proc: subprocess.CompletedProcess, report: dict):
        self.folder, self.proc, self.report = folder, proc, report
        self.facts = _run_json(folder)
        self.findings = _findings(report)
        self.trace = report["traces"][0]


def _run_folder(tmp_path_factory, name: str) -> tuple[Path, Path]:
    cwd = tmp_path_factory.mktemp(name)
    return cwd, cwd / "run"


# -- the runs -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Run:
    cwd, run = _run_folder(tmp_path_factory, "loop")
    proc = _profile("loop_train.py", run, PROBES)
    return Run(run, proc, _analyze(run, cwd))


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Run:
    _need("transformers", "hf")
    cwd, run = _run_folder(tmp_path_factory, "hf")
    proc = _profile("hf_train.py", run, PROBES, str(cwd / "trainer"))
    return Run(run, proc, _analyze(run, cwd))


@pytest.fixture(scope="module")
def hf_callback(tmp_path_factory) -> Run:
    _need("transformers", "hf")
    cwd, run = _run_folder(tmp_path_factory, "hfcb")
    proc = _run([sys.executable, str(PROBES / "hf_callback.py"), str(run), str(cwd / "trainer")], PROBES)
    return Run(run, proc, _analyze(run, cwd))


@pytest.fixture(scope="module")
def lightning_ddp(tmp_path_factory) -> tuple[Path, dict]:
    _need("lightning", "lightning")
    cwd, run = _run_folder(tmp_path_factory, "lightning_ddp")
    _profile("lightning_ddp.py", run, PROBES, str(cwd / "logs"))
    return run, _analyze(run, cwd)


@pytest.fixture(scope="module")
def lightning(tmp_path_factory) -> Run:
    _need("lightning", "lightning")
    cwd, run = _run_folder(tmp_path_factory, "lightning")
    proc = _run([sys.executable, str(PROBES / "lightning_callback.py"), str(run), str(cwd / "logs")], PROBES)
    return Run(run, proc, _analyze(run, cwd))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def accelerate_job(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    _need("accelerate", "hf")
    cwd, run = _run_folder(tmp_path_factory, "accelerate")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(_free_port())]
    proc = _run(launch + ["-m", "gpuadvise", "profile", "-o", str(run), "--wait", "2", "--warmup", "1", "--active", "2",
                          str(PROBES / "accelerate_train.py")], PROBES)
    return run, proc, _analyze(run, cwd)


# -- the hand-written loop: the reference ------------------------------------------------------------------
def test_the_hand_written_loop_finds_the_stall_at_its_dataloader(loop):
    stall = loop.findings["dataloader-stall"]
    assert _line_of("loop_train.py", "DataLoader(") in stall["evidence"]["sources"]
    assert "Use num_workers=" in stall["advice"]  # the raw torch switch: no framework ran the loop
    assert "framework" not in loop.facts


# -- transformers' Trainer under `gpuadvise profile` --------------------------------------------------------
def test_trainer_steps_are_its_optimizer_steps(hf):
    steps = hf.facts["steps"]
    # 7 optimizer steps of 2 accumulated micro-batches each: 7 steps, not 14 batches, each the Trainer's
    assert steps["count"] == 7 and set(steps["step_sources"]) == {"transformers"}
    assert hf.facts["capture"]["step_source"] == "transformers Trainer step"
    assert [n for n, p in zip(steps["number"], steps["phase"]) if p == "active"] == [3, 4, 5]


def test_trainer_facts_are_the_training_arguments(hf):
    fw = hf.facts["framework"]
    assert fw["name"] == "transformers" and fw["version"]
    assert fw["called_at"] == _line_of("hf_train.py", "trainer.train()") and fw["call"] == "trainer.train()"
    s = fw["settings"]
    assert (s["dataloader_num_workers"], s["gradient_accumulation_steps"], s["bf16"], s["optim"]) == (0, 2, False, "adamw_torch_fused")
    assert fw["accelerate"]["distributed_type"] == "NO"


def test_trainer_evaluation_is_named_and_left_out(hf):
    # evaluation runs after optimizer step 4, in step 5 (recorded), and after the last step (7): named, and
    # not counted as a training step
    phases = [(p["kind"], p["step"], p["window"]) for p in hf.facts["framework"]["phases"]]
    assert phases == [("evaluation", 5, "active"), ("evaluation", 8, "after")]
    figures = hf.trace
    assert [s["step"] for s in figures["steps_left_out"]] == [5]
    assert "evaluation" in figures["steps_left_out"][0]["reason"] and figures["step_numbers"] == [3, 4]
    with gzip.open(hf.folder / "trace.pt.trace.json.gz", "rt") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert "gpuadvise: evaluation" in names


def test_trainer_stall_names_the_training_arguments_switch(hf, loop):
    stall = hf.findings["dataloader-stall"]
    assert "in `TrainingArguments`" in stall["advice"] and "`dataloader_num_workers=" in stall["advice"]
    assert "Use num_workers=" not in stall["advice"]
    where = _line_of("hf_train.py", "trainer.train()")
    assert f"built by transformers' Trainer ({where} `trainer.train()`)" in stall["advice"]
    assert where in stall["evidence"]["sources"]
    _no_library_paths(json.dumps(hf.facts["dataloaders"]) + json.dumps(stall))
    assert set(hf.findings) == set(loop.findings)  # what the hand-written loop with the same problem gets


# -- transformers' Trainer with the callback ------------------------------------------------------------------
def test_hf_callback_writes_the_run_folder_and_says_where(hf_callback, loop):
    assert f"gpuadvise> run folder: {hf_callback.folder}" in hf_callback.proc.stderr
    assert "Training waits on the DataLoader" in hf_callback.proc.stderr  # the summary, as profile prints it
    assert "gpuadvise dataloader-stall:" in hf_callback.proc.stderr  # log_findings: through transformers' logger
    assert hf_callback.facts["command"][0] == "GpuadviseCallback(transformers)"
    steps = hf_callback.facts["steps"]
    assert steps["count"] == 7 and set(steps["step_sources"]) == {"transformers"}
    stall = hf_callback.findings["dataloader-stall"]
    assert "`dataloader_num_workers=" in stall["advice"]
    # the Trainer built its loader before the callback's session started: recorded from the callback
    [loader] = hf_callback.facts["dataloaders"]
    assert (loader["built_by"], loader["created_at"]) == ("transformers", _line_of("hf_callback.py", "trainer.train()"))
    assert set(hf_callback.findings) == set(loop.findings)


def test_hf_callback_checkpoint_is_named_and_left_out(hf_callback):
    # saved after optimizer step 4 (in step 5, recorded) and at the end of training
    assert [(p["kind"], p["step"]) for p in hf_callback.facts["framework"]["phases"]] == [("checkpoint", 5), ("checkpoint", 8)]
    left = hf_callback.trace["steps_left_out"]
    assert [s["step"] for s in left] == [5] and "checkpoint" in left[0]["reason"]


# -- Lightning with the callback ---------------------------------------------------------------------------
def test_lightning_steps_are_its_optimizer_steps(lightning):
    steps = lightning.facts["steps"]
    # 7 optimizer steps over 14 batches; the sanity check's validation batches before training are no steps
    assert steps["count"] == 7 and set(steps["step_sources"]) == {"lightning"}
    phases = [(p["kind"], p["step"]) for p in lightning.facts["framework"]["phases"]]
    assert phases[:2] == [("evaluation", 0), ("evaluation", 5)]  # the sanity check, then validation after step 4
    left = lightning.trace["steps_left_out"]
    assert [s["step"] for s in left] == [5] and "evaluation" in left[0]["reason"]


def test_lightning_facts_are_the_trainers_settings(lightning):
    fw = lightning.facts["framework"]
    assert fw["name"] == "lightning" and fw["called_at"] == _line_of("lightning_callback.py", "trainer.fit(")
    s = fw["settings"]
    assert (s["precision"], s["accumulate_grad_batches"], s["strategy"], s["train_dataloader_num_workers"]) == (
        "32-true", 2, "SingleDeviceStrategy", [0])


def test_lightning_stall_names_the_users_dataloader(lightning, loop):
    stall = lightning.findings["dataloader-stall"]
    where = _line_of("lit_model.py", "SlowPairs(), batch_size=8")  # the first: train_dataloader()
    assert f"to the `DataLoader` at {where}, in your `train_dataloader()`" in stall["advice"]
    assert stall["evidence"]["sources"][-1] == where  # the training loader only: not the validation one
    _no_library_paths(json.dumps(stall))
    assert "gpuadvise dataloader-stall:" in lightning.proc.stderr  # log_findings: through Lightning's log
    assert set(lightning.findings) == set(loop.findings)


# -- Lightning starting its own processes, under gpuadvise profile -------------------------------------------
def test_lightning_ddp_profiles_the_process_lightning_starts(lightning_ddp, loop):
    run, report = lightning_ddp
    for name in ("run.json", "run.rank1.json"):
        facts = _run_json(run, name)
        assert facts["steps"]["count"] == 7 and set(facts["steps"]["step_sources"]) == {"lightning"}
        fw = facts["framework"]
        assert (fw["settings"]["strategy"], fw["settings"]["num_devices"]) == ("DDPStrategy", 2)
        # validation after optimizer step 4 (in step 5), the checkpoint Lightning saves at its end inside it
        assert sorted((p["kind"], p["step"]) for p in fw["phases"]) == [("checkpoint", 5), ("evaluation", 5)]
    assert len(report["traces"]) == 2
    for t in report["traces"]:
        assert [s["step"] for s in t["steps_left_out"]] == [5] and t["step_numbers"] == [3, 4]
    stalls = [f for f in report["findings"] if f["topic"] == "dataloader-stall"]
    assert len(stalls) == 2 and all("in your `train_dataloader()`" in f["advice"] for f in stalls)
    for rank in (0, 1):  # each rank gets what the hand-written loop gets (the job rules come on top)
        assert {f["topic"] for f in report["findings"] if f["rank"] == rank and f["topic"] not in JOB_RULES} == set(loop.findings)


# -- accelerate launch, two CPU processes ---------------------------------------------------------------------
def test_accelerate_launch_profiles_every_process(accelerate_job, loop):
    run, proc, report = accelerate_job
    for name in ("run.json", "run.rank1.json"):
        facts = _run_json(run, name)
        fw = facts["framework"]
        assert fw["name"] == "accelerate" and fw["settings"]["distributed_type"] == "MULTI_CPU"
        assert fw["settings"]["num_processes"] == 2 and fw["settings"]["gradient_accumulation_steps"] == 2
        # 12 micro-batches, 2 accumulated per update: 6 steps, marked by the optimizer Accelerate wraps
        assert facts["steps"]["count"] == 6 and set(facts["steps"]["step_sources"]) == {"accelerate"}
    assert sorted(t["rank"] for t in report["traces"]) == [0, 1]
    stalls = [f for f in report["findings"] if f["topic"] == "dataloader-stall"]
    assert sorted(f["rank"] for f in stalls) == [0, 1]
    for f in stalls:  # the user's own DataLoader line, not the copy `prepare` made inside accelerate
        assert f["evidence"]["sources"][-1] == _line_of("accelerate_train.py", "DataLoader(")
        _no_library_paths(json.dumps(f))
    for rank in (0, 1):
        assert {f["topic"] for f in report["findings"] if f["rank"] == rank and f["topic"] not in JOB_RULES} == set(loop.findings)

"""The run folder `gpuadvise profile` writes: names, atomic writes, rank-aware file names.

Files: `trace.pt.trace.json.gz` (the recorded window, named as TensorBoard's profiler plugin and HTA
expect; run folders written before used `trace.json.gz`, still read), `trace.wN.pt.trace.json.gz` (a long
run's later windows), `steps.jsonl` (every step's time and memory samples, steps/record.py), `telemetry.jsonl`
(the GPU's NVML readings about once a second, steps/telemetry.py: NVIDIA GPUs with `gpuadvise[nvml]`),
`capture-requests.jsonl` (window requests every rank follows, windows/requests.py), `memory.pickle` (GPU: CUDA memory snapshot),
`run.json` (what happened; rewritten atomically while the script runs, so it is true even after a
crash or `os._exit`). Under torchrun they carry the rank (`trace.rank3.pt.trace.json.gz`, `run.rank3.json`).
`profiler.log`: the profiler's own log lines (kineto), kept off the user's stderr.

run.json, the keys the capture writes:
- `command`, `script`, `argv`, `cwd`, `started_at`, `ended_at`, `duration_s`, `exit_code`,
  `exit_signal` (if killed by one), `script_exit_code` (as the child saw it), `rank`, `pid` (the training
  process), `hostname`, `launcher_pid` (the `gpuadvise profile` process that runs it);
- `environment` (torch/CUDA/cuDNN/Python versions, device), `settings` (TF32, cudnn.benchmark),
  `dataloaders`, `optimizers`, `autocast`, `compile`, `wrappers` (facts/general.py); `distributed` (the job's
  process group, DDP/FSDP/DeepSpeed settings, backward passes per optimizer step: facts/distributed.py);
- `framework` (frameworks/loop.py; only when transformers' Trainer, Lightning or Accelerate ran the loop):
  `name`, `version`, `entry`, `called_at`, `call`, `settings` (as the framework reports them),
  `accelerate` (under the Trainer), `phases` (evaluation and checkpoints: `kind`, `step`, `window`, `ms`);
- `capture`: `state` ("captured", "waiting for steps", "incomplete: …", "failed: …"), `error`,
  `steps_stepped` (step boundaries seen), `step_source` (what marked the window's steps:
  "optimizer.step()", "DataLoader batch", "gpuadvise.step()", "backward()", "CUDA graph replay",
  "transformers Trainer step", "Lightning Trainer step", "Accelerate optimizer step"),
  `framework_errors` (a framework gpuadvise could not attach to: it ran unmarked),
  `files`, `window` {wait, warmup, active}, `options` {record_shapes, shapes_probe, with_stack,
  profile_memory, memory_history}, `memory_steps` (steps of CUDA memory history after the window;
  0 without a GPU), `memory_stats` (GPU: `torch.cuda.memory_stats()` at the end of the window),
  `shapes`: where the trace's shapes come from: {"mode": "window"} (record_shapes on in the window:
  every op has shapes; `--record-shapes`, or a window too short for the probe) or the shape probe
  (`mode` "probe", `probe_step`, `state` — "annotated", "partial: …", "not annotated: …", "no
  matmuls in the window", "probe failed: …", "merge failed: …" —, `matmuls`: the matmul, convolution
  and attention ops in the window (analyzer/model/flopops.py), `annotated` of them, `probe_matmuls`); absent with `--no-record-shapes --no-shapes-probe`;
  `files.step_record` (the step record's name), `step_record_error` (why it stopped, if it did);
  with `--on-signal`, `--when-slower` or `--every`: `triggers` {`on_signal` (the signal's name),
  `listening`, `when_slower_pct`, `slower_steps`, `every`, `requests`} and `windows`, one entry per
  window: `index`, `trigger` ("schedule" for window 1, "signal", "trigger file", "slower", "stall",
  "every"), `reason` (which moment it records, in words: window 1, the schedule, a request, a new regime
  after a drift, a recurring stall, or the same evidence again), `detail`, `requested_at` (step boundary), `request` (its id), `start` (the boundary its
  warm-up begins at), `warmup`, `active`, `steps` [first, last recorded], `state` ("planned", "warming
  up", "recording", "captured", "incomplete: …", "not reached: …", "not recorded: …", "failed: …"),
  `trace`, and for later windows `captured_at`, `shapes`, `loader` (what the window hooks measured in
  it) and `step_times` (run.json `steps`' keys, over its recorded steps and the unprofiled ones within
  10 steps of it); `window_notes`: windows not recorded (the --max-windows cap, or the windows it keeps for evidence
  --when-slower has not recorded yet);
- `steps`: the time of every step, in and out of the window. Step n is the time from step boundary
  n to boundary n+1, i.e. `ProfilerStep#n` of the trace (step 0, the script's setup before the first
  boundary, is never a step). gpuadvise's own work at a boundary (profiler transitions, export,
  run.json writes) is excluded from both neighbouring steps.
  - `clock`: "cuda_event" where the script ran on a GPU (a CUDA timing event recorded on the current
    stream at each step's start and end, no synchronize in the loop: the time the GPU took for the
    step), else "cpu" (`time.perf_counter_ns()`, wall time);
  - `number` [int], `phase` [str], `step_sources` [str], `ms` [float|null], `cpu_ms` [float],
    `gpu_ms` [float|null] (cuda_event clock only): parallel lists, one entry per kept step. `ms` is
    the step's time by `clock` (ms); `cpu_ms` always the wall time. `phase` is what the profiler was
    doing during the step: "wait" (nothing: before the window), "shapes" (the one-step shape probe:
    a CPU-only profiler with record_shapes, the last wait step), "warmup" (torch.profiler warm-up:
    armed, CUDA tracer on, events discarded), "active" (recorded: these are the trace's steps),
    "memory" (GPU: CUDA memory history on, after the window), "after" (nothing: after the window),
    "off" (nothing: profiling failed or never started). `step_sources` per step: "optimizer",
    "dataloader", "manual", "backward", "cuda_graph", or the framework whose step it was ("transformers",
    "lightning", "accelerate");
  - `count`: steps completed in all; `kept`: "all", or "first N and last M of COUNT" (long runs keep
    the first `wait+warmup+active+100` steps and the last 50);
  - `settle`: steps numbered ≤ settle (2) are the loop's own start-up and count in no median;
  - `unprofiled_median_ms`, `unprofiled_n`: median `ms` of the kept steps with phase "wait", "after"
    or "off", number > settle and at most 20 steps after the window (and its memory history: the level
    the window ran at, which a later drift does not move), except the first "after" step (it follows the
    trace export, or the memory snapshot's dump, and runs on cold caches); null when there are none; `profiled_median_ms`, `profiled_n`:
    median `ms` of the "active" steps; `overhead_x`: profiled_median_ms / unprofiled_median_ms (null
    unless both exist). "warmup", "shapes" and "memory" steps count in neither median;
  - `source`: the source of the recorded steps (else of the last step); `error`: why timing was
    switched off, if it was.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from gpuadvise.analyzer.filemode import publish

RUNS_DIR = "gpuadvise-runs"


def rank() -> int | None:
    for var in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def suffix(r: int | None) -> str:
    return f".rank{r}" if r is not None else ""


def trace_name(r: int | None, window: int = 1) -> str:
    """Window 1 keeps the name older tools read; window i is `trace.wI…` (`trace.rank3.wI…`), so a window
    and a rank never share a name. `*.pt.trace.json.gz` is the name TensorBoard's profiler plugin and HTA
    look for."""
    return f"trace{suffix(r)}{f'.w{window}' if window > 1 else ''}.pt.trace.json.gz"


def later_traces(folder: Path, r: int | None) -> list[Path]:
    """The traces of windows after the first that `folder` holds for rank r."""
    return sorted(folder.glob(f"trace{suffix(r)}.w[0-9]*.pt.trace.json.gz")) if folder.is_dir() else []


def steps_name(r: int | None) -> str:
    """The whole run's step record (steps/record.py)."""
    return f"steps{suffix(r)}.jsonl"


def telemetry_name(r: int | None) -> str:
    """The GPU's own telemetry over the run, sampled by NVML (steps/telemetry.py)."""
    return f"telemetry{suffix(r)}.jsonl"


def rank_traces(out: Path) -> list[Path]:
    """The traces the ranks of a job wrote into `out`."""
    return sorted(out.glob(trace_name(None).replace("trace.", "trace.rank*.", 1)))


def old_trace_name(r: int | None) -> str:
    """The name run folders used before (still read; replaced by --force)."""
    return f"trace{suffix(r)}.json.gz"


def log_name(r: int | None) -> str:
    return f"profiler{suffix(r)}.log"


def snapshot_name(r: int | None) -> str:
    return f"memory{suffix(r)}.pickle"


def run_json_name(r: int | None) -> str:
    return f"run{suffix(r)}.json" if r not in (None, 0) else "run.json"


def new_run_dir(script: str, base: Path | None = None) -> Path:
    """A fresh ./gpuadvise-runs/<script>-<timestamp>[-N] folder; never an existing one."""
    base = base or Path(RUNS_DIR)
    stem = Path(script).stem or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = base / f"{stem}-{stamp}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stem}-{stamp}-{n}"
    return candidate


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, default=str)
        publish(tmp)  # mkstemp makes it private; a run folder is meant to be shared (under the umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}

"""The run folder `gpuadvise profile` writes: names, atomic writes, rank-aware file names.

Files: `trace.pt.trace.json.gz` (the recorded window, named as TensorBoard's profiler plugin and HTA
expect; run folders written before used `trace.json.gz`, still read), `memory.pickle` (GPU: CUDA memory snapshot),
`run.json` (what happened; rewritten atomically while the script runs, so it is true even after a
crash or `os._exit`). Under torchrun they carry the rank (`trace.rank3.pt.trace.json.gz`, `run.rank3.json`).
`profiler.log`: the profiler's own log lines (kineto), kept off the user's stderr.

run.json, the keys the capture writes:
- `command`, `script`, `argv`, `cwd`, `started_at`, `ended_at`, `duration_s`, `exit_code`,
  `exit_signal` (if killed by one), `script_exit_code` (as the child saw it), `rank`;
- `environment` (torch/CUDA/cuDNN/Python versions, device), `settings` (TF32, cudnn.benchmark),
  `dataloaders`, `optimizers`, `autocast`, `compile`, `wrappers` (facts.py); `distributed` (the job's
  process group, DDP/FSDP/DeepSpeed settings, backward passes per optimizer step: distfacts.py);
- `capture`: `state` ("captured", "waiting for steps", "incomplete: …", "failed: …"), `error`,
  `steps_stepped` (step boundaries seen), `step_source` (what marked the window's steps:
  "optimizer.step()", "DataLoader batch", "gpuadvise.step()", "backward()", "CUDA graph replay"),
  `files`, `window` {wait, warmup, active}, `options` {record_shapes, shapes_probe, with_stack,
  profile_memory, memory_history}, `memory_steps` (steps of CUDA memory history after the window;
  0 without a GPU), `memory_stats` (GPU: `torch.cuda.memory_stats()` at the end of the window),
  `shapes`: where the trace's shapes come from: {"mode": "window"} (record_shapes on in the window:
  every op has shapes; `--record-shapes`, or a window too short for the probe) or the shape probe
  (`mode` "probe", `probe_step`, `state` — "annotated", "partial: …", "not annotated: …", "no
  matmuls in the window", "probe failed: …", "merge failed: …" —, `matmuls` in the window,
  `annotated` of them, `probe_matmuls`); absent with `--no-record-shapes --no-shapes-probe`;
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
    "dataloader", "manual", "backward", "cuda_graph";
  - `count`: steps completed in all; `kept`: "all", or "first N and last M of COUNT" (long runs keep
    the first `wait+warmup+active+100` steps and the last 50);
  - `settle`: steps numbered ≤ settle (2) are the loop's own start-up and count in no median;
  - `unprofiled_median_ms`, `unprofiled_n`: median `ms` of the kept steps with phase "wait", "after"
    or "off" and number > settle, except the first "after" step (it follows the trace export, or
    the memory snapshot's dump, and runs on cold caches); null when there are none; `profiled_median_ms`, `profiled_n`:
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


def trace_name(r: int | None) -> str:
    # `*.pt.trace.json.gz` is the name TensorBoard's profiler plugin and HTA look for
    return f"trace{suffix(r)}.pt.trace.json.gz"


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

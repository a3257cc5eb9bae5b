"""Where the DataLoader's time goes.

End to end (real `gpuadvise profile` runs on the CPU): a dataset whose `__getitem__` spends its time
in one named function, loaded in the training process and in two workers (forked, and spawned); the
dataloader-stall finding must name that function with its file:line and a share, and its per-batch
build time must agree with what the dataset measures of itself.

Rule level: the "more workers" prediction follows the measured build time and the free cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("pyinstrument")

from gpuadvise import analyze  # noqa: E402  (public API only)
from gpuadvise.fixtures.builder import TraceBuilder  # noqa: E402

BATCH = 4
# Per sample: 200 ms of sleep per batch, one batch every 100 ms from 2 workers: far above the tiny step's
# own time even on a loaded machine, so the workers lag whatever the load (not only a hand-over).
SLEEP_S = 0.05
WAIT, WARMUP, ACTIVE = 3, 1, 5
# One batch in flight per worker: a pause of the training process (the profiler starting, a busy machine)
# lets the 2 workers get at most 2 batches ahead, so most of the 5 recorded steps still wait on them.
PREFETCH = 1

DATASET = f'''
import os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

LOG = os.environ["DS_LOG"]


def decode_record(i):
    time.sleep({SLEEP_S})
    return torch.full((16,), float(i))


class Records(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        start, t = time.time(), time.perf_counter()
        x = decode_record(i)
        with open(os.path.join(LOG, f"{{os.getpid()}}.log"), "a") as fh:  # the dataset's own timing
            fh.write(f"{{start}} {{time.perf_counter() - t}}\\n")
        return x, torch.tensor(i % 2)


def user_init(worker_id):  # the user's own worker_init_fn: must still run
    open(os.path.join(LOG, f"init-{{worker_id}}"), "w").close()


if __name__ == "__main__":
    workers, context = int(sys.argv[1]), sys.argv[2]
    kw = dict(num_workers=workers, worker_init_fn=user_init if workers else None)
    if workers:
        kw["prefetch_factor"] = {PREFETCH}
    if workers and context != "default":
        kw["multiprocessing_context"] = context
    model = torch.nn.Linear(16, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for n, (x, y) in enumerate(DataLoader(Records(), batch_size={BATCH}, **kw)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if n == {WAIT + WARMUP + ACTIVE + 2}:  # a couple of steps past the window, then done
            break
'''


def _def_line(source: str, name: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if line.startswith(f"def {name}("))


@pytest.mark.parametrize("workers,context", [(0, "default"), (2, "fork"), (2, "spawn")])
@pytest.mark.slow
def test_stall_finding_names_the_slow_function_and_the_build_time(tmp_path, workers, context):
    script = tmp_path / "ds.py"
    script.write_text(DATASET)
    log = tmp_path / "log"
    log.mkdir()
    run = tmp_path / "run"
    env = dict(__import__("os").environ, DS_LOG=str(log))
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", str(run), "--wait", str(WAIT),
                           "--warmup", str(WARMUP), "--active", str(ACTIVE), str(script), str(workers), context],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    if workers:
        assert sorted(p.name for p in log.glob("init-*")) == ["init-0", "init-1"]  # the user's worker_init_fn ran
    loader = json.loads((run / "run.json").read_text())["capture"]["loader"]
    assert loader["num_workers"] == workers
    if workers:  # a worker whose batch is still being built when the window ends is not counted yet
        assert loader["processes"]["main"] == 0 and 1 <= loader["processes"]["workers"] <= 2
    else:
        assert loader["processes"] == {"main": 1, "workers": 0}
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no scratch files in the run folder

    report = analyze(run)
    stall = [f for f in report.findings if f.topic == "dataloader-stall"]
    assert stall, [f.topic for f in report.findings]
    f = stall[0]
    where = f"ds.py:{_def_line(DATASET, 'decode_record')}"
    item = next(i for i in f.evidence["items"] if i["name"] == "decode_record")
    assert item["where"] == where
    assert item["share_of_build_pct"] >= 80  # sleeping in it is nearly all of the build
    assert f"`decode_record` ({where})" in f.message
    assert any(s.startswith(where) for s in f.evidence["sources"])

    # the dataset's own timing of __getitem__ for the samples built while the window recorded, per
    # batch, against the finding's build time (the machine's load varies: compare the same batches)
    windows = loader["recorded"]
    assert windows and all(end is not None for _, end in windows)
    per_sample = [float(dur) for p in log.glob("*.log") for start, dur in (ln.split() for ln in p.read_text().splitlines())
                  if any(a <= float(start) <= b for a, b in windows)]
    assert len(per_sample) >= BATCH
    measured_ms = 1e3 * BATCH * sum(per_sample) / len(per_sample)
    build_ms = f.evidence["numbers"]["build_per_batch_ms"]
    assert abs(build_ms - measured_ms) <= 0.25 * measured_ms, (build_ms, measured_ms)
    assert f.evidence["numbers"]["num_workers"] == workers


# -- the "more workers" prediction ---------------------------------------------------------------------
def _run_folder(tmp_path: Path, usable_cpus: int, workers: int = 0, ranks_on_node: int | None = None,
                build_ms: float = 20.0, build_cpu_ms: float | None = None) -> Path:
    """The rule's positive trace (20 ms waits in ~32 ms steps: 12 ms between batches) with run.json's machine
    and measured loading: the build takes `build_ms` of the 20 ms wait the probe saw over the same batches."""
    from gpuadvise.rules import find_rule

    b: TraceBuilder = find_rule("dataloader-stall").positive()  # 20 ms waits per step, num_workers=0
    b.facts = {
        "environment": {"machine": {"cpu": {"logical": usable_cpus, "usable": usable_cpus, "cgroup_limit": None}}},
        "dataloaders": [{"created_at": "train.py:12", "num_workers": workers, "pin_memory": True}],
        "capture": {"loader": {"num_workers": workers, "build_ms_per_batch": build_ms, "between_batches_ms": 12.0,
                   "wait_ms_per_batch": 20.0, "fetch_ms_per_sample": 5.0, "collate_ms_per_batch": 0.1,
                   "fetch": "__getitem__",
                   "functions": [{"function": "decode_image", "file": "dataset.py", "line": 41, "share_pct": 71.0,
                                  "ms_per_batch": 14.2}]}},
    }
    if build_cpu_ms is not None:
        b.facts["capture"]["loader"]["build_cpu_ms_per_batch"] = build_cpu_ms
    if ranks_on_node:
        b.facts["distributed"] = {"world_size": ranks_on_node, "rank": 0, "local_world_size": ranks_on_node,
                                  "backend": "gloo"}
    return b.write_run_folder(tmp_path / f"run{usable_cpus}-{ranks_on_node}-{build_ms:g}-{build_cpu_ms}")


def _code(fix: str) -> str:
    """The fix's ```python block."""
    return fix.split("```python", 1)[1].split("```", 1)[0] if "```python" in fix else ""


def _stall(folder: Path):
    return next(f for f in analyze(folder).findings if f.topic == "dataloader-stall")


def test_more_workers_prediction_follows_the_cores_each_rank_has(tmp_path):
    # 20 ms per batch, one used every 12 ms: 2 workers keep up; 2 usable cores leave 1 free (20 - 12 = 8 ms
    # left, plus the hand-over), 16 allow the 2 that keep up (the hand-over left)
    one, two = _stall(_run_folder(tmp_path, 2)), _stall(_run_folder(tmp_path, 16))
    assert one.evidence["numbers"]["suggested_num_workers"] == 1 and one.evidence["numbers"]["free_cores"] == 1
    assert two.evidence["numbers"]["suggested_num_workers"] == 2
    assert "num_workers=1" in one.recommendation and "num_workers=2" in two.recommendation
    assert two.saving_pct > one.saving_pct > 0
    assert "71% of the build is in `decode_image` (dataset.py:41)" in one.message
    # the fix block gives the count the advice gives, never a formula that disagrees with it
    assert "num_workers=2," in _code(two.fix) and "os.cpu_count" not in _code(two.fix)
    # no free core: on one core, or two ranks of a torchrun job on two cores (a core each): no worker is
    # recommended, nothing is predicted from one, and the fix block asks for none
    for none in (_stall(_run_folder(tmp_path, 1)), _stall(_run_folder(tmp_path, 2, ranks_on_node=2))):
        assert "num_workers=" not in none.recommendation.split("\n")[0]
        assert "no free core" in none.recommendation.lower()
        assert none.saving_pct == 0 and none.severity == "low"
        assert "num_workers=" not in _code(none.fix)
    ddp = _stall(_run_folder(tmp_path, 2, ranks_on_node=2))
    assert "2 usable, 2 ranks on this node: 1 per rank" in ddp.recommendation
    assert ddp.evidence["numbers"]["cores_per_rank"] == 1


def test_a_build_that_waits_on_io_needs_little_of_a_core(tmp_path):
    """A 20 ms build of which 1 ms is CPU (the rest sleeps on a disk): on 2 cores one core is spare, and each
    worker needs a twentieth of it, so the 2 that keep up fit where a CPU-bound build allows one; with two
    ranks on the two cores no core is spare, whatever the build."""
    io, cpu = _stall(_run_folder(tmp_path, 2, build_cpu_ms=1.0)), _stall(_run_folder(tmp_path, 2, build_cpu_ms=20.0))
    assert io.evidence["numbers"]["suggested_num_workers"] == 2 and cpu.evidence["numbers"]["suggested_num_workers"] == 1
    assert io.saving_pct > cpu.saving_pct
    ddp = _stall(_run_folder(tmp_path, 2, ranks_on_node=2, build_cpu_ms=1.0))
    assert ddp.evidence["numbers"]["suggested_num_workers"] == 0 and ddp.saving_pct == 0


def test_no_workers_where_receiving_a_batch_costs_more_than_building_it(tmp_path):
    """The build is 1 ms of the 20 ms wait (the rest is the sampler and the iterator, which stay in the
    training process): a worker would hide 1 ms and cost the hand-over of a ready batch (up to 2 ms), so the
    replay says workers cost time, and none are advised even with cores to spare."""
    f = _stall(_run_folder(tmp_path, 16, build_ms=1.0))
    assert f.evidence["numbers"]["suggested_num_workers"] == 0
    assert f.saving_pct == 0 and "num_workers=" not in f.recommendation.split("\n")[0]
    assert "workers would not pay" in f.recommendation.lower()
    # the build is quoted as part of the median wait, never above it
    assert f.evidence["numbers"]["build_per_batch_ms"] <= f.evidence["numbers"]["median_dataloader_ms_per_step"]


def test_a_killed_runs_folder_is_removed_by_the_next_run(tmp_path):
    """SIGKILL, SIGTERM's default action or os._exit inside the window leave the probe's temporary folder
    behind; the next run removes the folders whose process no longer runs, and only those."""
    from gpuadvise.harness.loaderprobe import FOLDER_PREFIX, sweep_dead_runs

    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid runs nothing now
    gone = tmp_path / f"{FOLDER_PREFIX}{dead.pid}-0000aaaa"
    running = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-0000bbbb"
    other = tmp_path / "gpuadvise-loader-notes"
    for folder in (gone, running, other):
        folder.mkdir()
        (folder / "recording").touch()
    assert sweep_dead_runs(str(tmp_path)) == [str(gone)]
    assert not gone.exists() and running.exists() and other.exists()

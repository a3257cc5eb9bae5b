"""The capture side of the profiler's cost: `gpuadvise profile` times the run it does not profile, records a lean
window (matmul shapes from a one-step probe), finds steps in loops without an optimizer or a
DataLoader, and keeps the profiler's own stderr noise away from the user's.

The end-to-end tests run the real command in a subprocess; the StepTimes tests drive the CUDA-event
branch with a stand-in for torch.cuda (no GPU here), checking the bookkeeping, not CUDA itself.
"""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpuadvise.harness.windows import quiet  # noqa: E402
from gpuadvise.harness.steps.times import StepTimes  # noqa: E402

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
PREFIX = "gpuadvise> "
TIMEOUT = 300
W, WARMUP, ACTIVE = 10, 2, 3  # the default window
FIRST_ACTIVE = W + WARMUP  # ProfilerStep number of the first recorded step
UNPROFILED = ("wait", "after", "off")


def _run(cmd, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, timeout=TIMEOUT, env=env)
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def profile(args, cwd: Path) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "gpuadvise", "profile", *args], cwd)


def native(args, cwd: Path) -> subprocess.CompletedProcess:
    return _run([sys.executable, *args], cwd)


def show(p) -> str:
    return f"rc={p.returncode}\n--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr}"


def script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def load(trace: Path):
    from gpuadvise.analyzer.read.loader import load_trace
    from gpuadvise.analyzer.measure.basics.metrics import compute

    model = load_trace(trace)
    return model, compute(model).steps


def raw_ops(trace: Path, names: set[str]) -> list[dict]:
    """The trace's cpu_op events with these names, as written (the loader keeps shapes of matmuls only)."""
    with gzip.open(trace, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return [e for e in events if e.get("cat") == "cpu_op" and e.get("name") in names]


def expected_medians(steps: dict) -> tuple[float | None, float | None]:
    rows = list(zip(steps["number"], steps["phase"], steps["ms"]))
    first_after = next((n for n, ph, _ in rows if ph == "after"), None)  # it follows the export: not counted
    unprof = [ms for n, ph, ms in rows
              if ph in UNPROFILED and n > steps["settle"] and n != first_after and ms is not None]
    prof = [ms for n, ph, ms in rows if ph == "active" and ms is not None]
    return (statistics.median(unprof) if unprof else None), (statistics.median(prof) if prof else None)


# -- step times in and out of the window, on a shipped example ------------------------------------------
@pytest.fixture(scope="module")
def small_ops_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("smallops")
    proc = profile(["-q", "-o", "RUN", str(EXAMPLES / "train_small_ops.py"), "--steps", "30"], cwd)
    return cwd / "RUN", proc


@pytest.mark.slow
def test_example_run_json_has_step_times_in_and_out_of_the_window(small_ops_run):
    run_dir, proc = small_ops_run
    assert proc.returncode == 0, show(proc)
    assert "done: 30 steps" in proc.stdout
    steps = run_json(run_dir)["steps"]

    # 30 optimizer steps are 30 boundaries: steps 1..29 complete (the last one is cut by the exit)
    assert steps["count"] == 29 and steps["kept"] == "all"
    assert steps["number"] == list(range(1, 30))
    assert set(steps["step_sources"]) == {"optimizer"} and steps["source"] == "optimizer"
    expected = (["wait"] * (W - 2) + ["shapes"] + ["warmup"] * WARMUP + ["active"] * ACTIVE
                + ["after"] * (29 - W - WARMUP - ACTIVE + 1))
    assert steps["phase"] == expected
    assert steps["clock"] == ("cuda_event" if torch.cuda.is_available() else "cpu")
    assert all(ms is not None and ms > 0 for ms in steps["ms"])

    # medians: unprofiled = wait + after steps past the settling ones; profiled = the recorded steps
    unprof, prof = expected_medians(steps)
    assert steps["unprofiled_median_ms"] == pytest.approx(unprof, abs=1e-3)
    assert steps["profiled_median_ms"] == pytest.approx(prof, abs=1e-3)
    assert steps["unprofiled_n"] == (W - 2 - steps["settle"]) + (29 - FIRST_ACTIVE - ACTIVE + 1) - 1
    assert steps["profiled_n"] == ACTIVE
    assert steps["overhead_x"] == pytest.approx(prof / unprof, rel=1e-2, abs=1e-3)  # rounded to 3 decimals


@pytest.mark.slow
def test_profiled_steps_are_the_traces_steps(small_ops_run):
    """The steps run.json calls profiled are the trace's ProfilerSteps, and their times fit inside them
    (a step's time excludes gpuadvise's own work at the boundary; the trace's step includes it)."""
    run_dir, proc = small_ops_run
    assert proc.returncode == 0, show(proc)
    steps = run_json(run_dir)["steps"]
    _, trace_steps = load(run_dir / "trace.pt.trace.json.gz")
    recorded = {n: ms for n, ph, ms in zip(steps["number"], steps["phase"], steps["cpu_ms"]) if ph == "active"}
    assert sorted(recorded) == [s.number for s in trace_steps] == list(range(FIRST_ACTIVE, FIRST_ACTIVE + ACTIVE))
    trace_ms = {s.number: (s.end - s.start) / 1000 for s in trace_steps}
    for n, ms in recorded.items():
        assert ms <= trace_ms[n] * 1.01 + 0.2, (n, ms, trace_ms[n])
    assert sum(recorded.values()) >= 0.5 * sum(trace_ms.values()), (recorded, trace_ms)


@pytest.mark.slow
def test_stop_after_capture_counts_the_steps_before_the_window(tmp_path):
    proc = profile(["-q", "-o", "RUN", "--stop-after-capture", str(EXAMPLES / "train_small_ops.py"), "--steps", "500"],
                   tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done" not in proc.stdout
    steps = run_json(tmp_path / "RUN")["steps"]
    assert "after" not in steps["phase"]
    assert steps["number"] == list(range(1, FIRST_ACTIVE + ACTIVE))
    assert steps["unprofiled_n"] == W - 2 - steps["settle"]  # steps 3..8: wait, minus settling and the probe
    assert steps["profiled_n"] == ACTIVE
    unprof, prof = expected_medians(steps)
    assert steps["unprofiled_median_ms"] == pytest.approx(unprof, abs=1e-3)
    assert steps["overhead_x"] == pytest.approx(prof / unprof, rel=1e-2, abs=1e-3)  # rounded to 3 decimals


@pytest.mark.slow
def test_a_failed_profiler_still_times_the_run(tmp_path):
    """torch.profiler.profile.step breaks at the first step: the run goes on unprofiled, and run.json
    still has its step times, all unprofiled ("off")."""
    (tmp_path / "break_profiler.py").write_text((HERE / "probes" / "break_profiler.py").read_text())
    proc = profile(["-q", "-o", "RUN", "break_profiler.py", "step"], tmp_path)
    assert proc.returncode == 0, show(proc)
    run = run_json(tmp_path / "RUN")
    assert run["capture"]["state"] == "failed: profiler step failed"
    steps = run["steps"]
    assert steps["number"] == [1, 2, 3, 4, 5] and set(steps["phase"]) == {"off"}
    assert steps["unprofiled_n"] == 3 and steps["unprofiled_median_ms"] > 0
    assert steps["profiled_median_ms"] is None and steps["overhead_x"] is None


# -- shapes: only matmuls, from the probe step ----------------------------------------------------------
@pytest.mark.slow
def test_window_has_matmul_shapes_from_the_probe_and_no_other_shapes(small_ops_run):
    run_dir, proc = small_ops_run
    assert proc.returncode == 0, show(proc)
    run = run_json(run_dir)
    assert run["capture"]["options"]["record_shapes"] is False
    shapes = run["capture"]["shapes"]
    model, _ = load(run_dir / "trace.pt.trace.json.gz")
    cpu = model.cpu.assign(name=model.cpu["name"].astype(str), dims=model.cpu["input_dims"].astype(str))
    matmuls = cpu[cpu["name"].isin(["aten::addmm", "aten::mm", "aten::linear"])]
    assert len(matmuls) > 0
    assert shapes["state"] == "annotated" and shapes["annotated"] == shapes["matmuls"] == len(matmuls)
    assert shapes["probe_step"] == W - 1
    # every recorded matmul has the probe's shapes: batch 16 × width 64 into Linear(64, 64)
    addmm = matmuls[matmuls["name"] == "aten::addmm"]
    assert len(addmm) and all(json.loads(d)[1] == [16, 64] for d in addmm["dims"]), addmm["dims"].unique()
    # ... and the window itself was recorded without shapes
    others = raw_ops(run_dir / "trace.pt.trace.json.gz", {"aten::layer_norm", "aten::gelu"})
    assert len(others) and not any("Input Dims" in e["args"] for e in others)


@pytest.mark.slow
def test_matmuls_that_change_between_steps_get_no_shapes(tmp_path):
    """One matmul in odd steps, two in even ones: the probe step does not match every recorded step,
    so the window's matmuls get no shapes rather than wrong ones."""
    script(tmp_path, "varying.py", """
        import torch
        w = torch.nn.Parameter(torch.randn(24, 24))
        opt = torch.optim.SGD([w], lr=1e-3)
        x = torch.randn(8, 24)
        for i in range(20):
            y = x
            for _ in range(1 + i % 2):
                y = y @ w
            y.sum().backward()
            opt.step()
            opt.zero_grad()
        print("done", flush=True)
    """)
    proc = profile(["-q", "-o", "RUN", "varying.py"], tmp_path)
    assert proc.returncode == 0, show(proc)
    shapes = run_json(tmp_path / "RUN")["capture"]["shapes"]
    assert shapes["state"].startswith("not annotated"), shapes
    assert shapes["annotated"] == 0 and shapes["matmuls"] > 0
    mm = raw_ops(tmp_path / "RUN" / "trace.pt.trace.json.gz", {"aten::mm"})
    assert len(mm) and not any("Input Dims" in e["args"] for e in mm)


@pytest.mark.slow
def test_record_shapes_records_every_op_and_skips_the_probe(tmp_path):
    proc = profile(["-q", "-o", "RUN", "--record-shapes", str(EXAMPLES / "train_small_ops.py"), "--steps", "20"],
                   tmp_path)
    assert proc.returncode == 0, show(proc)
    run = run_json(tmp_path / "RUN")
    assert "shapes" not in run["steps"]["phase"] and run["capture"]["shapes"] == {"mode": "window"}
    ln = raw_ops(tmp_path / "RUN" / "trace.pt.trace.json.gz", {"aten::layer_norm"})
    assert len(ln) and all(e["args"]["Input Dims"][0] == [16, 64] for e in ln)


@pytest.mark.slow
def test_window_without_warmup_records_shapes_itself_instead_of_probing(tmp_path):
    """--warmup 0 would start the window at the very boundary where the probe stops; torch segfaults
    when one profiler stops and another starts inside one open record_function (the optimizer hook
    runs inside `Optimizer.step#…`). So no probe: the window records shapes itself."""
    proc = profile(["-q", "-o", "RUN", "--warmup", "0", str(EXAMPLES / "train_small_ops.py"), "--steps", "20"],
                   tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done: 20 steps" in proc.stdout
    run = run_json(tmp_path / "RUN")
    assert run["capture"]["state"] == "captured" and run["capture"]["shapes"] == {"mode": "window"}
    assert "shapes" not in run["steps"]["phase"]
    ln = raw_ops(tmp_path / "RUN" / "trace.pt.trace.json.gz", {"aten::layer_norm"})
    assert len(ln) and all("Input Dims" in e["args"] for e in ln)


# -- loops the hooks don't see ----------------------------------------------------------------------------
HAND_SGD = """
    import sys
    import torch
    torch.manual_seed(0)
    w = torch.randn(32, 1, requires_grad=True)
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    for i in range(int(sys.argv[1])):
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():  # a hand-written SGD update: no optimizer, no DataLoader
            w -= 0.01 * w.grad
            w.grad = None
    print("done", flush=True)
"""


@pytest.mark.slow
def test_hand_written_update_loop_is_stepped_by_backward(tmp_path):
    script(tmp_path, "sgd.py", HAND_SGD)
    proc = profile(["-q", "-o", "RUN", "sgd.py", "25"], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert proc.stdout == "done\n"
    trace = tmp_path / "RUN" / "trace.pt.trace.json.gz"
    assert trace.is_file(), show(proc)
    _, steps = load(trace)
    assert len(steps) == ACTIVE
    run = run_json(tmp_path / "RUN")
    assert run["capture"]["state"] == "captured"
    assert run["capture"]["step_source"] == "backward()"
    assert run["steps"]["source"] == "backward"
    assert run["steps"]["unprofiled_median_ms"] > 0 and run["steps"]["overhead_x"] is not None
    ours = [line for line in proc.stderr.splitlines() if line.startswith(PREFIX)]
    assert any("backward()" in line and "gpuadvise.step()" in line for line in ours), proc.stderr


@pytest.mark.slow
def test_optimizer_takes_over_from_backward_under_gradient_accumulation(tmp_path):
    """Four backward() per optimizer step: the early backward() calls may mark steps until the first
    optimizer step, which then marks every step; the recorded window is optimizer steps."""
    script(tmp_path, "accum.py", """
        import torch
        model = torch.nn.Linear(16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        for i in range(25):
            for micro in range(4):
                (model(torch.randn(8, 16)) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        print("done", flush=True)
    """)
    proc = profile(["-q", "-o", "RUN", "accum.py"], tmp_path)
    assert proc.returncode == 0, show(proc)
    run = run_json(tmp_path / "RUN")
    assert run["capture"]["state"] == "captured"
    assert run["capture"]["step_source"] == "optimizer.step()"
    steps = run["steps"]
    assert steps["source"] == "optimizer"
    # once the optimizer stepped, backward() never marks a step again
    first = steps["step_sources"].index("optimizer")
    assert set(steps["step_sources"][first:]) == {"optimizer"} and first <= 3
    assert "gpuadvise.step()" not in proc.stderr


@pytest.mark.slow
def test_fallback_takes_over_when_the_optimizer_falls_silent(tmp_path):
    """A few optimizer steps, then a loop the hooks don't see (as a CUDA-graph loop is: eager warm-up
    steps, one captured step, then only replays; here backward() plays the replay, which a CPU cannot
    run): once the optimizer has been silent for several of its steps, backward() marks the steps."""
    script(tmp_path, "warm_then_manual.py", """
        import torch
        model = torch.nn.Linear(32, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(256, 32)
        for i in range(4):  # the eager warm-up, with an optimizer
            (model(x) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        for i in range(200):  # then an update the optimizer hook never sees
            (model(x) ** 2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad
                    p.grad = None
        print("done", flush=True)
    """)
    proc = profile(["-q", "-o", "RUN", "warm_then_manual.py"], tmp_path)
    assert proc.returncode == 0, show(proc)
    run = run_json(tmp_path / "RUN")
    assert run["capture"]["state"] == "captured", run["capture"]
    assert run["capture"]["step_source"] == "backward()" and run["steps"]["source"] == "backward"
    sources = run["steps"]["step_sources"]
    assert sources[:4] == ["optimizer"] * 4 and set(sources[4:]) == {"backward"}
    assert "gpuadvise.step()" in proc.stderr


@pytest.mark.slow
def test_loop_without_any_step_signal_says_to_call_gpuadvise_step(tmp_path):
    script(tmp_path, "nosteps.py", """
        import torch
        x = torch.randn(64, 64)
        for _ in range(30):
            x = torch.tanh(x @ x)
        print("done", flush=True)
    """)
    proc = profile(["-o", "RUN", "nosteps.py"], tmp_path)
    assert proc.returncode == 0, show(proc)
    run = run_json(tmp_path / "RUN")
    assert run["capture"]["state"].startswith("incomplete")
    assert run["steps"]["count"] == 0
    assert "gpuadvise.step()" in proc.stderr


# -- stderr: the profiler's noise goes, the user's output stays --------------------------------------------
NOISY = """
    import os, sys, warnings
    import torch
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(20):
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        if i % 4 == 0:
            print(f"user line {i}", file=sys.stderr)
            sys.stderr.write(f"partial {i} ... ")  # no newline before the step boundary
        opt.step()
        if i % 4 == 0:
            sys.stderr.write("rest of it\\n")
            os.write(2, f"raw fd2 line {i}\\n".encode())
        if i == 13:  # inside the recorded window: a line shaped like kineto's own, but the user's
            sys.stderr.write("USDT:2026-01-01 00:00:00 1:1 mine.cpp:1] the user's own line\\n")
            warnings.warn("Warning: Profiler clears events at the end of each cycle. (the user's)")
    # the same warning as torch.profiler raises it
    warnings.warn_explicit("Warning: Profiler clears events at the end of each cycle. (torch's)",
                           UserWarning, "profiler.py", 300, module="torch.profiler.profiler")
    print("done", flush=True)
"""


@pytest.fixture(scope="module")
def noisy_runs(tmp_path_factory):
    """The noisy script run by python and under `gpuadvise profile`, in one folder: (plain, profiled, run folder)."""
    cwd = tmp_path_factory.mktemp("noisy")
    script(cwd, "noisy.py", NOISY)
    return native(["noisy.py"], cwd), profile(["-q", "-o", "RUN", "noisy.py"], cwd), cwd / "RUN"


@pytest.mark.slow
def test_users_stderr_passes_untouched_and_the_profilers_noise_does_not(noisy_runs):
    plain, proc, run_dir = noisy_runs
    assert plain.returncode == 0 and proc.returncode == 0, show(proc)
    assert proc.stdout == plain.stdout
    ours = [line for line in proc.stderr.splitlines(keepends=True) if line.startswith(PREFIX)]
    theirs = "".join(line for line in proc.stderr.splitlines(keepends=True) if not line.startswith(PREFIX))
    torchs = [line for line in plain.stderr.splitlines(keepends=True) if "(torch's)" in line]
    assert len(torchs) == 1, plain.stderr  # the one line python prints for torch's own warning
    assert theirs == plain.stderr.replace(torchs[0], "")  # every byte of the user's, in order; only torch's gone
    assert "the user's own line" in theirs and "(the user's)" in theirs
    assert any("captured" in line for line in ours)
    assert run_json(run_dir)["capture"]["state"] == "captured"
    # torch 2.13's kineto writes "USDT:… profiler_start" at each transition: none of it shows
    assert "profiler_start" not in proc.stderr and "profiler_stop" not in proc.stderr


@pytest.mark.slow
def test_the_profilers_own_warning_is_silenced(noisy_runs):
    plain, proc, _ = noisy_runs
    assert "(torch's)" in plain.stderr  # the probe does raise it
    assert proc.returncode == 0, show(proc)
    assert "(torch's)" not in proc.stderr
    assert "(the user's)" in proc.stderr


def test_strip_kineto_removes_only_kineto_log_lines():
    data = (b"before\n"
            b"USDT:2026-11-23 01:24:48 8084:8084 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
            b"STAGE:2024-05-18 20:39:22 3204:3204 ActivityProfilerController.cpp:314] Completed Stage: Warm Up\n"
            b"a line about USDT:2026-11-23 01:24:48 1:1 x.cpp:1] in the middle\n"
            b"ERROR:2026-11-23 01:24:48 1:1 CuptiActivityApi.cpp:1] kept: errors matter\n"
            b"partial without newline")
    assert quiet.strip_kineto(data) == (b"before\n"
                                        b"a line about USDT:2026-11-23 01:24:48 1:1 x.cpp:1] in the middle\n"
                                        b"ERROR:2026-11-23 01:24:48 1:1 CuptiActivityApi.cpp:1] kept: errors matter\n"
                                        b"partial without newline")


# -- StepTimes: the CUDA-event branch, with a stand-in for torch.cuda ---------------------------------------
class FakeClock:
    def __init__(self):
        self.gpu_ms = 0.0  # where the stand-in GPU stream is


class FakeEvent:
    def __init__(self, cuda, enable_timing=False):
        assert enable_timing, "timing events must be created with enable_timing=True"
        self.cuda, self.at, self.done_at = cuda, None, None

    def record(self):
        self.at = self.cuda.clock.gpu_ms
        self.cuda.recorded += 1

    def query(self):
        return self.cuda.completed_until >= self.at

    def synchronize(self):
        self.cuda.synchronized += 1
        self.cuda.completed_until = max(self.cuda.completed_until, self.at)

    def elapsed_time(self, end):
        assert self.query() and end.query(), "elapsed_time on an unfinished event raises in CUDA"
        return end.at - self.at


class FakeCuda:
    def __init__(self):
        self.clock, self.recorded, self.synchronized = FakeClock(), 0, 0
        self.completed_until = -1.0
        self.initialized, self.capturing = True, False

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def is_current_stream_capturing(self):
        return self.capturing

    def Event(self, enable_timing=False):  # noqa: N802 - torch.cuda.Event
        return FakeEvent(self, enable_timing)


class FakeTorch:
    def __init__(self):
        self.cuda = FakeCuda()


def _steps(times: StepTimes, cuda: FakeCuda, phases_ms: list[tuple[str, float]], complete: bool = True):
    """Run steps 1.. with the given phase and GPU duration each; the GPU finishes work as it goes
    unless complete=False (it lags behind: nothing is done yet)."""
    for n, (phase, gpu_ms) in enumerate(phases_ms, start=1):
        times.end()
        times.begin(n, phase, "optimizer")
        cuda.clock.gpu_ms += gpu_ms
        if complete:
            cuda.completed_until = cuda.clock.gpu_ms
    times.end()


def test_step_times_use_cuda_events_resolved_lazily():
    t = FakeTorch()
    times = StepTimes(t, settle=0)
    plan = [("wait", 10.0), ("wait", 12.0), ("wait", 11.0), ("active", 25.0), ("active", 27.0), ("after", 30.0),
            ("after", 11.0)]
    _steps(times, t.cuda, plan, complete=False)  # the GPU lags: nothing resolved yet
    assert t.cuda.synchronized == 0
    summary = times.summary()
    assert summary["clock"] == "cuda_event"
    assert summary["gpu_ms"] == [None] * 7  # not waited for during the run
    t.cuda.completed_until = t.cuda.clock.gpu_ms  # the GPU caught up: resolved without a synchronize
    summary = times.summary()
    assert t.cuda.synchronized == 0
    assert summary["gpu_ms"] == [10.0, 12.0, 11.0, 25.0, 27.0, 30.0, 11.0]
    assert summary["ms"] == summary["gpu_ms"]  # the medians are the GPU's
    # unprofiled: the wait steps and the after steps but the first (it follows the export)
    assert summary["unprofiled_median_ms"] == 11.0 and summary["unprofiled_n"] == 4
    assert summary["profiled_median_ms"] == 26.0
    assert summary["overhead_x"] == pytest.approx(26.0 / 11.0, abs=1e-3)


def test_step_times_wait_for_the_gpu_only_at_a_normal_end():
    t = FakeTorch()
    times = StepTimes(t, settle=0)
    _steps(times, t.cuda, [("wait", 5.0), ("active", 9.0)], complete=False)
    times.close(wait_for_gpu=False)  # an interrupted script: never block on the GPU
    assert t.cuda.synchronized == 0 and times.summary()["gpu_ms"] == [None, None]
    times.close(wait_for_gpu=True)
    assert times.summary()["gpu_ms"] == [5.0, 9.0]


def test_no_event_while_a_cuda_graph_is_captured_or_before_cuda_is_initialised():
    t = FakeTorch()
    times = StepTimes(t, settle=0)
    t.cuda.initialized = False  # a CPU script on a GPU machine: timing must not initialise CUDA
    _steps(times, t.cuda, [("wait", 5.0)])
    assert t.cuda.recorded == 0 and times.summary()["clock"] == "cpu"
    t.cuda.initialized = True
    times.begin(2, "wait", "optimizer")
    t.cuda.capturing = True  # the optimizer hook fires inside torch.cuda.graph(): no event in the capture
    times.end()
    times.begin(3, "wait", "optimizer")
    t.cuda.capturing = False
    times.end()
    assert t.cuda.recorded == 1  # only step 2's start, recorded before the capture began
    s = times.summary()
    assert s["number"] == [1, 2, 3] and s["clock"] == "cpu"  # no step has both events
    assert s["unprofiled_n"] == 3 and s["unprofiled_median_ms"] is not None


def test_step_times_keep_bounded_memory_on_long_runs():
    times = StepTimes(None, keep_head=20, keep_tail=5, settle=2)
    for n in range(1, 10_001):
        times.end()
        times.begin(n, "wait" if n < 10 else "active" if n < 13 else "after", "optimizer")
    times.end()
    s = times.summary()
    assert s["count"] == 10_000 and s["clock"] == "cpu"
    assert s["number"] == list(range(1, 21)) + list(range(9_996, 10_001))
    assert s["kept"] == "first 20 and last 5 of 10000"
    assert s["profiled_n"] == 3 and s["unprofiled_n"] == (9 - 2) + (20 - 12 - 1) + 5


# -- the shape merge on its own: any JSON layout, only matching matmuls ----------------------------------
def _trace(events: list[dict], indent) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=indent).encode()


def _mm(name, ts, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 1.0,
            "args": {"External id": int(ts), **args}}


@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "pretty"])
def test_annotate_copy_adds_the_probes_shapes_and_changes_nothing_else(tmp_path, indent):
    from gpuadvise.harness.facts import shapes

    dims_a = {"Input Dims": [[8, 24], [24, 24]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    dims_b = {"Input Dims": [[8, 24], [24, 7]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    probe = tmp_path / "probe.json"
    probe.write_bytes(_trace([_mm("aten::mm", 1, **dims_a), _mm("aten::addmm", 2, **dims_b),
                              _mm("aten::relu", 3, **{"Input Dims": [[8, 24]]})], indent))
    window = [_mm("aten::mm", 10), {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1,
                                    "ts": 11, "dur": 1, "args": {"note": "a } and a { in a string"}},
              _mm("aten::addmm", 12), _mm("aten::mm", 20), _mm("aten::addmm", 22)]
    src = tmp_path / "window.json"
    src.write_bytes(_trace(window, indent))
    out = tmp_path / "out.json"
    with open(out, "wb") as dst:
        report = shapes.annotate_copy(src, dst, shapes.probe_events(probe), steps=2)
    assert report["state"] == "annotated" and report["annotated"] == report["matmuls"] == 4
    got = json.loads(out.read_text())["traceEvents"]
    expected = [dict(e, args=dict(e["args"], **extra)) for e, extra in
                zip(window, [dims_a, {}, dims_b, dims_a, dims_b])]
    assert got == expected


def test_annotate_copy_carries_what_the_flop_count_needs_for_convolutions_and_attention(tmp_path):
    """The probe copies shapes and scalar arguments (stride, padding, is_causal) of every op the FLOP
    count reads, not only matmuls: convolutions and each SDPA backend's ops too."""
    from gpuadvise.harness.facts import shapes

    conv = {"Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []],
            "Input type": ["c10::BFloat16"] * 3 + ["ScalarList"] * 3 + ["Scalar"],
            "Concrete Inputs": ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]}
    attn = {"Input Dims": [[2, 4, 128, 64]] * 3 + [[]] * 4, "Input type": ["c10::BFloat16"] * 3 + [""] * 4,
            "Concrete Inputs": ["", "", "", "0.", "True", "False", ""]}
    names = ["aten::conv2d", "aten::_scaled_dot_product_flash_attention", "aten::convolution_backward"]
    probe = tmp_path / "probe.json"
    probe.write_bytes(_trace([_mm(names[0], 1, **conv), _mm(names[1], 2, **attn), _mm(names[2], 3, **conv)], None))
    src = tmp_path / "window.json"
    src.write_bytes(_trace([_mm(n, 10 + i) for i, n in enumerate(names)], None))
    out = tmp_path / "out.json"
    with open(out, "wb") as dst:
        report = shapes.annotate_copy(src, dst, shapes.probe_events(probe), steps=1)
    assert report["state"] == "annotated" and report["annotated"] == 3
    got = json.loads(out.read_text())["traceEvents"]
    assert got[1]["args"]["Concrete Inputs"][4] == "True" and got[0]["args"]["Input Dims"] == conv["Input Dims"]


def test_annotate_copy_leaves_a_thread_whose_matmuls_differ(tmp_path):
    from gpuadvise.harness.facts import shapes

    dims = {"Input Dims": [[8, 24], [24, 24]], "Input type": ["float", "float"]}
    probe = tmp_path / "probe.json"
    probe.write_bytes(_trace([_mm("aten::mm", 1, tid=1, **dims), _mm("aten::mm", 2, tid=2, **dims)], 2))
    window = [_mm("aten::mm", 10, tid=1), _mm("aten::mm", 11, tid=2), _mm("aten::mm", 12, tid=2)]
    src = tmp_path / "window.json"
    src.write_bytes(_trace(window, 2))
    out = tmp_path / "out.json"
    with open(out, "wb") as dst:
        report = shapes.annotate_copy(src, dst, shapes.probe_events(probe), steps=1)
    assert report["state"].startswith("partial") and report["annotated"] == 1
    got = json.loads(out.read_text())["traceEvents"]
    assert got[0]["args"].get("Input Dims") == dims["Input Dims"]
    assert "Input Dims" not in got[1]["args"] and "Input Dims" not in got[2]["args"]

"""End-to-end tests of `gpuadvise profile`: every test runs the real command in a subprocess.

What they pin down:
- fidelity: the wrapped script sees what `python script.py` / `python -m module` would show it (argv,
  __name__, __file__, sys.path[0], cwd, stdin), the way pyinstrument tests its command line;
- exit codes: the script's own status, tracebacks and signals come through, and run.json records them;
- stepping: optimizer steps, DataLoader batches (no optimizer), gpuadvise.step();
- robustness: a broken profiler never stops the script; incomplete windows are explained;
- the run folder: -o / default folder / --force, run.json facts;
- the issue's end-to-end check: the planted stall in examples/train_stall.py is found and points at
  the line that creates the DataLoader.

Each run imports torch in the child (a few seconds), so windows are kept small.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from _cli_support import signal_when_ready

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # every test runs the real command

HERE = Path(__file__).resolve().parent
PROBES = HERE / "probes"
EXAMPLES = HERE.parent / "examples"
WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2"]  # three steps in all
TIMEOUT = 300
PREFIX = "gpuadvise> "


# -- helpers ------------------------------------------------------------------------------------------
def _env() -> dict:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # rank-suffixed file names under torchrun
        env.pop(var, None)
    return env


def _run(cmd: list[str], cwd: Path, input: bytes = b"") -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, timeout=TIMEOUT, env=_env())
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def profile(args: list[str], cwd: Path, input: bytes = b"") -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "gpuadvise", "profile", *args], cwd, input)


def native(args: list[str], cwd: Path, input: bytes = b"") -> subprocess.CompletedProcess:
    return _run([sys.executable, *args], cwd, input)


def analyze_json(run_dir: Path, cwd: Path) -> dict:
    proc = _run([sys.executable, "-m", "gpuadvise", "analyze", str(run_dir), "--format", "json"], cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def findings(report: dict) -> list[dict]:
    if "findings" in report:
        return report["findings"]
    return [f for r in report.get("reports", []) for f in r.get("findings", [])]


def run_json(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def show(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


def copy_probe(name: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(PROBES / name, dest / name))


def call_line(path: Path, func: str) -> int:
    """Line of the (single) call `func(...)` in a source file, found by parsing it."""
    tree = ast.parse(path.read_text())
    lines = [n.lineno for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == func]
    assert len(lines) == 1, f"expected one {func}( call in {path}, found lines {lines}"
    return lines[0]


def same_file(where: str, cwd: Path, expected: Path, line: int) -> bool:
    """Does a `file:line` string (relative to cwd, or absolute) name `expected` at `line`?"""
    file, _, lineno = where.rpartition(":")
    if not file or not lineno.isdigit():
        return False
    return (cwd / file).resolve() == expected.resolve() and int(lineno) == line


def load_steps(trace: Path):
    from gpuadvise.analyzer.read.loader import load_trace
    from gpuadvise.analyzer.measure.basics.metrics import compute

    model = load_trace(trace)
    return model, compute(model).steps


# -- 1. fidelity --------------------------------------------------------------------------------------
SCRIPT_ARGS = ["a", "-b", "--c=1", "-o", "not-ours", "-q", "--force", "--", "-m", "x"]  # all the script's


@pytest.mark.parametrize("case", ["same-folder", "relative-from-elsewhere", "double-dash"])
def test_script_sees_what_python_would_show_it(tmp_path, case):
    copy_probe("probe.py", tmp_path / "scripts")
    if case == "relative-from-elsewhere":
        cwd, script = tmp_path / "elsewhere", "../scripts/probe.py"
        cwd.mkdir()
    else:
        cwd, script = tmp_path / "scripts", "probe.py"
    ours = ["-q", "-o", str(tmp_path / "run")] + (["--"] if case == "double-dash" else [])
    stdin = b"first line\nsecond line\n"

    plain = native([script, *SCRIPT_ARGS], cwd, stdin)
    wrapped = profile([*ours, script, *SCRIPT_ARGS], cwd, stdin)

    assert plain.returncode == 0, show(plain)
    assert wrapped.returncode == 0, show(wrapped)
    expected = json.loads(plain.stdout)
    assert expected["stdin"] == stdin.decode()  # the probe itself works
    assert json.loads(wrapped.stdout) == expected
    assert wrapped.stdout == plain.stdout  # nothing of ours on stdout
    assert (tmp_path / "run" / "run.json").is_file()
    assert not (cwd / "not-ours").exists()  # the script's -o was not taken as ours


def test_module_sees_what_python_m_would_show_it(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(PROBES / "probe.py", pkg / "mod.py")
    args = ["x", "-q", "--c=1"]
    stdin = b"to the module\n"

    plain = native(["-m", "pkg.mod", *args], tmp_path, stdin)
    wrapped = profile(["-q", "-o", str(tmp_path / "run"), "-m", "pkg.mod", *args], tmp_path, stdin)

    assert plain.returncode == 0, show(plain)
    assert wrapped.returncode == 0, show(wrapped)
    expected = json.loads(plain.stdout)
    assert expected["argv"][0] == str(pkg / "mod.py")
    assert json.loads(wrapped.stdout) == expected
    assert run_json(tmp_path / "run")["script"] == "-m pkg.mod"


def test_stdin_reaches_the_script(tmp_path):
    copy_probe("read_stdin.py", tmp_path)
    proc = profile(["-q", "-o", "run", "read_stdin.py"], tmp_path, input=b"hello\n")
    assert proc.returncode == 0, show(proc)
    assert proc.stdout == "hello\n"


# -- 2. exit codes ------------------------------------------------------------------------------------
# (mode, training steps before it, expected status or None for "whatever python itself gives")
EXITS = {
    "ok": ("ok", 0, 0),
    "sys.exit(3)": ("exit3", 0, 3),
    "uncaught exception after the capture": ("raise", 4, 1),
    "SIGINT to itself": ("sigint", 0, None),
    "raise KeyboardInterrupt": ("kbint", 0, None),
    "os._exit(7) after the capture": ("os_exit", 4, 7),
}


@pytest.mark.parametrize("name", list(EXITS))
def test_exit_status_is_the_scripts(tmp_path, name):
    mode, steps, expected = EXITS[name]
    copy_probe("exits.py", tmp_path)
    args = ["exits.py", mode, str(steps)]
    if expected is None:
        plain = native(args, tmp_path)
        expected = plain.returncode
        assert expected != 0, show(plain)

    proc = profile(["-q", "-o", "run", *WINDOW, *args], tmp_path)

    assert proc.returncode == expected, show(proc)
    assert f"before {mode}" in proc.stdout
    assert "after" not in proc.stdout or mode == "ok"
    run = run_json(tmp_path / "run")
    assert run["exit_code"] == expected
    if expected < 0:
        assert run["exit_signal"] == "SIGINT"
    if mode == "raise":  # the script's own traceback, as python prints it
        assert "Traceback (most recent call last)" in proc.stderr
        assert "ValueError: probe-failure-marker 42" in proc.stderr
        assert "exits.py" in proc.stderr
    if mode in ("sigint", "kbint"):
        assert "KeyboardInterrupt" in proc.stderr
    if steps:  # the trace is written when the window completes: a later crash or _exit keeps it
        assert (tmp_path / "run" / "trace.pt.trace.json.gz").is_file()
        assert run["capture"]["state"] == "captured"


def _interrupt(cmd: list[str], cwd: Path, how: str) -> tuple[int, str, str]:
    """Start `cmd`, signal it once its script prints "before wait" (_cli_support.signal_when_ready)."""
    return signal_when_ready(cmd, cwd, how, _env(), TIMEOUT)


@pytest.mark.parametrize("how, signum", [("ctrl-c", signal.SIGINT), ("sigterm", signal.SIGTERM)])
def test_signal_from_outside_ends_it_as_it_would_end_the_script(tmp_path, how, signum):
    copy_probe("exits.py", tmp_path)
    native_rc, _, _ = _interrupt([sys.executable, "exits.py", "wait", "0"], tmp_path, how)
    assert native_rc == -signum  # python dies of the signal (KeyboardInterrupt is re-raised as SIGINT)

    # four optimizer steps first: the window (3 steps) is captured before the signal arrives
    rc, out, err = _interrupt([sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", "run", *WINDOW,
                               "exits.py", "wait", "4"], tmp_path, how)
    assert rc == native_rc, f"rc={rc}\n{out}\n{err}"
    assert "after" not in out
    run = run_json(tmp_path / "run")
    assert run["exit_code"] == -signum
    assert run["exit_signal"] == signal.Signals(signum).name
    assert run["capture"]["state"] == "captured"
    assert (tmp_path / "run" / "trace.pt.trace.json.gz").is_file()


# -- 3. the end-to-end check --------------------------------------------------------------------
@pytest.fixture(scope="module")
def stall_run(tmp_path_factory):
    """`gpuadvise profile -o RUN examples/train_stall.py --steps 20`, default window, with the summary."""
    cwd = tmp_path_factory.mktemp("stall")
    script = EXAMPLES / "train_stall.py"
    proc = profile(["-o", str(cwd / "RUN"), str(script), "--steps", "20"], cwd)
    return cwd, cwd / "RUN", script, proc


def test_train_stall_example_finds_the_dataloader_stall_at_its_line(stall_run):
    cwd, run_dir, script, proc = stall_run
    assert proc.returncode == 0, show(proc)
    assert "done: 20 steps" in proc.stdout
    assert (run_dir / "trace.pt.trace.json.gz").is_file()
    # the summary: our lines on stderr, prefixed, naming the finding and the follow-up command
    ours = [l for l in proc.stderr.splitlines() if l.startswith(PREFIX)]
    assert any("dataloader-stall" in l for l in ours), proc.stderr
    assert any("gpuadvise analyze" in l for l in ours), proc.stderr
    assert PREFIX not in proc.stdout

    line = call_line(script, "DataLoader")
    stalls = [f for f in findings(analyze_json(run_dir, cwd)) if f["topic"] == "dataloader-stall"]
    assert len(stalls) == 1, stalls
    sources = stalls[0]["evidence"]["sources"]
    assert any(same_file(s, cwd, script, line) for s in sources), (sources, f"train_stall.py:{line}")


@pytest.fixture(scope="module")
def stall_reports(stall_run):
    """The stall run's folder, analysed once for the tests below."""
    from gpuadvise.analyzer.run.engine import analyze_paths

    cwd, run_dir, script, proc = stall_run
    assert proc.returncode == 0, show(proc)
    return analyze_paths([str(run_dir)], jobs=1)


def test_the_stall_runs_trace_alone_agrees_with_its_run_folder(stall_run, stall_reports):
    """The run folder and its trace without run.json (as another tool's trace would come): the same
    topics, savings within 5 points, but for those docs/rule-api.md lists as needing run.json."""
    from _trace_alone import disagreements
    from gpuadvise.analyzer.model.report import all_findings
    from gpuadvise.analyzer.run.engine import analyze_paths

    cwd, run_dir, script, proc = stall_run
    recorded = all_findings(stall_reports)
    alone = all_findings(analyze_paths([str(run_dir / "trace.pt.trace.json.gz")], jobs=1))
    assert "dataloader-stall" in {f.topic for f in alone}
    found = disagreements(recorded, alone, "train_stall.py")
    assert not found, "\n".join(found)


def test_the_stall_runs_reports_state_each_figure_once(stall_run, stall_reports):
    """One figure, one computation on a real CPU run: its text, markdown and JSON reports and the TUI's
    tables (tests/_figures_support.py), and the summary `profile` printed."""
    from _figures_support import problems, wording

    found = problems(stall_reports) + wording(stall_run[3].stderr, "profile's summary")
    assert not found, "\n".join(found)


def test_train_healthy_example_has_no_dataloader_stall(tmp_path):
    proc = profile(["-q", "-o", "RUN", str(EXAMPLES / "train_healthy.py"), "--steps", "20"], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done: 20 steps" in proc.stdout
    assert (tmp_path / "RUN" / "trace.pt.trace.json.gz").is_file()
    topics = [f["topic"] for f in findings(analyze_json(tmp_path / "RUN", tmp_path))]
    assert "dataloader-stall" not in topics


# -- 7. run.json facts ----------------------------------------------------------------------------------
def test_run_json_records_the_facts(stall_run):
    cwd, run_dir, script, proc = stall_run
    assert proc.returncode == 0, show(proc)
    run = run_json(run_dir)

    assert run["command"] == ["gpuadvise", "profile", "-o", str(run_dir), str(script), "--steps", "20"]
    assert run["argv"] == [str(script), "--steps", "20"]
    assert run["cwd"] == str(cwd)
    assert run["exit_code"] == 0
    fmt = "%Y-%m-%dT%H:%M:%S%z"
    started, ended = datetime.strptime(run["started_at"], fmt), datetime.strptime(run["ended_at"], fmt)
    assert started <= ended
    assert run["duration_s"] > 0

    assert run["environment"]["torch"] == torch.__version__
    assert run["environment"]["cuda_available"] == torch.cuda.is_available()
    assert "cudnn_benchmark" in run["settings"]

    capture = run["capture"]
    assert capture["state"] == "captured"
    assert capture["step_source"] == "optimizer.step()"
    assert capture["files"]["trace"] == "trace.pt.trace.json.gz"
    assert capture["window"] == {"wait": 10, "warmup": 2, "active": 3}
    assert run["steps"]["source"] == "optimizer"

    (loader,) = run["dataloaders"]
    assert same_file(loader["created_at"], cwd, script, call_line(script, "DataLoader")), loader
    assert loader["num_workers"] == 0
    assert loader["batch_size"] == 32
    assert loader["pin_memory"] is False
    assert loader["persistent_workers"] is False
    (opt,) = run["optimizers"]
    assert opt["class"] == "SGD"
    assert opt["params"] == 4


@pytest.mark.parametrize("folder", ["gpuadvise", "torch"])
def test_created_at_points_at_user_code_in_any_folder(tmp_path, folder):
    """A project folder that happens to be called `gpuadvise` (a clone of this repository) or `torch`
    is still the user's code: created_at must name the script's line, not '?'."""
    script = copy_probe("make_loader.py", tmp_path / "src" / folder)
    rel = f"src/{folder}/make_loader.py"
    proc = profile(["-q", "-o", "run", rel], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "made" in proc.stdout
    (loader,) = run_json(tmp_path / "run")["dataloaders"]
    assert same_file(loader["created_at"], tmp_path, script, call_line(script, "DataLoader")), loader


# -- 4. stepping without an optimizer -----------------------------------------------------------------
def test_inference_loop_is_stepped_by_dataloader_batches(tmp_path):
    model, steps, capture = _two_steps_captured("infer.py", tmp_path)
    names = set(model.cpu["name"].astype(str))
    assert {f"ProfilerStep#{s.number}" for s in steps} <= names
    assert "DataLoader" in capture["step_source"]


def _two_steps_captured(probe: str, tmp_path: Path):
    """Profile probe script `probe` (it prints "done"): its window's trace holds two steps and run.json
    says it was captured. Returns the trace's model, its steps and run.json's capture record."""
    copy_probe(probe, tmp_path)
    proc = profile(["-q", "-o", "run", *WINDOW, probe], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done" in proc.stdout
    trace = tmp_path / "run" / "trace.pt.trace.json.gz"
    assert trace.is_file(), show(proc)
    model, steps = load_steps(trace)
    assert len(steps) == 2
    capture = run_json(tmp_path / "run")["capture"]
    assert capture["state"] == "captured"
    return model, steps, capture


def test_manual_gpuadvise_step(tmp_path):
    import gpuadvise

    assert callable(getattr(gpuadvise, "step", None)), "gpuadvise.step() is missing"
    # outside `gpuadvise profile` it does nothing
    plain = native(["-c", "import gpuadvise; gpuadvise.step(); gpuadvise.step(); print('ok')"], tmp_path)
    assert plain.returncode == 0 and plain.stdout == "ok\n", show(plain)

    _, _, capture = _two_steps_captured("manual_step.py", tmp_path)
    assert capture["step_source"] == "gpuadvise.step()"


# -- 5. a failing profiler never stops the script ---------------------------------------------------------
@pytest.mark.parametrize("what, state", [("step", "failed: profiler step failed"),
                                         ("export", "failed: writing the trace failed")])
def test_profiler_failure_does_not_stop_the_script(tmp_path, what, state):
    copy_probe("break_profiler.py", tmp_path)
    proc = profile(["-q", "-o", "run", *WINDOW, "break_profiler.py", what], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert proc.stdout.splitlines()[-1:] == ["done"], show(proc)
    assert f"{PREFIX}profiling stopped" in proc.stderr
    run = run_json(tmp_path / "run")
    assert run["exit_code"] == 0
    assert run["capture"]["state"].startswith("failed")
    assert run["capture"]["state"] == state
    assert "probe: profiler broken on purpose" in run["capture"]["error"]
    # no trace, and no half-written leftovers (profiler.log holds the profiler's own log lines, if any); the
    # whole run's step times are kept whatever happened to the profiler
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name != "profiler.log") == ["run.json", "steps.jsonl"]


# -- 6. window and run folder ---------------------------------------------------------------------------
def test_stop_after_capture_ends_the_script(tmp_path):
    copy_probe("train_loop.py", tmp_path)
    proc = profile(["-q", "-o", "run", *WINDOW, "--stop-after-capture", "train_loop.py", "50"], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done" not in proc.stdout
    assert len([l for l in proc.stdout.splitlines() if l.startswith("step ")]) <= 3, proc.stdout
    assert "--stop-after-capture" in proc.stderr
    assert (tmp_path / "run" / "trace.pt.trace.json.gz").is_file()
    run = run_json(tmp_path / "run")
    assert run["exit_code"] == 0
    assert run["capture"]["state"] == "captured"


@pytest.mark.parametrize("window, batches", [
    (["--wait", "0", "--warmup", "5", "--active", "2"], 1),  # ends during the warm-up
    (WINDOW, 1),  # ends inside the recorded steps: 2 of the 3 profiler steps taken
], ids=["ends-in-warmup", "ends-in-recorded-steps"])
def test_script_ending_before_the_window_leaves_no_trace_and_says_why(tmp_path, window, batches):
    copy_probe("train_loop.py", tmp_path)
    # one batch + one optimizer step = 2 profiler steps, fewer than either window needs. No -o: the
    # default folder.
    proc = profile([*window, "train_loop.py", str(batches)], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done" in proc.stdout
    (run_dir,) = (tmp_path / "gpuadvise-runs").iterdir()
    assert run_dir.name.startswith("train_loop-")
    run = run_json(run_dir)
    assert run["capture"]["state"].startswith("incomplete"), run["capture"]
    assert not (run_dir / "trace.pt.trace.json.gz").exists()
    assert run["exit_code"] == 0
    ours = "\n".join(l for l in proc.stderr.splitlines() if l.startswith(PREFIX))
    assert "no trace captured" in ours and "the window needs" in ours, proc.stderr
    assert "--active" in ours or "gpuadvise.step()" in ours, proc.stderr  # what to do about it


def _old_capture(run_dir: Path) -> dict[str, bytes]:
    run_dir.mkdir()
    old = {"trace.json.gz": gzip.compress(b'{"traceEvents": []}'), "run.json": b'{"old": true}',
           "memory.pickle": b"old snapshot", "notes.txt": b"mine"}
    for name, data in old.items():
        (run_dir / name).write_bytes(data)
    return old


def test_existing_run_folder_is_kept_without_force(tmp_path):
    copy_probe("train_loop.py", tmp_path)
    old = _old_capture(tmp_path / "run")
    proc = profile(["-o", "run", *WINDOW, "train_loop.py", "4"], tmp_path)
    assert proc.returncode == 2, show(proc)
    assert "--force" in proc.stderr
    assert proc.stdout == ""  # the script did not run
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == old


def test_force_replaces_the_capture(tmp_path):
    copy_probe("train_loop.py", tmp_path)
    old = _old_capture(tmp_path / "run")
    proc = profile(["-q", "--force", "-o", "run", *WINDOW, "train_loop.py", "4"], tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "done" in proc.stdout
    run_dir = tmp_path / "run"
    assert (run_dir / "trace.pt.trace.json.gz").read_bytes() != old["trace.json.gz"]
    assert not (run_dir / "trace.json.gz").exists()  # the old name of the trace is replaced too
    _, steps = load_steps(run_dir / "trace.pt.trace.json.gz")
    assert len(steps) == 2
    run = run_json(run_dir)
    assert "old" not in run
    assert run["capture"]["state"] == "captured"
    assert not (run_dir / "memory.pickle").exists()  # a stale snapshot from the old capture is gone
    assert (run_dir / "notes.txt").read_bytes() == b"mine"  # not ours: left alone

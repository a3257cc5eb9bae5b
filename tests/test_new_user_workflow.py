"""A new user's first hour, as they see it (exit codes, stderr lines, file names and modes), and the
torch.profiler workflow they already have: tensorboard_trace_handler log folders, repeated captures,
and the findings on the trace's own timeline (`--perfetto`).

Profile runs start a child Python with torch (seconds each): they are kept to one per behaviour.
"""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from _cli_support import call_main, write_rule_positive

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PREFIX = "gpuadvise> "
SHORT_WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2"]


def _env() -> dict:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPUADVISE_DEBUG"):
        env.pop(var, None)
    return env


def gpuadvise(args: list, cwd: Path, umask: int | None = None) -> subprocess.CompletedProcess:
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-m", "gpuadvise", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=_env(), preexec_fn=pre)


def script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(body)
    return p


LOOP = """
import sys, torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def stall_trace(tmp_path_factory) -> Path:
    return write_rule_positive("dataloader-stall", tmp_path_factory.mktemp("stall") / "stall.json.gz")


# -- files and formats ---------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027])
@pytest.mark.slow
def test_reports_written_with_o_follow_the_umask(tmp_path, stall_trace, umask):
    for name in ("report.md", "report.html", "report.json"):
        proc = gpuadvise(["analyze", stall_trace, "-o", tmp_path / name], tmp_path, umask=umask)
        assert proc.returncode == 0, proc.stderr
    svgs = sorted(tmp_path.glob("report-*.svg"))
    assert svgs, "the markdown report's charts"
    for p in [tmp_path / "report.md", tmp_path / "report.html", tmp_path / "report.json", *svgs]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask, p


def test_model_cache_follows_the_umask(tmp_path, stall_trace, monkeypatch):
    from gpuadvise.analyzer.read import cache
    from gpuadvise.analyzer.read.loader import load_trace

    trace = tmp_path / "t.json.gz"
    trace.write_bytes(stall_trace.read_bytes())
    monkeypatch.setattr(cache, "MIN_BYTES", 0)  # the cache is kept for big traces only
    old = os.umask(0o027)
    try:
        saved = cache.save(trace, load_trace(trace, cache=False))
    finally:
        os.umask(old)
    assert saved is not None and saved.is_file()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o640  # not mkstemp's 0600


@pytest.mark.slow
def test_bare_command_and_analyse_spelling(tmp_path, stall_trace):
    bare = gpuadvise([], tmp_path)
    assert bare.returncode == 2 and bare.stderr.startswith("usage: gpuadvise")
    british = gpuadvise(["analyse", stall_trace, "--format", "json"], tmp_path)
    assert british.returncode == 0, british.stderr
    assert json.loads(british.stdout)["findings"]


# -- --perfetto ---------------------------------------------------------------------------------------
def _events(path: Path) -> list:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


@pytest.mark.slow
def test_perfetto_track_holds_one_slice_per_finding_over_its_evidence(tmp_path, stall_trace):
    out = tmp_path / "timeline.json"
    proc = gpuadvise(["analyze", stall_trace, "--perfetto", out, "--format", "json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    original = _events(stall_trace)
    written = _events(out)  # valid JSON in the Trace Event format: {"traceEvents": [...]}
    assert written[:len(original)] == original  # every original event, unchanged and in order
    ours = [e for e in written[len(original):]]
    assert all(e["pid"] not in {o.get("pid") for o in original} for e in ours)
    names = [e for e in ours if e["ph"] == "M" and e["name"] == "process_name"]
    assert [e["args"]["name"] for e in names] == ["gpuadvise"]
    slices = [e for e in ours if e["ph"] == "X"]
    assert len(slices) == len(report["findings"]) >= 1
    base = min(e["ts"] for e in original if "ts" in e and e.get("ph") != "M")
    for f, s in zip(report["findings"], slices):
        assert s["name"] == f["title"] and s["args"]["rule"] == f["rule"]
        assert s["args"]["message"] == f["message"]
        assert s["args"]["advice"] == f["advice"] and s["args"]["fix"] == f["fix"]
        ranges = f["evidence"]["time_ranges_ms"]
        if ranges:  # the slice spans the finding's evidence, on the trace's own clock
            assert s["ts"] == pytest.approx(base + min(a for a, _ in ranges) * 1e3, abs=1)
            assert s["ts"] + s["dur"] == pytest.approx(base + max(b for _, b in ranges) * 1e3, abs=1)
    assert any(f["evidence"]["time_ranges_ms"] for f in report["findings"])


@pytest.mark.slow
def test_perfetto_file_loads_back_with_the_same_analysis(tmp_path, stall_trace):
    out = tmp_path / "timeline.json"
    assert gpuadvise(["analyze", stall_trace, "--perfetto", out], tmp_path).returncode == 0
    before = gpuadvise(["analyze", stall_trace, "--format", "json"], tmp_path)
    after = gpuadvise(["analyze", out, "--format", "json"], tmp_path)
    assert after.returncode == 0, after.stderr
    strip = lambda doc: [(f["rule"], f["message"]) for f in json.loads(doc)["findings"]]  # noqa: E731
    assert strip(after.stdout) == strip(before.stdout)  # the gpuadvise track is not analysed as work
    from gpuadvise.analyzer.read.loader import load_trace

    a, b = load_trace(stall_trace, cache=False), load_trace(out, cache=False)
    for table in ("gpu", "runtime", "cpu", "syncs"):
        assert len(getattr(a, table)) == len(getattr(b, table)), table
    assert not b.meta.unknown_categories


@pytest.mark.slow
def test_perfetto_refuses_several_traces_in_one_line(tmp_path, stall_trace):
    other = tmp_path / "rank1.json.gz"
    other.write_bytes(stall_trace.read_bytes())
    proc = gpuadvise(["analyze", stall_trace, other, "--perfetto", tmp_path / "t.json"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--perfetto writes one trace" in proc.stderr
    assert not (tmp_path / "t.json").exists()


# -- the torch.profiler workflow ------------------------------------------------------------------------
HANDLER = """
import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
             on_trace_ready=tensorboard_trace_handler("log/run1", worker_name="worker0")) as prof:
    for _ in range(10):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        prof.step()
"""


@pytest.fixture(scope="module")
def handler_log(tmp_path_factory) -> Path:
    """Real tensorboard_trace_handler output, made on the CPU: log/run1/worker0.<time>.pt.trace.json ×2."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("tb")
    script(d, "tb.py", HANDLER)
    proc = subprocess.run([sys.executable, "tb.py"], cwd=d, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr
    return d / "log"


@pytest.mark.slow
def test_analyze_a_tensorboard_log_folder_finds_repeated_captures(tmp_path, handler_log):
    files = sorted((handler_log / "run1").glob("worker0.*.pt.trace.json*"))
    assert len(files) == 2
    proc = gpuadvise(["analyze", handler_log, "--format", "json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert sorted(Path(t["trace"]).name for t in doc["traces"]) == [f.name for f in files]
    assert doc.get("job") in (None, {})  # captures of one process are not ranks of a job
    notes = "\n".join(n for t in doc["traces"] for n in t.get("notes", []))
    assert "2 captures of one worker 'worker0'" in notes
    assert "capture 1 → 2: median step" in notes
    text = gpuadvise(["analyze", handler_log], tmp_path)
    assert "[rank" not in text.stdout and "rank 0" not in text.stdout


# -- gpuadvise profile ----------------------------------------------------------------------------------
torch_needed = pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="needs torch")


@torch_needed
@pytest.mark.slow
def test_profile_names_the_trace_for_tensorboard_and_writes_report_and_timeline(tmp_path):
    script(tmp_path, "train.py", LOOP)
    proc = gpuadvise(["profile", "-o", "run", "--report", "report.html", "--perfetto", "timeline.json",
                      *SHORT_WINDOW, "train.py", "4"], tmp_path, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "trace.pt.trace.json.gz").is_file()
    assert not (tmp_path / "run" / "trace.json.gz").exists()
    html = (tmp_path / "report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644
    assert any(e.get("cat") == "gpuadvise" for e in _events(tmp_path / "timeline.json"))
    ours = [line for line in proc.stderr.splitlines() if line.startswith(PREFIX)]
    assert any("report.html" in line for line in ours) and any("timeline.json" in line for line in ours)
    assert "gpuGetDeviceCount" not in proc.stderr and "USDT:" not in proc.stderr


@torch_needed
@pytest.mark.slow
def test_profile_refuses_an_unknown_report_extension_before_running(tmp_path):
    script(tmp_path, "train.py", LOOP)
    proc = gpuadvise(["profile", "-o", "run", "--report", "report.pdf", "train.py", "1"], tmp_path)
    assert proc.returncode == 2
    assert "report.pdf" in proc.stderr and ".md" in proc.stderr and proc.stderr.count("\n") == 1
    assert "done" not in proc.stdout and not (tmp_path / "run").exists()


@torch_needed
@pytest.mark.slow
def test_script_failing_before_its_first_step(tmp_path):
    script(tmp_path, "train.py", "import torch\n\ndef setup():\n    raise ValueError('bad config')\n\nsetup()\n")
    proc = gpuadvise(["profile", "-o", "run", "train.py"], tmp_path)
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, env=_env())
    assert proc.returncode == plain.returncode == 1
    # the traceback python itself prints: no frame of gpuadvise's bootstrap
    theirs = plain.stderr.strip().splitlines()
    ours = [line for line in proc.stderr.strip().splitlines() if not line.startswith(PREFIX)]
    assert ours == theirs
    assert f"{PREFIX}no trace captured: the script failed before its first step (exit code 1)" in proc.stderr
    assert "gpuadvise.step()" not in proc.stderr
    again = gpuadvise(["analyze", "run"], tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip() == "gpuadvise: error: run: run folder has no trace: the script failed before its first step (exit code 1)"


@torch_needed
@pytest.mark.slow
def test_traceback_through_the_patched_backward_has_no_gpuadvise_frames(tmp_path):
    script(tmp_path, "train.py", "import torch\nm = torch.nn.Linear(2, 2)\ny = m(torch.randn(1, 2)).sum()\n"
                                 "y.backward()\ny.backward()\n")
    proc = gpuadvise(["profile", "-q", "-o", "run", "train.py"], tmp_path)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "RuntimeError" in proc.stderr
    assert "gpuadvise" not in proc.stderr.replace("train.py", "")  # neither bootstrap nor the hook


@torch_needed
@pytest.mark.slow
def test_missing_module_leaves_no_run_folder(tmp_path):
    proc = gpuadvise(["profile", "-m", "no_such_module_here"], tmp_path)
    plain = subprocess.run([sys.executable, "-m", "no_such_module_here"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == plain.returncode == 1
    assert "No module named no_such_module_here" in proc.stderr
    assert not (tmp_path / "gpuadvise-runs").exists()
    assert "no training step" not in proc.stderr


@torch_needed
@pytest.mark.slow
def test_too_few_steps_says_how_many_the_window_needs(tmp_path):
    script(tmp_path, "train.py", LOOP)
    proc = gpuadvise(["profile", "-o", "run", "train.py", "5"], tmp_path)
    assert proc.returncode == 0  # the script's own code
    assert (f"{PREFIX}no trace captured: the script ran 5 steps and the window needs 15 "
            "(wait 10 + warm-up 2 + record 3): lower --wait/--warmup/--active") in proc.stderr
    assert "run folder has no trace: the script ran 5 steps" in gpuadvise(["analyze", "run"], tmp_path).stderr


@torch_needed
@pytest.mark.slow
def test_interrupted_run_says_at_which_step(tmp_path):
    script(tmp_path, "train.py", LOOP.replace("    opt.zero_grad()\n", "    opt.zero_grad()\n    if i == 3:\n"
                                              "        raise KeyboardInterrupt\n"))
    proc = gpuadvise(["profile", "-o", "run", "train.py", "30"], tmp_path)
    assert proc.returncode == -2  # died by SIGINT, as python train.py does
    assert f"{PREFIX}no trace captured: interrupted at step 4; the window needs 15" in proc.stderr
    assert "KeyboardInterrupt" in proc.stderr and "bootstrap" not in proc.stderr


@torch_needed
@pytest.mark.slow
def test_with_stack_prints_no_trace_only_warning(tmp_path):
    script(tmp_path, "train.py", LOOP)
    proc = gpuadvise(["profile", "-o", "run", "--with-stack", *SHORT_WINDOW, "train.py", "4"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "trace_only" not in proc.stderr
    assert (tmp_path / "run" / "trace.pt.trace.json.gz").is_file()


def test_profiler_log_lines_go_to_the_run_folder_log(tmp_path, capfd):
    from gpuadvise.harness.windows import quiet

    log = tmp_path / "profiler.log"
    noise = b"ERROR:2026-01-01 10:00:00 123:456 DeviceProperties.cpp:47] gpuGetDeviceCount failed with code 35\n"
    quiet.set_log(log, errors_to_stderr=False)  # no usable GPU: kineto's failed GPU enumeration is expected
    try:
        with quiet.quiet_fd2():
            os.write(2, noise + b"the user's own line\n")
    finally:
        quiet.set_log(None)
    assert capfd.readouterr().err == "the user's own line\n"
    assert "gpuGetDeviceCount failed with code 35" in log.read_text()
    quiet.set_log(log, errors_to_stderr=True)  # with a GPU, a profiler error matters: it stays on stderr too
    try:
        with quiet.quiet_fd2():
            os.write(2, noise)
    finally:
        quiet.set_log(None)
    assert "gpuGetDeviceCount failed with code 35" in capfd.readouterr().err


def test_old_run_folders_with_trace_json_gz_still_analyse(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_rule_positive("dataloader-stall", run / "trace.json.gz")
    (run / "run.json").write_text("{}")
    rc, out, _ = call_main(capsys, "analyze", run, "--format", "json")
    assert rc == 0 and json.loads(out)["findings"]


# -- install hints ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_view_without_textual_names_the_install_that_fits_a_checkout(tmp_path, stall_trace):
    blocker = tmp_path / "blocked"
    (blocker / "textual").mkdir(parents=True)
    (blocker / "textual" / "__init__.py").write_text("raise ImportError('No module named textual')\n")
    env = {**_env(), "PYTHONPATH": str(blocker)}
    proc = subprocess.run([sys.executable, "-m", "gpuadvise", "view", str(stall_trace)], cwd=ROOT, text=True,
                          capture_output=True, env=env, timeout=120)
    assert proc.returncode == 2
    # from the checkout itself: the editable install with the extra, not a name that is not published
    assert proc.stderr.rstrip().endswith("pip install -e '.[tui]'"), proc.stderr
    elsewhere = subprocess.run([sys.executable, "-m", "gpuadvise", "view", str(stall_trace)], cwd=tmp_path,
                               text=True, capture_output=True, env=env, timeout=120)
    assert elsewhere.stderr.rstrip().endswith(f"pip install -e '{ROOT}[tui]'"), elsewhere.stderr


def test_installed_dist_hint_uses_the_dist_name(monkeypatch):
    from gpuadvise.analyzer import install

    monkeypatch.setattr(install, "_checkout", lambda: None)  # as from a wheel in site-packages
    assert install.install_command("dask") == "pip install 'gpuadvise[dask]'"


def test_timeline_written_into_a_run_folder_is_not_a_second_rank(tmp_path, capsys):
    from _cli_support import write_run_folder

    run = write_run_folder(tmp_path / "run")
    rc, _, _ = call_main(capsys, "analyze", run, "--perfetto", run / "timeline.json")
    assert rc == 0 and (run / "timeline.json").is_file()
    rc, out, _ = call_main(capsys, "analyze", run, "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and len(doc["traces"]) == 1 and not doc.get("job")
    assert any("timeline.json" in n and "--perfetto timeline" in n for t in doc["traces"] for n in t.get("notes", []))

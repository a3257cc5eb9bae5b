"""The capture's window callbacks (`WindowHooks`): where features that must run only while the window
records plug in. Checked end to end under `gpuadvise profile`, against the recorded trace itself."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # every test runs the real command

WAIT, WARMUP, ACTIVE = 3, 1, 2

SCRIPT = """
import sys
import torch
from gpuadvise.harness.active import active

def on_start(session, k):
    session.status.setdefault("test_hooks", []).append(["start", k])

def on_stop(session, k, captured):
    session.status.setdefault("test_hooks", []).append(["stop", k, captured])

def broken(session, k):
    raise RuntimeError("boom")

session = active()
session.hooks.on_start += [on_start, broken]
session.hooks.on_stop.append(on_stop)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def _profile(tmp_path: Path, steps: int) -> dict:
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    cmd = [sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", "RUN", "--wait", str(WAIT), "--warmup",
           str(WARMUP), "--active", str(ACTIVE), "train.py", str(steps)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / "RUN" / "run.json").read_text())["capture"]


def _recorded_steps(run: Path) -> list[int]:
    with gzip.open(next(run.glob("*.json.gz")), "rt") as fh:
        names = {e.get("name", "") for e in json.load(fh)["traceEvents"]}
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(r"ProfilerStep#(\d+)", n)))


def test_hooks_bracket_exactly_the_recorded_steps(tmp_path):
    capture = _profile(tmp_path, steps=12)
    assert capture["state"] == "captured"
    (start, k_start), (stop, k_stop, captured) = capture["test_hooks"]
    assert (start, stop, captured) == ("start", "stop", True)
    # the callbacks fire at the boundaries that open the first and close the last recorded step
    assert _recorded_steps(tmp_path / "RUN") == list(range(k_start, k_stop)) == list(range(WAIT + WARMUP, WAIT + WARMUP + ACTIVE))
    # a callback that raises is reported, not passed on to the script (which exited 0)
    assert len(capture["hook_errors"]) == 1 and "RuntimeError: boom" in capture["hook_errors"][0]


def test_script_ending_inside_the_window_closes_it_uncaptured(tmp_path):
    steps = WAIT + WARMUP + 1  # the window opens, the script ends before its last step
    capture = _profile(tmp_path, steps=steps)
    assert capture["state"].startswith("incomplete")
    assert capture["test_hooks"] == [["start", WAIT + WARMUP], ["stop", steps, False]]


def test_script_ending_before_the_window_fires_no_callback(tmp_path):
    capture = _profile(tmp_path, steps=WAIT)
    assert "test_hooks" not in capture and "hook_errors" not in capture

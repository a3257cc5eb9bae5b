"""`gpuadvise profile script.py` leaves the script's output as `python script.py` gives it, byte for byte.

One script (tests/probes/output_channels.py) writes on every channel a training script uses, and is run
once each way:
- warnings shown once per location: one raised in the loop each step, one torch raises as each epoch's
  DataLoader iterator starts (`pin_memory` without an accelerator), one raised in each epoch's worker
  process;
- logging (a `basicConfig` handler on stderr), a tqdm bar (redrawn on each batch, its line left open), a
  stderr write without a newline;
- stdout, block-buffered into a file, flushed at fixed steps: each step logs how many bytes stdout has put
  in its file so far, so a flush by anyone else (or a write of ours to stdout) changes stderr;
- the exit status (`sys.exit(3)`).

gpuadvise's own lines on stderr begin with "gpuadvise> " and run to the end of their line: the parent
prints them before and after the script, the script's process one when the window is captured, which
lands inside the tqdm bar's open line there. Those stretches are all that is taken out before comparing.
The profile run uses the default window (10 steps waited, 2 warmed up, 3 recorded), which lies inside the
script's 18 steps, so the comparison covers steps before, in and after the window.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tqdm")
pytestmark = pytest.mark.slow  # runs the script under python and under the real command

PROBE = Path(__file__).resolve().parent / "probes" / "output_channels.py"
OURS = re.compile(rb"gpuadvise> [^\n]*\n")  # one of our lines, wherever the script left its stderr line
TIMEOUT = 300


def _run(cmd: list[str], cwd: Path, name: str) -> tuple[int, bytes, bytes]:
    # PYTHONUNBUFFERED off: stdout block-buffered, as a user's shell gives it
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "PYTHONUNBUFFERED")}
    out = cwd / f"{name}.stdout"
    with open(out, "wb") as fh:  # a file, so the script can see how far its stdout has been flushed
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.PIPE, timeout=TIMEOUT, env=env)
    return proc.returncode, out.read_bytes(), proc.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("channels")
    shutil.copy(PROBE, cwd / "train.py")
    plain = _run([sys.executable, "train.py"], cwd, "python")
    profiled = _run([sys.executable, "-m", "gpuadvise", "profile", "-o", "run", "train.py"], cwd, "profile")
    assert (cwd / "run" / "trace.pt.trace.json.gz").is_file(), profiled[2].decode(errors="replace")  # it did profile
    return plain, profiled


WARNINGS = (rb"UserWarning: a warning in the training loop", rb"UserWarning: 'pin_memory'",
            rb"UserWarning: a warning from a DataLoader worker")


def _lines(stderr: bytes, pattern: bytes) -> list[bytes]:
    return [x for x in re.split(rb"[\r\n]", stderr) if re.search(pattern, x)]


def test_stdout_is_byte_for_byte_pythons(runs):
    (_, out, _), (_, wrapped, _) = runs
    assert out.count(b"\n") == 20  # the probe wrote what it should
    assert wrapped == out


def test_stderr_is_byte_for_byte_pythons_less_our_own_lines(runs):
    (_, _, err), (_, _, wrapped) = runs
    ours = OURS.findall(wrapped)
    assert any(b"captured 3 steps" in x for x in ours)  # the window was recorded inside the run
    assert OURS.sub(b"", wrapped) == err


def test_warnings_show_once_per_location_as_under_python(runs):
    (_, _, err), (_, _, wrapped) = runs
    count = {what: len(_lines(err, what)) for what in WARNINGS}
    assert count == {WARNINGS[0]: 1, WARNINGS[1]: 1, WARNINGS[2]: 3}  # python's own
    for what, n in count.items():
        assert len(_lines(wrapped, what)) == n, what


def test_logging_tqdm_and_stdout_flushes_are_pythons(runs):
    (_, _, err), (_, _, wrapped) = runs
    for channel in (rb"^INFO train: step \d+", rb"^epoch \d: \d/6", rb"stdout at \d+ bytes", rb"stderr without"):
        expected = _lines(err, channel)
        assert expected, channel
        assert _lines(OURS.sub(b"", wrapped), channel) == expected, channel


def test_exit_status_is_pythons(runs):
    (code, _, _), (wrapped, _, _) = runs
    assert code == 3
    assert wrapped == code

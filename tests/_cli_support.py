"""Helpers shared by test_cli.py, test_corpus.py, test_golden.py and the TUI tests (not a conftest: plain imports).

`run_cli` runs the real command (`python -m gpuadvise`, what the `gpuadvise` console script calls) in a
subprocess; `call_main` runs it in-process, which is much faster and enough where exit codes and
captured output are all a test looks at. The `write_*` functions (and `tui_trace`) build small
deterministic traces.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import find_rule

REPO = Path(__file__).resolve().parents[1]

GEMM = "ampere_tf32_s1688gemm_64x64_nn"
SINGLE_LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

# What `gpuadvise profile` writes into a run folder about the DataLoader it saw.
DATALOADER_FACTS = {
    "dataloaders": [
        {"created_at": "train.py:41", "num_workers": 0, "pin_memory": False, "prefetch_factor": None,
         "persistent_workers": False}
    ]
}


# A pointer a user would follow into code they cannot change: an installed package, torch, the stdlib.
LIBRARY_POINTER = re.compile(r"site-packages|dist-packages|(?:^|[\s/(\"'`])torch/|/lib(?:64)?/python\d")
CODE_POINTER = re.compile(r"[\w./\\-]+\.py(?::\d+|\(\d+\))")  # file:line or file(line) in a sentence


def library_pointers(finding: dict) -> list[str]:
    """The file:line pointers of a JSON finding (its sources, its items' sites, its message and advice)
    that lead into library code."""
    ev = finding["evidence"]
    pointers = list(ev["sources"])
    pointers += [str(i[k]) for i in ev["items"] for k in ("where", "source", "file") if i.get(k)]
    pointers += CODE_POINTER.findall(finding["message"] + "\n" + finding["advice"])
    return [p for p in pointers if LIBRARY_POINTER.search(p)]


# Files of the shared corpus that are JSON but not traces: run records and the H100 pairs' table.
NOT_TRACES = re.compile(r"^(run(\.rank\d+)?|pairs|labels)\.json$")


def is_corpus_trace(p: Path) -> bool:
    return p.is_file() and p.name.endswith((".json", ".json.gz")) and not NOT_TRACES.match(p.name)


def run_cli(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`gpuadvise ARGS...` as a user runs it; GPUADVISE_DEBUG is cleared so errors take the user path."""
    env = {k: v for k, v in os.environ.items() if k != "GPUADVISE_DEBUG"}
    return subprocess.run([sys.executable, "-m", "gpuadvise", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def call_main(capsys, *args: str) -> tuple[int, str, str]:
    """`gpuadvise ARGS...` in-process: (exit code, stdout, stderr)."""
    from gpuadvise.cli import main

    capsys.readouterr()  # drop anything captured before
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse: --version, usage errors
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return rc, out, err


def write_rule_positive(rule: str, path: Path) -> Path:
    """The rule's own positive fixture (the trace that must trigger it), written to `path`."""
    r = find_rule(rule)
    assert r is not None, f"no rule {rule!r}"
    return r.positive().write(path)


def rank_trace(rank: int, stall_us: float = 0.0) -> TraceBuilder:
    """One rank of a data-parallel job: python overhead, 10 GEMMs and a sync per step; `stall_us` of
    single-process DataLoader time at the start of each step makes this rank the straggler."""
    b = TraceBuilder(rank=rank)
    for _ in range(4):
        with b.step():
            if stall_us:
                b.cpu(SINGLE_LOADER, stall_us)
            b.idle(1_000)
            for _ in range(10):
                b.kernel(GEMM, 400)
            b.sync()
    b.finish()
    return b


def write_rank_folder(folder: Path, names=("trace_a.json", "trace_b.json"), stall_us=(0.0, 0.0)) -> Path:
    """A folder of two per-rank traces; the rank comes from each trace's distributedInfo (the names say nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, (name, stall) in enumerate(zip(names, stall_us)):
        rank_trace(rank, stall).write(folder / name)
    return folder


def write_run_folder(folder: Path) -> Path:
    """A `gpuadvise profile` run folder: run.json with the DataLoader's settings, and a trace that stalls on it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(DATALOADER_FACTS))
    write_rule_positive("dataloader-stall", folder / "trace.json.gz")
    return folder


def tui_trace() -> TraceBuilder:
    """The trace the TUI's snapshots show: a DataLoader stall, pageable copies, a host sync and memory
    events. Its GPU is busy 61.552 % of its active span, which the summary holds as 61.55: a share whose
    printed digit depends on which value is rounded, so every output must print the summary's."""
    b = TraceBuilder()
    allocated = 2 << 30
    for step in range(3):
        with b.step():
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 6_000 + 500 * step)
            with b.op("aten::to"):
                b.copy("HtoD", "Pageable", "Device", nbytes=64 << 20, dur=2_500)
            for k in range(6):
                allocated += 128 << 20
                b.memory(128 << 20, allocated, 4 << 30)
                with b.op("aten::linear"):
                    b.kernel("ampere_sgemm_128x64_tn", 700)
                    b.kernel("void at::native::vectorized_elementwise_kernel<4, [relu]>", 90)
            b.item()
            for k in range(6):
                allocated -= 128 << 20
                b.memory(-(128 << 20), allocated, 4 << 30)
    b.finish()
    return b


def signal_when_ready(cmd: list[str], cwd: Path, how: str, env: dict, timeout: float = 300) -> tuple[int, str, str]:
    """Start `cmd` in its own session; once its script prints "before wait" (inside a step), signal it the
    way a terminal (Ctrl-C, `how="ctrl-c"`: SIGINT to the whole foreground process group) or a job
    scheduler (SIGTERM to the process it started) would. Returns (exit code, stdout, stderr)."""
    import signal

    import pytest

    with open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                env=env, start_new_session=True)
        try:
            lines = []
            for raw in proc.stdout:
                lines.append(raw.decode())
                if raw.startswith(b"before wait"):
                    break
            else:
                proc.wait(timeout=timeout)
                pytest.fail(f"the script ended before it was signalled: rc={proc.returncode} "
                            f"{''.join(lines)} {(cwd / 'stderr.txt').read_text()}")
            if how == "ctrl-c":
                os.killpg(proc.pid, signal.SIGINT)
            else:
                os.kill(proc.pid, signal.SIGTERM)
            rest, _ = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode, "".join(lines) + rest.decode(), (cwd / "stderr.txt").read_text()


# What a person reads must not be Python: outside code (names from the trace, the Fix's examples), no
# repr of an empty list or table, no True/False/None, no snake_case key or unit suffix, no list, tuple or
# dict syntax.
PYTHON_REPRS = re.compile(r"\[\]|\{\}|\b(?:True|False|None)\b|_(?:pct|ms|us|gib|mib)\b|\b[a-z0-9]+(?:_[a-z0-9]+)+\b"
                          r"|\[[^\]\n]*,[^\]\n]*\]|\(\s*-?\d[\d.]*\s*,\s*-?\d[\d.]*\s*\)|\{\s*'|'\w+'\s*:")


def python_reprs(text: str) -> list[str]:
    """The Python reprs in `text` as a reader sees it: markdown escapes undone, code left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<(script|style|code|pre|svg)\b.*?</\1>", "", text, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text).replace("\\", "")
    text = re.sub(r"(`+).*?\1", "", text, flags=re.S)
    return [m.group(0) for m in PYTHON_REPRS.finditer(text)]


def evidence_parts(text: str) -> list[str]:
    """Each finding's evidence in a rendered report: from its Evidence heading up to its Impact."""
    return re.findall(r"Evidence(.*?)Impact", text, flags=re.S)

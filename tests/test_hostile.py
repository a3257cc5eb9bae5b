"""Hostile and broken inputs, and crashing training jobs.

A table of bad inputs, each row naming the exact message fragment and exit code a user gets, then one
test per class that needs more than a row:

- `BAD_INPUT`: `gpuadvise analyze` on broken paths, files, events, gzip streams, folders and run folders.
  Rows with exit 2 must give exactly one stderr line `gpuadvise: error: <path>: <problem>` and nothing on
  stdout; rows with exit 0 are salvaged, and their JSON report must carry the note that says so.
- output destinations (`-o`): unwritable, full, the input itself;
- bounded resources: gzip bombs, oversized files, endless devices, one huge string, mid-file damage;
- injection: names from a trace (and run.json) are escaped in markdown and stripped in terminal text;
- the training job: `gpuadvise profile` with the profiler failing at start, signals and `os._exit` in the
  middle of the window, forked DataLoader workers, `multiprocessing` spawn, a script reading stdin.

The table runs in-process (`main([...])` with capsys); a sample of it, and everything about resources,
runs the real command in a subprocess, where a traceback or a stray warning would show.
`tests/test_cli.py` and `tests/test_loader.py` hold the older, coarser checks of some of these classes.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from _cli_support import DATALOADER_FACTS, call_main, run_cli, signal_when_ready, write_rule_positive
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import find_rule

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what must never reach a terminal (\t and \n may)


# ---------------------------------------------------------------------------------------------------
# helpers


def stall_doc() -> dict:
    """dataloader-stall's positive fixture as a dict: 4 steps, 160 kernels, 336 events, 3 findings."""
    return find_rule("dataloader-stall").positive().to_dict()


STALL_EVENTS = len(stall_doc()["traceEvents"])
STALL_KERNELS = sum(e.get("cat") == "kernel" for e in stall_doc()["traceEvents"])


def kernels(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, dict | list):
        data = json.dumps(data)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def mutated(path: Path, change: Callable[[dict], object], **dumps) -> Path:
    """The stall fixture with `change(doc)` applied, written with json.dumps(**dumps)."""
    doc = stall_doc()
    change(doc)
    return write(path, json.dumps(doc, **dumps))


def spliced(path: Path, marker: bytes, insert: bytes) -> Path:
    """The stall fixture's bytes with `insert` placed right after the first `marker`."""
    raw = json.dumps(stall_doc()).encode()
    i = raw.index(marker) + len(marker)
    return write(path, raw[:i] + insert + raw[i:])


def one_error_line(err: str, *fragments: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected exactly one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("gpuadvise: error: "), line
    assert "internal error" not in line and "Traceback" not in line, line
    for frag in fragments:
        assert frag in line, f"{frag!r} not in the error line: {line}"
    return line


def analyze_json(capsys, *paths) -> tuple[int, dict | None, str]:
    rc, out, err = call_main(capsys, "analyze", *paths, "--format", "json")
    return rc, (json.loads(out) if rc == 0 else None), err


def notes_of(doc: dict) -> list[str]:
    return [n for t in doc["traces"] for n in t["notes"]]


# ---------------------------------------------------------------------------------------------------
# the table: PATH → (exit code, message fragment or salvage note)


@dataclass
class Case:
    make: Callable[[Path], Path]  # builds the input under tmp_path, returns the PATH argument
    rc: int  # expected exit code
    says: tuple[str, ...] = ()  # exit 2: fragments of the one error line; exit 0: fragments of one note
    names: str | None = None  # exit 2: the file inside PATH the error line must name (default: PATH)
    check: Callable[[dict], None] | None = None  # exit 0: more checks on the JSON report
    no_notes: tuple[str, ...] = ()  # exit 0: note fragments that must NOT appear (false claims)
    alt: Callable[[int, dict | None, str], bool] | None = field(default=None, repr=False)  # exit code 2 also fine if alt(...)


def _events_kept(at_least: int) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        (t,) = doc["traces"]
        assert t["events"] >= at_least, f"only {t['events']} events read, expected at least {at_least}: {t['notes']}"
    return check


def _findings_still_come_out(doc: dict) -> None:
    assert doc["findings"], "a salvaged trace must still produce its findings"
    assert "dataloader-stall" in {f["topic"] for f in doc["findings"]}


def _kernels(n: int) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        assert doc["traces"][0]["kernels"] == n, doc["traces"][0]
    return check


def _all(*checks) -> Callable[[dict], None]:
    def check(doc: dict) -> None:
        for c in checks:
            c(doc)
    return check


def _refused_naming(*words: str) -> Callable[[int, dict | None, str], bool]:
    """For rows where a clean refusal is as good as salvage: exit 2 with one line mentioning one of `words`."""
    def alt(rc, doc, err) -> bool:
        if rc != 2:
            return False
        line = one_error_line(err)
        return any(w.lower() in line.lower() for w in words)
    return alt


def _cut_json(d: Path) -> Path:
    raw = json.dumps(stall_doc()).encode()
    return write(d / "cut.json", raw[: int(len(raw) * 0.6)])


def _cut_gz(d: Path) -> Path:
    gz = gzip.compress(json.dumps(stall_doc()).encode())
    return write(d / "cut.json.gz", gz[: int(len(gz) * 0.6)])


def _mixed_folder(d: Path) -> Path:
    f = d / "mixed"
    write_rule_positive("dataloader-stall", write(f / "trace.json.gz", b""))
    write(f / "notes.txt", "not a trace")
    write(f / "loss.png", b"\x89PNG\r\n\x1a\n" + bytes(64))
    write_rule_positive("host-sync", write(f / "sub" / "nested.json", b""))  # sub-folders are not searched
    return f


def _mixed_with_other_json(d: Path) -> Path:
    f = d / "mixed_json"
    write_rule_positive("dataloader-stall", write(f / "trace.json", b""))
    write(f / "metrics.json", {"loss": [1.0, 0.5]})
    return f


def _run_folder(d: Path, run_json, name="run", trace=True) -> Path:
    f = d / name
    f.mkdir(parents=True)
    if run_json is not None:
        write(f / "run.json", run_json)
    if trace:
        write_rule_positive("dataloader-stall", f / "trace.json.gz")
    return f


def _no_cut_note(doc: dict) -> None:
    assert not any("cut off" in n for n in notes_of(doc)), notes_of(doc)


BAD_INPUT: dict[str, Case] = {
    # -- paths ---------------------------------------------------------------------------------------
    "missing-path": Case(lambda d: d / "nope.json", 2, ("nope.json: no such file or folder",)),
    # -- whole files that are not traces ---------------------------------------------------------------
    "empty-file": Case(lambda d: write(d / "empty.json", b""), 2, ("empty.json: empty file",)),
    "nul-bytes": Case(lambda d: write(d / "nul.json", bytes(100)), 2,
                      ("not a JSON trace (expected '{' or '[' at the start)",)),
    "utf16-json": Case(lambda d: write(d / "u16.json", json.dumps(stall_doc()).encode("utf-16")), 2,
                       ("not a JSON trace",)),
    "not-json": Case(lambda d: write(d / "notes.json", "hello, world\n"), 2,
                     ("notes.json: not a JSON trace (expected '{' or '[' at the start)",)),
    "broken-json-no-trace": Case(lambda d: write(d / "broken.json", '{"a": 1, "b": [1, 2'), 2,
                                 ("not valid JSON and no 'traceEvents' found",)),
    "json-not-a-trace": Case(lambda d: write(d / "config.json", {"lr": 0.1}), 2,
                             ("config.json: JSON has no 'traceEvents' list: not a PyTorch profiler trace",)),
    "json-scalar": Case(lambda d: write(d / "num.json", "42"), 2, ("not a JSON trace",)),
    "traceEvents-null": Case(lambda d: write(d / "null.json", {"traceEvents": None}), 2,
                             ("JSON has no 'traceEvents' list",)),
    "traceEvents-object": Case(lambda d: write(d / "obj.json", {"traceEvents": {"ph": "X"}}), 2,
                               ("'traceEvents' is not a list of events",)),
    "traceEvents-string": Case(lambda d: write(d / "str.json", {"traceEvents": "[]"}), 2,
                               ("'traceEvents' is not a list of events",)),
    "traceEvents-number": Case(lambda d: write(d / "n.json", {"traceEvents": 3}), 2,
                               ("'traceEvents' is not a list of events",)),
    "traceEvents-of-non-events": Case(lambda d: write(d / "junk.json", {"traceEvents": [1, "x", None, [2]]}), 2,
                                      ("none of its 4 events is a trace event: not a PyTorch profiler trace",)),
    "no-event-has-a-timestamp": Case(
        lambda d: write(d / "nots.json", {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}] * 3}), 2,
        ("none of its 3 events is a trace event",)),
    # -- single events: missing, ill-typed, NaN, negative fields (skipped and counted, never fatal) -----
    "event-without-ts": Case(lambda d: mutated(d / "nots1.json", lambda doc: kernels(doc)[0].pop("ts")), 0,
                             ("1 malformed events were skipped",), check=_kernels(STALL_KERNELS - 1)),
    "event-ts-garbage-string": Case(lambda d: mutated(d / "tsstr.json", lambda doc: kernels(doc)[0].update(ts="soon")), 0,
                                    ("1 malformed events were skipped",), check=_kernels(STALL_KERNELS - 1)),
    "event-ts-bool": Case(lambda d: mutated(d / "tsbool.json", lambda doc: kernels(doc)[0].update(ts=True)), 0,
                          ("1 malformed events were skipped",), check=_kernels(STALL_KERNELS - 1)),
    "event-negative-dur": Case(lambda d: mutated(d / "negdur.json", lambda doc: kernels(doc)[0].update(dur=-5.0)), 0,
                               ("1 malformed events were skipped",), check=_kernels(STALL_KERNELS - 1)),
    "event-negative-ts": Case(lambda d: mutated(d / "negts.json", lambda doc: kernels(doc)[0].update(ts=-1e6)), 0,
                              check=_kernels(STALL_KERNELS)),
    "event-name-number": Case(lambda d: mutated(d / "name42.json", lambda doc: kernels(doc)[0].update(name=42)), 0,
                              check=_kernels(STALL_KERNELS)),
    # json `null` where a name belongs: kept under an empty/placeholder name, or skipped and counted
    "event-name-null": Case(lambda d: mutated(d / "namenull.json", lambda doc: kernels(doc)[0].update(name=None)), 0,
                            check=_events_kept(STALL_EVENTS - 1)),
    "event-cat-list": Case(lambda d: mutated(d / "catlist.json", lambda doc: kernels(doc)[0].update(cat=["kernel"])), 0,
                           ("events of unknown categories were ignored",), check=_kernels(STALL_KERNELS - 1)),
    "event-pid-huge-int": Case(lambda d: mutated(d / "pidhuge.json", lambda doc: kernels(doc)[0].update(pid=10**30)), 0,
                               check=_kernels(STALL_KERNELS)),
    # 2**63..2**64-1 still fit the decoder's unsigned 64-bit integers, but not numpy's int64 columns (the
    # last event is a cudaDeviceSynchronize call: its pid/tid become table columns)
    "event-pid-2**63": Case(lambda d: mutated(d / "pid2_63.json", lambda doc: doc["traceEvents"][-1].update(pid=2**63)),
                            0, check=_events_kept(STALL_EVENTS - 1)),
    "event-tid-2**64-1": Case(lambda d: mutated(d / "tid2_64.json", lambda doc: doc["traceEvents"][-1].update(tid=2**64 - 1)),
                              0, check=_events_kept(STALL_EVENTS - 1)),
    "unknown-categories": Case(
        lambda d: mutated(d / "unknown.json", lambda doc: doc["traceEvents"].extend(
            [{"ph": "X", "cat": "my_vendor_thing", "name": "x", "pid": 1, "tid": 1, "ts": 1500.0 + i, "dur": 1.0}
             for i in range(3)])), 0,
        ("3 events of unknown categories were ignored: my_vendor_thing",), check=_all(_kernels(STALL_KERNELS),
                                                                                      _findings_still_come_out)),
    # Python's json.dumps writes NaN / Infinity / -Infinity tokens (not JSON). One such event must cost
    # that event at most, not the rest of the trace, and is not a "cut off" trace.
    "nan-token-in-ts": Case(lambda d: mutated(d / "nan.json", lambda doc: kernels(doc)[0].update(ts=float("nan"))), 0,
                            check=_events_kept(STALL_EVENTS - 1), no_notes=("cut off",),
                            alt=_refused_naming("NaN")),
    "infinity-token-in-dur": Case(lambda d: mutated(d / "inf.json", lambda doc: kernels(doc)[3].update(dur=float("inf"))), 0,
                                  check=_events_kept(STALL_EVENTS - 1), no_notes=("cut off",),
                                  alt=_refused_naming("Infinity")),
    "nan-token-in-args": Case(lambda d: mutated(d / "nanargs.json",
                                                lambda doc: kernels(doc)[0]["args"].update(correlation=float("nan"))), 0,
                              check=_events_kept(STALL_EVENTS - 1), no_notes=("cut off",), alt=_refused_naming("NaN")),
    "nan-token-in-header-after-events": Case(
        lambda d: mutated(d / "nanhdr.json", lambda doc: doc.update(baseTimeNanoseconds=float("nan"))), 0,
        check=_events_kept(STALL_EVENTS), no_notes=("cut off",), alt=_refused_naming("NaN")),
    # a lone UTF-16 surrogate escape (json.dumps writes one for a lone surrogate in a str)
    "lone-surrogate-escape-in-name": Case(
        lambda d: spliced(d / "surrogate.json", b'"cat": "kernel", "name": "', b"\\ud800"), 0,
        check=_events_kept(STALL_EVENTS - 1), no_notes=("cut off",), alt=_refused_naming("surrogate", "invalid")),
    # -- bytes that are not UTF-8 ------------------------------------------------------------------
    "non-utf8-bytes-in-kernel-name": Case(
        lambda d: spliced(d / "latin1.json", b'"cat": "kernel", "name": "', b"caf\xe9\xff\xfe_"), 0,
        check=_events_kept(STALL_EVENTS - 1), alt=_refused_naming("UTF-8")),
    "non-utf8-bytes-in-device-name": Case(
        lambda d: spliced(d / "latin1dev.json", b'"name": "NVIDIA A100', b"\xe9\xff"), 0,
        check=_kernels(STALL_KERNELS), alt=_refused_naming("UTF-8")),
    # -- nesting deeper than any decoder's recursion limit -------------------------------------------------
    "deeply-nested-event-args": Case(
        lambda d: spliced(d / "deep.json", b'"cat": "kernel", ',
                          b'"junk": ' + b"[" * 100_000 + b"]" * 100_000 + b", "), 0,
        check=_events_kept(STALL_EVENTS - 1), alt=_refused_naming("nest", "deep")),
    "deeply-nested-header": Case(
        lambda d: write(d / "deephdr.json", b'{"meta": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000
                        + b', "traceEvents": []}'), 2, ("nest",)),
    # -- gzip ----------------------------------------------------------------------------------------
    "corrupt-gz": Case(lambda d: write(d / "corrupt.json.gz", b"\x1f\x8b\x08\x00" + b"\xde\xad\xbe\xef" * 64), 2,
                       ("corrupt.json.gz: corrupt gzip data",)),
    # a .gz cut inside its 10-byte header: nothing can be inflated; saying "empty file" sends the user looking
    # for the wrong problem
    "gz-cut-in-header": Case(lambda d: write(d / "hdr.json.gz", gzip.compress(b'{"traceEvents": []}')[:6]), 2,
                             ("gzip",)),
    "gz-cut-mid-stream": Case(_cut_gz, 0, ("the trace was cut off; analysed the", "complete events before the cut"),
                              check=_findings_still_come_out),
    "json-cut-mid-event": Case(_cut_json, 0, ("the trace was cut off; analysed the", "complete events before the cut"),
                               check=_findings_still_come_out),
    # -- folders ------------------------------------------------------------------------------------------
    "folder-trace-txt-png-subfolder": Case(_mixed_folder, 0, check=lambda doc: (
        [Path(t["trace"]).name for t in doc["traces"]] == ["trace.json.gz"] or pytest.fail(str(doc["traces"])))),
    # a folder may hold the user's other JSON (metrics, earlier reports): skipped with a note, the trace analysed
    "folder-trace-and-other-json": Case(_mixed_with_other_json, 0, ("skipped", "metrics.json", "traceEvents"),
                                        check=_findings_still_come_out),
    "folder-of-subfolders": Case(lambda d: (write(d / "runs" / "a" / "x.json", "{}"), d / "runs")[1], 2,
                                 ("folder holds no .json/.json.gz trace",)),
    # -- run folders missing pieces --------------------------------------------------------------------------
    "run-json-without-trace": Case(lambda d: _run_folder(d, DATALOADER_FACTS, trace=False), 2,
                                   ("run folder has no trace",)),
    "trace-without-run-json": Case(lambda d: _run_folder(d, None), 0, check=_findings_still_come_out),
    "run-json-is-a-list": Case(lambda d: _run_folder(d, [1, 2]), 2, ("run.json: run.json is not a JSON object",),
                               names="run.json"),
    "run-json-is-empty": Case(lambda d: _run_folder(d, b""), 2, ("run folder's run.json is unreadable",),
                              names="run.json"),
    "run-json-not-utf8": Case(lambda d: _run_folder(d, b"\xff\xfe{}"), 2, ("run folder's run.json is unreadable",),
                              names="run.json"),
    # well-formed JSON, ill-typed facts: the facts are ignored (or noted); the trace's findings still come out
    "run-json-dataloaders-not-a-list": Case(lambda d: _run_folder(d, {"dataloaders": 5}), 0,
                                            check=_findings_still_come_out, no_notes=("failed",)),
    "run-json-dataloader-entries-not-objects": Case(lambda d: _run_folder(d, {"dataloaders": [5, "x"]}), 0,
                                                    check=_findings_still_come_out, no_notes=("failed",)),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input(capsys, tmp_path, case):
    c = BAD_INPUT[case]
    path = c.make(tmp_path)
    rc, out, err = call_main(capsys, "analyze", path, "--format", "json")
    doc = json.loads(out) if rc == 0 and out else None
    if c.alt is not None and rc != c.rc and c.alt(rc, doc, err):
        return  # a clean refusal, which this row accepts
    assert rc == c.rc, f"exit {rc}, expected {c.rc}\nstderr: {err}"
    if rc == 2:
        assert out == "", "no report (not even part of one) on an error"
        named = str(path / c.names) if c.names else str(path)
        one_error_line(err, named, *c.says)
        return
    assert err == "", f"a salvaged input still writes only the report: {err}"
    notes = notes_of(doc)
    if c.says:
        assert any(all(s in n for s in c.says) for n in notes), f"no note says {c.says}: {notes}"
    for bad in c.no_notes:
        assert not any(bad in n for n in notes), f"note claims {bad!r}: {notes}"
    if c.check:
        c.check(doc)


# The same rows through the real command: exit code, no traceback, nothing but the report on stdout.
SUBPROCESS_SAMPLE = ["not-json", "traceEvents-object", "event-name-null", "nan-token-in-ts",
                     "non-utf8-bytes-in-kernel-name", "deeply-nested-event-args", "gz-cut-mid-stream",
                     "run-json-is-a-list"]


@pytest.mark.parametrize("case", SUBPROCESS_SAMPLE)
@pytest.mark.slow
def test_bad_input_real_command_has_no_traceback(tmp_path, case):
    c = BAD_INPUT[case]
    path = c.make(tmp_path)
    for fmt in ("text", "md"):
        run = run_cli("analyze", path, "--format", fmt, cwd=tmp_path)
        assert "Traceback" not in run.stderr + run.stdout, run.stderr
        assert "internal error" not in run.stderr, run.stderr
        assert run.returncode in (0, 2), (run.returncode, run.stderr)
        if run.returncode == 2:
            assert run.stdout == ""
            one_error_line(run.stderr)
        else:
            assert run.stderr == "", run.stderr


@pytest.mark.slow
def test_trace_with_out_of_range_ids_prints_no_warnings(tmp_path):
    """A 10**30 correlation id is read as "no id", quietly: no numpy RuntimeWarning on the user's stderr."""
    path = mutated(tmp_path / "bigid.json", lambda doc: [k["args"].update(correlation=10**30) for k in kernels(doc)[:3]])
    run = run_cli("analyze", path, "--format", "json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "", run.stderr
    json.loads(run.stdout)


# ---------------------------------------------------------------------------------------------------
# unreadable paths (permission bits mean nothing to root)


@pytest.mark.skipif(IS_ROOT, reason="root reads files whatever their permission bits")
def test_unreadable_file(capsys, tmp_path):
    path = write_rule_positive("dataloader-stall", tmp_path / "secret.json")
    path.chmod(0)
    try:
        rc, out, err = call_main(capsys, "analyze", path)
    finally:
        path.chmod(0o644)
    assert rc == 2 and out == ""
    one_error_line(err, str(path), "permission denied")


@pytest.mark.skipif(IS_ROOT, reason="root reads folders whatever their permission bits")
def test_unreadable_folder(capsys, tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    write_rule_positive("dataloader-stall", folder / "trace.json")
    folder.chmod(0)
    try:
        rc, out, err = call_main(capsys, "analyze", folder)
    finally:
        folder.chmod(0o755)
    assert rc == 2, err
    assert out == ""
    one_error_line(err, "locked", "permission denied")


def test_unreadable_folder_simulated(capsys, tmp_path, monkeypatch):
    """What a non-root user meets on a mode-000 folder (EACCES from stat inside it and from listing it),
    simulated so that it is also checked when the tests run as root."""
    import pathlib

    folder = tmp_path / "locked"
    folder.mkdir()
    write_rule_positive("dataloader-stall", folder / "trace.json")
    real_stat, real_iterdir = pathlib.Path.stat, pathlib.Path.iterdir

    def stat(self, *a, **kw):
        if self.parent == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *a, **kw)

    def iterdir(self):
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    monkeypatch.setattr(pathlib.Path, "iterdir", iterdir)
    rc, out, err = call_main(capsys, "analyze", folder)
    monkeypatch.undo()
    assert rc == 2, err
    assert out == ""
    one_error_line(err, "locked", "ermission denied")


def test_one_bad_path_among_good_ones_writes_nothing(capsys, tmp_path):
    good = write_rule_positive("dataloader-stall", tmp_path / "good.json")
    out_file = tmp_path / "report.md"
    rc, out, err = call_main(capsys, "analyze", good, tmp_path / "missing.json", "-o", out_file)
    assert rc == 2 and out == ""
    one_error_line(err, "missing.json", "no such file or folder")
    assert not out_file.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.json"], "stray files left behind"


@pytest.mark.slow
def test_trace_read_from_a_pipe(tmp_path):
    """`gpuadvise analyze /dev/stdin < <(zcat t.json.gz)` and process substitution hand over a pipe: it
    cannot seek, but it holds a perfectly good trace."""
    data = json.dumps(stall_doc()).encode()
    env = {k: v for k, v in os.environ.items() if k != "GPUADVISE_DEBUG"}
    for payload in (data, gzip.compress(data)):
        run = subprocess.run([sys.executable, "-m", "gpuadvise", "analyze", "/dev/stdin", "--format", "json"],
                             input=payload, capture_output=True, cwd=tmp_path, env=env, timeout=120)
        assert run.returncode == 0, run.stderr.decode()
        assert json.loads(run.stdout)["summary"]["findings"] == 3


# ---------------------------------------------------------------------------------------------------
# output destinations


@pytest.fixture
def stall_trace(tmp_path) -> Path:
    (tmp_path / "in").mkdir()
    return write_rule_positive("dataloader-stall", tmp_path / "in" / "stall.json.gz")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.slow
def test_text_report_to_dev_full(tmp_path, stall_trace):
    run = run_cli("analyze", stall_trace, "-o", "/dev/full", cwd=tmp_path)  # md and json: tests/test_cli.py
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    one_error_line(run.stderr, "/dev/full", "No space left on device")


@pytest.mark.skipif(IS_ROOT, reason="root writes into read-only folders")
def test_output_into_read_only_folder(capsys, tmp_path, stall_trace):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, out, err = call_main(capsys, "analyze", stall_trace, "-o", ro / "report.md")
    finally:
        ro.chmod(0o755)
    assert rc == 2 and out == ""
    one_error_line(err, "report.md", "output is not writable")
    assert list(ro.iterdir()) == []


def test_output_below_a_file(capsys, tmp_path, stall_trace):
    blocker = write(tmp_path / "afile", "x")
    rc, out, err = call_main(capsys, "analyze", stall_trace, "-o", blocker / "report.md")
    assert rc == 2 and out == ""
    one_error_line(err, "report.md", "output folder")
    assert blocker.read_text() == "x"


@pytest.mark.parametrize("which", ["the-trace", "a-trace-in-the-folder"])
def test_output_onto_an_input_trace_is_refused(capsys, tmp_path, stall_trace, which):
    """`-o` naming the trace being analysed would replace the user's only copy of it with the report."""
    before = stall_trace.read_bytes()
    arg = stall_trace if which == "the-trace" else stall_trace.parent
    rc, out, err = call_main(capsys, "analyze", arg, "-o", stall_trace)
    assert stall_trace.read_bytes() == before, "the input trace was overwritten by the report"
    assert rc == 2 and out == ""
    one_error_line(err, str(stall_trace))


# ---------------------------------------------------------------------------------------------------
# bounded resources


def _gzip(data: bytes) -> bytes:
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    return co.compress(data) + co.flush()


_PEAK = textwrap.dedent("""
    import resource, sys
    from gpuadvise.cli import main
    rc = main(sys.argv[1:])
    sys.stderr.write("PEAK_RSS_KB %d\\n" % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    sys.exit(rc)
""")


def _limited(*args, limit: int | None = None, timeout: float = 120, address_space: int | None = None,
             cwd=None) -> subprocess.CompletedProcess:
    """`gpuadvise ARGS` in a subprocess with GPUADVISE_MAX_TRACE_BYTES=limit; stderr's last line is its peak RSS."""
    env = {k: v for k, v in os.environ.items() if k != "GPUADVISE_DEBUG"}
    if limit is not None:
        env["GPUADVISE_MAX_TRACE_BYTES"] = str(limit)

    def cap():
        if address_space:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([sys.executable, "-c", _PEAK, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, preexec_fn=cap, cwd=cwd)


def _split_peak(stderr: str) -> tuple[str, int]:
    lines = stderr.splitlines()
    assert lines and lines[-1].startswith("PEAK_RSS_KB "), stderr
    return "\n".join(lines[:-1]), int(lines[-1].split()[1])


_ZERO_UNITS = re.compile(r"(?<![\d.])0(\.0+)? ?(GiB|GB|MiB|MB|KiB|kB|bytes)\b")


@pytest.fixture
def bombs(tmp_path) -> tuple[Path, Path]:
    """Two .gz files of one JSON document each, inflating to 5 MB and to 200 MB (about 200 KB on disk)."""
    small = write(tmp_path / "bomb5.json.gz", _gzip(b'{"traceEvents": [], "pad": "' + b"A" * 5_000_000 + b'"}'))
    big = write(tmp_path / "bomb200.json.gz", _gzip(b'{"traceEvents": [], "pad": "' + b"A" * 200_000_000 + b'"}'))
    return small, big


@pytest.mark.slow
def test_gzip_bomb_is_refused_with_a_clear_message(tmp_path, bombs):
    """A .gz that inflates past GPUADVISE_MAX_TRACE_BYTES (1 MB here) is refused, in units that show the limit."""
    small, _ = bombs
    run = _limited("analyze", small, limit=1_000_000, cwd=tmp_path)
    err, _ = _split_peak(run.stderr)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    line = one_error_line(err, str(small), "refus")
    assert not _ZERO_UNITS.search(line), f"the limit is shown as zero: {line}"


@pytest.mark.slow
def test_gzip_bomb_is_refused_before_it_is_inflated(tmp_path, bombs):
    """Refusing a bomb must not cost memory in proportion to what it would inflate to: a 200 MB bomb is
    refused at about the same peak memory as a 5 MB one (limit 1 MB)."""
    peaks = {}
    for path in bombs:
        run = _limited("analyze", path, limit=1_000_000, cwd=tmp_path)
        err, peaks[path.name] = _split_peak(run.stderr)
        assert run.returncode == 2, run.stderr
        one_error_line(err, str(path))
    grew = (peaks["bomb200.json.gz"] - peaks["bomb5.json.gz"]) / 1024
    assert grew < 64, f"refusing the bomb cost {grew:.0f} MiB more than refusing a small one: it was inflated first"


@pytest.mark.slow
def test_plain_file_over_the_limit_is_refused_in_sensible_units(tmp_path):
    path = write(tmp_path / "big.json", b'{"traceEvents": [], "pad": "' + b"A" * 5_000_000 + b'"}')
    run = _limited("analyze", path, limit=1_000_000, cwd=tmp_path)
    err, _ = _split_peak(run.stderr)
    assert run.returncode == 2, run.stderr
    line = one_error_line(err, str(path))
    assert "limit" in line
    assert not _ZERO_UNITS.search(line), f"sizes shown as zero: {line}"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.slow
def test_endless_device_is_refused_not_read_forever(tmp_path):
    """/dev/zero reports size 0 and never ends: it must be refused at the size limit, not read until the
    machine runs out of memory (the address space is capped at 3 GiB here so CI survives the bug)."""
    run = _limited("analyze", "/dev/zero", limit=1_000_000, timeout=120, address_space=3 << 30, cwd=tmp_path)
    err = run.stderr.rsplit("PEAK_RSS_KB", 1)[0]
    assert run.returncode == 2, run.stderr
    one_error_line(err, "/dev/zero")


@pytest.mark.slow
def test_single_huge_string_is_handled_or_refused_quickly(tmp_path):
    """One 50 MB kernel name (a 50 MB file): analysed or refused in bounded time and memory, and never
    copied whole into a report. A 50 MB trace of ordinary events takes a couple of seconds."""
    b = TraceBuilder()
    for step in range(4):
        with b.step():
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 30_000)
            with b.op("aten::linear"):
                for i in range(5):
                    b.kernel("ampere_sgemm_" + "K" * 50_000_000 if step == 0 and i == 0 else "ampere_sgemm_64x64", 400)
    path = b.write(tmp_path / "huge_name.json")
    start = time.monotonic()
    run = _limited("analyze", path, "--format", "md", timeout=300, cwd=tmp_path)
    elapsed = time.monotonic() - start
    err, peak_kb = _split_peak(run.stderr)
    assert "Traceback" not in err
    assert run.returncode in (0, 2), err
    if run.returncode == 2:
        one_error_line(err, str(path))
    else:
        assert err == ""
        assert len(run.stdout) < 200_000, f"the report quotes the whole name ({len(run.stdout)} chars)"
    assert peak_kb < 1_500_000, f"peak memory {peak_kb / 1024:.0f} MiB for a 50 MB file"
    assert elapsed < 30, f"{elapsed:.0f} s for one 50 MB string"


def test_damage_in_the_middle_is_handled_in_bounded_time(tmp_path):
    """One bad byte half-way through a 2 MB trace (a disk error, a bad copy): the events before it are
    analysed, or the file is refused; either way promptly, and without claiming that nothing could be read."""
    from gpuadvise.analyzer.errors import InputError
    from gpuadvise.analyzer.read.loader import parse_trace_bytes

    b = TraceBuilder()
    for _ in range(20):
        with b.step():
            for _ in range(300):
                b.kernel("ampere_sgemm_128x64_nn", 10)
            b.sync()
    data = json.dumps(b.to_dict()).encode()
    total = len(b.events) + 3
    i = data.index(b'{"ph"', len(data) // 2)
    bad = data[:i] + b"#" + data[i + 1:]
    start = time.monotonic()
    try:
        model = parse_trace_bytes(bad, Path("damaged.json"))
    except InputError as exc:
        elapsed = time.monotonic() - start
        assert "no complete event could be read" not in str(exc), f"half the events were complete: {exc}"
    else:
        elapsed = time.monotonic() - start
        assert model.meta.events_total >= 0.45 * total, model.meta.events_total
    assert elapsed < 3, f"{elapsed:.1f} s to deal with one bad byte in 2 MB (a clean parse takes ~0.05 s)"


# ---------------------------------------------------------------------------------------------------
# names are data: escaped in markdown, stripped in terminal text

EVIL = "|`<script>alert(1)</script>`<img src=x onerror=alert(2)>\x1b[2J\x1b]0;pwned\x07\x9b31m|"


@pytest.fixture
def evil_trace(tmp_path) -> Path:
    """A DataLoader stall whose device, loader, op, call-stack and kernel names carry markdown, HTML and
    terminal escapes, so that findings, evidence tables, sources and recommendations all quote them."""
    b = TraceBuilder(device="A100 " + EVIL)
    for _ in range(4):
        with b.step():
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" + EVIL, 30_000)
            with b.op("aten::to" + EVIL, stack="/home/u/train" + EVIL + ".py(12): <module>"):
                b.copy("HtoD", "Pageable", "Device")
            with b.op("aten::linear" + EVIL):
                for _ in range(5):
                    b.kernel("ampere_sgemm_128x64_nn" + EVIL, 400)
    b.finish()
    return b.write(tmp_path / "evil.json")


def _assert_safe_markdown(md: str) -> None:
    assert not CONTROL.search(md), f"raw control characters in markdown: {CONTROL.findall(md)[:5]}"
    assert "pwned" not in md, "an OSC payload (window title) survived"
    markdown_it = pytest.importorskip("markdown_it")
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in html and "<img" not in html, "trace names became live HTML"
    # every table row has as many cells as its header: no pipe from a name split a cell
    for block in re.split(r"\n(?!\|)", md):
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        if len(rows) >= 2:
            width = len(re.split(r"(?<!\\)\|", rows[0]))
            for row in rows[2:]:
                assert len(re.split(r"(?<!\\)\|", row)) == width, f"table row out of shape: {row}"


def _assert_safe_terminal(text: str) -> None:
    assert not CONTROL.search(text), f"control characters reach the terminal: {CONTROL.findall(text)[:5]}"
    assert "pwned" not in text


def test_crafted_names_markdown(capsys, evil_trace):
    rc, out, err = call_main(capsys, "analyze", evil_trace, "--format", "md")
    assert rc == 0, err
    assert "dataloader-stall" in out and "no-tensor-cores" in out  # the names are quoted by several findings
    _assert_safe_markdown(out)


def test_crafted_names_text(capsys, evil_trace):
    rc, out, err = call_main(capsys, "analyze", evil_trace, "--format", "text", "--top", "10")
    assert rc == 0, err
    assert "<script>" in out, "text keeps the name's printable characters"
    _assert_safe_terminal(out)
    _assert_safe_terminal(err)


def test_crafted_names_json_round_trip(capsys, evil_trace):
    rc, out, err = call_main(capsys, "analyze", evil_trace, "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["summary"]["device"] == "A100 " + EVIL, "JSON carries the name exactly (escaped by JSON itself)"
    assert not CONTROL.search(out), "json.dumps escapes control characters"


def test_crafted_run_json_facts_markdown(capsys, tmp_path):
    """run.json is as foreign as a trace (it travels with the run folder): its DataLoader line is quoted
    in the DataLoader finding's recommendation."""
    facts = {"dataloaders": [{"created_at": "train.py:41" + EVIL, "num_workers": 0, "pin_memory": False}]}
    folder = _run_folder(tmp_path, facts)
    rc, out, err = call_main(capsys, "analyze", folder, "--format", "md")
    assert rc == 0, err
    _assert_safe_markdown(out)
    rc, out, err = call_main(capsys, "analyze", folder, "--format", "text")
    assert rc == 0, err
    _assert_safe_terminal(out)


@pytest.mark.parametrize("fmt", ["text", "md", "json"])
def test_ill_typed_run_json_facts_in_every_format(capsys, tmp_path, fmt):
    """A DataLoader entry whose created_at is a number and num_workers a string (pin_memory off, so the
    finding quotes the entry)."""
    folder = _run_folder(tmp_path, {"dataloaders": [{"created_at": 41, "num_workers": "zero", "pin_memory": False}]})
    rc, out, err = call_main(capsys, "analyze", folder, "--format", fmt)
    assert rc == 0, err
    assert "dataloader-stall" in out


@pytest.mark.slow
def test_crafted_names_real_terminal(tmp_path, evil_trace):
    run = run_cli("analyze", evil_trace, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    _assert_safe_terminal(run.stdout + run.stderr)


# ---------------------------------------------------------------------------------------------------
# the training job comes first: `gpuadvise profile`

torch_missing = pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="gpuadvise profile needs torch")
WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2"]  # three steps in all
TIMEOUT = 300


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPUADVISE_DEBUG")}
    env.update(extra or {})
    return env


def _script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def _run(cmd, cwd, input=b"", env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, input=input, capture_output=True, timeout=TIMEOUT, env=env or _env())
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def _native(script: str, *args, cwd: Path, input=b"") -> subprocess.CompletedProcess:
    return _run([sys.executable, script, *args], cwd, input)


def _profile(script: str, *args, cwd: Path, input=b"", env=None, quiet=True) -> subprocess.CompletedProcess:
    ours = ["-q"] if quiet else []
    return _run([sys.executable, "-m", "gpuadvise", "profile", *ours, "-o", "run", *WINDOW, script, *args], cwd, input, env)


def _run_json(cwd: Path) -> dict:
    return json.loads((cwd / "run" / "run.json").read_text())


def _show(p) -> str:
    return f"rc={p.returncode}\n--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr}"


def _leftovers(cwd: Path) -> list[str]:
    """Files in the run folder other than the ones a capture writes (temp files of a half-written trace)."""
    return sorted(p.name for p in (cwd / "run").iterdir() if p.name not in ("run.json", "trace.pt.trace.json.gz", "memory.pickle", "profiler.log", "steps.jsonl"))


TRAIN_STEP = """
    import torch
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def train_step(x=None):
        loss = model(torch.randn(4, 8) if x is None else x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@torch_missing
@pytest.mark.slow
def test_profiler_failing_at_start_leaves_the_script_alone(tmp_path):
    """torch.profiler.profile.start raising (a CUPTI init failure, say), made to happen in the profiled
    process only through a sitecustomize module: the script runs unprofiled, its output and exit code are
    its own, run.json says the start failed and why."""
    _script(tmp_path / "site", "sitecustomize.py", """
        import sys
        if any("gpuadvise.harness.session.bootstrap" in a for a in getattr(sys, "orig_argv", [])):
            import torch.profiler
            def _broken(self, *args, **kwargs):
                raise RuntimeError("probe: profiler start broken on purpose")
            torch.profiler.profile.start = _broken
    """)
    _script(tmp_path, "train.py", TRAIN_STEP + """
    for _ in range(6):
        train_step()
    print("done", flush=True)
    raise SystemExit(5)
    """)
    plain = _native("train.py", cwd=tmp_path)
    env = _env({"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))})
    proc = _profile("train.py", cwd=tmp_path, env=env)
    assert plain.returncode == 5, _show(plain)
    assert proc.returncode == 5, _show(proc)
    assert proc.stdout == plain.stdout == "done\n"
    assert "profiling stopped" in proc.stderr and "continues unprofiled" in proc.stderr
    run = _run_json(tmp_path)
    assert run["exit_code"] == 5
    assert run["capture"]["state"] == "failed: profiler start failed"
    assert "probe: profiler start broken on purpose" in run["capture"]["error"]
    assert _leftovers(tmp_path) == [] and not (tmp_path / "run" / "trace.pt.trace.json.gz").exists()


def _signal_mid_window(cmd: list[str], cwd: Path, how: str) -> tuple[int, str, str]:
    """Start `cmd`, signal it once its script prints "before wait" (_cli_support.signal_when_ready)."""
    return signal_when_ready(cmd, cwd, how, _env(), TIMEOUT)


MID_WINDOW = TRAIN_STEP + """
    import os, sys, time
    train_step()  # one step into a three-step window
    print(f"before {sys.argv[1]}", flush=True)
    if sys.argv[1] == "os_exit":
        os._exit(9)
    time.sleep(60)
    print("after", flush=True)
"""


@torch_missing
@pytest.mark.parametrize("how, signum", [("ctrl-c", signal.SIGINT), ("sigterm", signal.SIGTERM)])
@pytest.mark.slow
def test_signal_during_the_window(tmp_path, how, signum):
    _script(tmp_path, "midwin.py", MID_WINDOW)
    native_rc, _, _ = _signal_mid_window([sys.executable, "midwin.py", "wait"], tmp_path, how)
    rc, out, err = _signal_mid_window([sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", "run", *WINDOW,
                                       "midwin.py", "wait"], tmp_path, how)
    assert rc == native_rc == -signum, f"rc={rc} native={native_rc}\n{out}\n{err}"
    assert "after" not in out
    run = _run_json(tmp_path)
    assert run["exit_code"] == -signum
    assert run["exit_signal"] == signal.Signals(signum).name
    assert run["capture"]["state"].startswith("incomplete"), run["capture"]
    assert not (tmp_path / "run" / "trace.pt.trace.json.gz").exists(), "a partial window must not become a trace"
    assert _leftovers(tmp_path) == [], "half-written files left in the run folder"


@torch_missing
@pytest.mark.slow
def test_os_exit_during_the_window(tmp_path):
    """os._exit skips every handler: the exit code still comes back, and run.json (and the summary) say the
    window was cut short after the step that was taken, not that no step was ever seen."""
    _script(tmp_path, "midwin.py", MID_WINDOW)
    plain = _native("midwin.py", "os_exit", cwd=tmp_path)
    proc = _profile("midwin.py", "os_exit", cwd=tmp_path, quiet=False)
    assert plain.returncode == proc.returncode == 9, _show(proc)
    assert proc.stdout == plain.stdout == "before os_exit\n"
    run = _run_json(tmp_path)
    assert run["exit_code"] == 9
    assert run["capture"]["state"].startswith("incomplete"), run["capture"]
    assert not (tmp_path / "run" / "trace.pt.trace.json.gz").exists()
    assert _leftovers(tmp_path) == []
    assert "no training step was seen" not in proc.stderr, ("the summary blames a missing step hook although an "
                                                            "optimizer step was taken:\n" + proc.stderr)
    assert run["capture"]["steps_stepped"] == 1, run["capture"]


@torch_missing
@pytest.mark.slow
def test_dataloader_workers_forked_during_the_window(tmp_path):
    """num_workers=2, a fresh iterator (and so freshly forked workers) every two batches, all inside the
    window: the workers neither hang nor write anything of ours; the capture completes."""
    _script(tmp_path, "workers.py", TRAIN_STEP + """
    import os, sys
    from torch.utils.data import DataLoader, Dataset
    class DS(Dataset):
        def __len__(self): return 16
        def __getitem__(self, i): return torch.full((8,), float(i))
    if __name__ == "__main__":
        n = 0
        for epoch in range(4):
            for x in DataLoader(DS(), batch_size=8, num_workers=2):
                train_step(x)
                n += 1
        print("batches", n, flush=True)
        sys.exit(4)
    """)
    plain = _native("workers.py", cwd=tmp_path)
    proc = _profile("workers.py", cwd=tmp_path)
    assert plain.returncode == proc.returncode == 4, _show(proc)
    assert proc.stdout == plain.stdout == "batches 8\n"
    run = _run_json(tmp_path)
    assert run["exit_code"] == 4
    assert run["capture"]["state"] == "captured", run["capture"]
    assert (tmp_path / "run" / "trace.pt.trace.json.gz").is_file()
    assert run["dataloaders"] and {d["num_workers"] for d in run["dataloaders"]} == {2}
    assert _leftovers(tmp_path) == []


@torch_missing
@pytest.mark.slow
def test_multiprocessing_spawn_with_a_worker_defined_in_the_script(tmp_path):
    """spawn re-imports the script as __mp_main__ in fresh interpreters: `square` must be found there."""
    _script(tmp_path, "spawn.py", TRAIN_STEP + """
    import multiprocessing as mp, sys
    def square(x):
        return x * x
    if __name__ == "__main__":
        for i in range(5):
            train_step()
            if i == 1:  # inside the window
                with mp.get_context("spawn").Pool(1) as pool:  # one spawned interpreter (each imports torch again)
                    print("squares", pool.map(square, range(5)), flush=True)
        print("done", flush=True)
        sys.exit(6)
    """)
    plain = _native("spawn.py", cwd=tmp_path)
    proc = _profile("spawn.py", cwd=tmp_path)
    assert plain.returncode == 6, _show(plain)
    assert proc.returncode == 6, _show(proc)
    assert proc.stdout == plain.stdout == "squares [0, 1, 4, 9, 16]\ndone\n"
    run = _run_json(tmp_path)
    assert run["exit_code"] == 6
    assert run["capture"]["state"] == "captured", run["capture"]
    assert _leftovers(tmp_path) == []


@torch_missing
@pytest.mark.slow
def test_script_reading_stdin_during_the_window(tmp_path):
    """One training step per line of stdin: the lines arrive unchanged, in order, while the profiler runs."""
    _script(tmp_path, "lines.py", TRAIN_STEP + """
    import sys
    n = 0
    for line in sys.stdin:
        train_step()
        n += 1
        print(f"got {line.strip()} step {n}", flush=True)
    print("eof", n, flush=True)
    """)
    data = b"".join(f"line {i}\n".encode() for i in range(6))
    plain = _native("lines.py", cwd=tmp_path, input=data)
    proc = _profile("lines.py", cwd=tmp_path, input=data)
    assert plain.returncode == proc.returncode == 0, _show(proc)
    assert proc.stdout == plain.stdout
    assert "eof 6" in proc.stdout
    run = _run_json(tmp_path)
    assert run["capture"]["state"] == "captured", run["capture"]
    assert run["exit_code"] == 0

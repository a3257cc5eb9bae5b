"""Big files are streamed in windows (analyzer/stream.py): same model as reading the whole file, whatever
the layout, and never the whole text in memory."""

import gzip
import json
import os
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from _cli_support import is_corpus_trace
from gpuadvise.analyzer.read import forked
from gpuadvise.analyzer.read import chunks, filebytes, loader, parallel
from gpuadvise.analyzer.read import stream
from gpuadvise.analyzer.errors import InputError
from gpuadvise.rules import find_rule

TABLES = ("gpu", "runtime", "cpu", "python", "memory", "syncs", "gpu_annotations", "comms")
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _careful(path, monkeypatch):
    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 1 << 60)
    return loader.load_trace(path, cache=False)


def _streamed(path, monkeypatch, workers=1, window=4096, mapped=True):
    """Load through the streaming path with tiny windows (many cuts, matches across window edges); a plain
    file is mapped (pieces framed in place), or, not `mapped`, read in windows as where mmap fails.
    Returns the model, whether it was streamed (not the careful path) and whether two processes split it."""
    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(stream, "WINDOW", window)
    monkeypatch.setattr(stream, "MAP_FILES", mapped)
    monkeypatch.setattr(stream, "TAIL_RESERVE", max(window, 1024))
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", str(workers))
    # The loader never forks a process that runs threads; idle ones left by earlier tests (a Dask
    # client's) must not turn this test into a one-process one.
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    calls, halves = [], []
    real, real_halves = loader._load_streaming, stream._two_processes
    monkeypatch.setattr(loader, "_load_streaming", lambda *a: calls.append(real(*a)) or calls[-1])
    monkeypatch.setattr(stream, "_two_processes", lambda *a: halves.append(real_halves(*a)) or halves[-1])
    model = loader.load_trace(path, cache=False)
    split_worked = bool(halves) and halves[0] is not None
    return model, calls[-1] is not None, split_worked


def _same(a, b):
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_categorical=False)
        if "name" in getattr(a, name):
            assert list(getattr(a, name)["name"].astype(str)) == list(getattr(b, name)["name"].astype(str))
    for key, value in vars(a.meta).items():
        assert getattr(b.meta, key) == value, key


def _trace(steps=8) -> dict:
    b = find_rule("dataloader-stall").positive()
    for step in range(steps):
        b.memory(1 << 20, (step + 1) << 20, 8 << 20)
    return b.to_dict()


def _write(path: Path, doc, gz=False, indent=None) -> Path:
    text = json.dumps(doc, indent=indent).encode()
    if gz:
        path = path.with_suffix(".json.gz")
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("indent", [None, 2], ids=["compact", "pretty"])
def test_streamed_model_equals_whole_file_model(tmp_path, monkeypatch, gz, workers, indent):
    path = _write(tmp_path / "t.json", _trace(), gz=gz, indent=indent)
    ref = _careful(path, monkeypatch)
    model, streamed, split_worked = _streamed(path, monkeypatch, workers)
    assert streamed
    assert split_worked == (workers > 1), "the forked worker did not deliver its half"
    _same(ref, model)
    assert len(model.gpu) > 0 and model.meta.devices


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "read"])
@pytest.mark.parametrize("layout", ["compact", "pretty", "cuts-in-strings", "nan", "cut-off"])
def test_a_mapped_or_read_file_gives_the_same_model(tmp_path, monkeypatch, layout, mapped):
    """Plain files are mapped and framed in place, or read in windows where they cannot be mapped: same
    model as the careful path either way, the same mending of cuts inside strings and NaN tokens, and a
    cut-off file still salvaged."""
    doc = _trace()
    if layout == "cuts-in-strings":
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel":
                e["name"] = "weird}, {kernel" + "},{" * 3000
    text = json.dumps(doc, indent=2 if layout == "pretty" else None)
    if layout == "nan":
        text = text.replace('"dur": 5.0', '"dur": NaN', 3)
    if layout == "cut-off":
        text = text[: int(len(text) * 0.7)]
    path = tmp_path / "t.json"
    path.write_text(text)
    ref = _careful(path, monkeypatch)
    for workers in (1, 2):
        model, streamed, _ = _streamed(path, monkeypatch, workers=workers, window=2048, mapped=mapped)
        assert streamed == (layout != "cut-off")
        _same(ref, model)
    assert model.meta.truncated == (layout == "cut-off")


def test_header_keys_after_the_events(tmp_path, monkeypatch):
    """Newer Kineto writes log lists after the events ("INFO": ["…cpp:835] …"]); a `},{` there must
    not be taken for a cut between events."""
    doc = _trace()
    events = doc.pop("traceEvents")
    doc = {"schemaVersion": 1, "traceEvents": events,
           "INFO": ["INFO: CuptiActivityProfiler.cpp:835] Enabling GPU tracing", "x}, {y ] z"],
           "distributedInfo": {"rank": 3, "world_size": 8}, "traceName": "t.json",
           "extra": [{"a": 1}, {"b": 2}], **{k: v for k, v in doc.items() if k != "schemaVersion"}}
    path = _write(tmp_path / "t.json", doc)
    ref = _careful(path, monkeypatch)
    model, streamed, _ = _streamed(path, monkeypatch, workers=2)
    assert streamed
    _same(ref, model)
    assert model.meta.rank == 3


def test_bare_event_list_and_bom(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_bytes(b"\xef\xbb\xbf \n" + json.dumps(_trace()["traceEvents"]).encode() + b"\n")
    ref = _careful(path, monkeypatch)
    model, streamed, _ = _streamed(path, monkeypatch, workers=2)
    assert streamed
    _same(ref, model)


def test_cuts_inside_strings_are_mended(tmp_path, monkeypatch):
    """Names full of `},{` put cuts inside strings, also at the split between the two processes."""
    doc = _trace(steps=3)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = "weird}, {kernel" + "},{" * 3000
    path = _write(tmp_path / "t.json", doc)
    ref = _careful(path, monkeypatch)
    for workers in (1, 2):
        model, streamed, _ = _streamed(path, monkeypatch, workers=workers, window=2048)
        assert streamed
        _same(ref, model)
        assert model.kernels["name"].astype(str).str.startswith("weird}").all()


def test_nan_tokens_in_a_streamed_file(tmp_path, monkeypatch):
    doc = _trace()
    text = json.dumps(doc)
    text = text.replace('"dur": 5.0', '"dur": NaN', 3)
    path = tmp_path / "t.json"
    path.write_text(text)
    ref = _careful(path, monkeypatch)
    model, streamed, _ = _streamed(path, monkeypatch)
    assert streamed
    _same(ref, model)


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_broken_files_fall_back_to_the_careful_path(tmp_path, monkeypatch, damage):
    data = json.dumps(_trace()).encode()
    path = tmp_path / "t.json"
    if damage == "cut":
        path.write_bytes(data[: int(len(data) * 0.7)])
    else:
        mid = len(data) // 2
        path.write_bytes(data[:mid] + b"\x00@@garbage" + data[mid:])
    ref = _careful(path, monkeypatch)
    model, streamed, _ = _streamed(path, monkeypatch, workers=2)
    assert not streamed
    _same(ref, model)
    assert model.meta.truncated
    assert (model.meta.damaged_at is not None) == (damage == "garbage")


def test_gzip_bomb_is_refused_while_streaming(tmp_path, monkeypatch):
    path = _write(tmp_path / "t.json", _trace(), gz=True)
    monkeypatch.setattr(filebytes, "MAX_TRACE_BYTES", 20_000)
    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    with pytest.raises(InputError, match="gzip inflates to more than"):
        loader.load_trace(path, cache=False)


def test_memory_stays_below_the_file_size(tmp_path, monkeypatch):
    """A 16 MB file whose bulk is text the analysis skips: streaming never holds it all."""
    doc = _trace(steps=2)
    pad = "x" * 2000
    for e in doc["traceEvents"]:
        e.setdefault("args", {})["Notes"] = pad
    copies = 16_000_000 // len(json.dumps(doc)) + 1
    doc["traceEvents"] = doc["traceEvents"] * copies
    path = _write(tmp_path / "big.json", doc)
    size = path.stat().st_size
    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(stream, "WINDOW", 512 << 10)
    monkeypatch.setattr(stream, "TAIL_RESERVE", 512 << 10)
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "1")
    tracemalloc.start()
    try:
        model = loader.load_trace(path, cache=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(model.gpu) > 0
    assert peak < 0.35 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"


def _mapped_resident_kb(path: Path) -> int:
    """The resident size of this process's mappings of `path` (Linux's /proc/self/smaps)."""
    total, inside, name = 0, False, os.path.realpath(path)  # smaps names the file by its real path
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line: range, perms, offset, dev, inode
            inside = line.rstrip().endswith(name)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists() or not stream.MAP_FILES, reason="needs Linux's smaps and mmap")
def test_a_mapped_file_keeps_about_one_window_resident_and_is_left_unchanged(tmp_path, monkeypatch):
    """The pages behind the decoded pieces are handed back as the reader goes, and the brackets that frame
    each piece in place leave the file as it was."""
    doc = _trace(steps=2)
    one, span = doc["traceEvents"], max(e.get("ts", 0) + e.get("dur", 0) for e in doc["traceEvents"]) + 1
    doc["traceEvents"] = [{**e, "ts": e["ts"] + k * span} if "ts" in e else e
                          for k in range(12_000_000 // len(json.dumps(doc)) + 1) for e in one]
    path = _write(tmp_path / "big.json", doc)
    before = path.read_bytes()
    window = 512 << 10
    monkeypatch.setattr(stream, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(stream, "WINDOW", window)
    monkeypatch.setattr(stream, "TAIL_RESERVE", window)
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "1")
    resident = []
    for step in ("decode_chunk", "scan_chunk"):  # msgspec's decode, or the compiled scanner's
        real = getattr(chunks, step)
        monkeypatch.setattr(chunks, step, lambda *a, real=real: resident.append(_mapped_resident_kb(path)) or real(*a))
    model = loader.load_trace(path, cache=False)
    ref = _careful(path, monkeypatch)
    _same(ref, model)
    assert len(resident) > 10 and max(resident) > 0  # decoded through the mapping
    # a piece and the next one's lookahead, the array's tail, pages of fault-around: far from the 12 MB file
    assert max(resident) * 1024 < 4 * window + (2 << 20), f"{max(resident)} kB resident of a {len(before) >> 10} kB file"
    assert path.read_bytes() == before


def _corpus_files():
    if not CORPUS.is_dir():
        return []
    files = sorted(p for p in CORPUS.rglob("*") if is_corpus_trace(p) and "holdout" not in p.parts)
    return [p for p in files if p.stat().st_size < 40 << 20]


@pytest.mark.skipif(not CORPUS.is_dir(), reason="needs ../shared/traces (not part of the project)")
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) for p in _corpus_files()], ids=lambda p: p.name)
def test_real_traces_stream_to_the_same_model(path, monkeypatch):
    ref = _careful(path, monkeypatch)
    model, streamed, _ = _streamed(path, monkeypatch, workers=2, window=256 << 10)
    assert streamed
    _same(ref, model)

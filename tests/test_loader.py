"""The loader: every trace shape torch.profiler has written reads into the same model, damaged traces
are salvaged and counted, and input that is not a trace fails with a message naming the problem."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.read.loader import load_trace, parse_trace_bytes
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.fixtures.builder import TraceBuilder


def small_builder(steps: int = 3, kernels: int = 5, **kw) -> TraceBuilder:
    b = TraceBuilder(**kw)
    for _ in range(steps):
        with b.step():
            with b.op("aten::linear"):
                for _ in range(kernels):
                    b.kernel("ampere_sgemm_128x64_nn", 100)
            b.copy("HtoD", "Pinned", "Device", nbytes=1 << 20, dur=50)
            b.sync()
    b.finish()
    return b


def counts(b: TraceBuilder) -> dict:
    evs = b.to_dict()["traceEvents"]
    return {
        "kernel": sum(e.get("cat") == "kernel" for e in evs),
        "memcpy": sum(e.get("cat") == "gpu_memcpy" for e in evs),
        "runtime": sum(e.get("cat") == "cuda_runtime" for e in evs),
        "cpu": sum(e.get("cat") in ("cpu_op", "user_annotation") for e in evs),
    }


# ----------------------------------------------------------------------------------------------------
# Modern traces


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz", "rank3.pt.trace.json.gz"])
def test_builder_trace_loads(tmp_path, name):
    b = small_builder()
    want = counts(b)
    model = load_trace(b.write(tmp_path / name))
    assert len(model.kernels) == want["kernel"] == 15
    assert len(model.copies) == want["memcpy"] == 3
    assert len(model.runtime) == want["runtime"]
    assert len(model.cpu) == want["cpu"]
    assert model.meta.platform == "cuda"
    assert model.meta.events_skipped == 0
    assert model.meta.truncated is False
    assert model.meta.unknown_categories == {}
    dev = model.device
    assert dev.name == "NVIDIA A100-SXM4-80GB" and (dev.compute_major, dev.compute_minor) == (8, 0)
    assert dev.total_memory == 80 * 2**30 and dev.num_sms == 108
    # rebased: earliest event at 0, end = ts + dur
    assert min(model.gpu["ts"].min(), model.cpu["ts"].min(), model.runtime["ts"].min()) == 0
    assert (model.gpu["end"] == model.gpu["ts"] + model.gpu["dur"]).all()
    assert set(model.kernels["stream"]) == {7}
    assert set(model.kernels["device"]) == {0}
    assert (model.kernels["correlation"] > 0).all()
    # the launch call of every kernel is found by correlation
    assert set(model.kernels["correlation"]) <= set(model.runtime["correlation"])
    assert model.meta.thread_names[(4242, 4242)] == "thread 4242 (python)"
    assert model.meta.process_names[0] == "GPU 0"


def test_json_and_gz_give_the_same_model(tmp_path):
    b = small_builder()
    a = load_trace(b.write(tmp_path / "a.json"))
    z = load_trace(b.write(tmp_path / "a.json.gz"))
    for table in ("gpu", "runtime", "cpu"):
        assert getattr(a, table)[["ts", "dur"]].equals(getattr(z, table)[["ts", "dur"]])
        assert list(getattr(a, table)["name"].astype(str)) == list(getattr(z, table)["name"].astype(str))


def test_rank_from_distributed_info(load_built):
    model = load_built(small_builder(rank=5))
    assert model.meta.rank == 5 and model.meta.world_size == 8


def test_bare_event_list(tmp_path):
    b = small_builder()
    p = tmp_path / "list.json"
    p.write_text(json.dumps(b.to_dict()["traceEvents"]))
    model = load_trace(p)
    assert len(model.kernels) == 15
    assert model.meta.devices == []
    assert model.meta.platform == "cuda"  # from the runtime call names
    report = analyze_model(model)
    assert report.metrics.has_gpu and len(report.metrics.steps) == 3


def test_leading_whitespace_and_bom(tmp_path):
    b = small_builder()
    p = tmp_path / "bom.json"
    p.write_bytes(b"\xef\xbb\xbf\n  " + json.dumps(b.to_dict()).encode())
    assert len(load_trace(p).kernels) == 15


def test_compute_properties_instead_of_device_properties(load_built):
    d = small_builder().to_dict()
    d["computeProperties"] = d.pop("deviceProperties")
    model = load_built(d)
    assert [dev.name for dev in model.meta.devices] == ["NVIDIA A100-SXM4-80GB"]
    assert model.device.compute_major == 8


def test_no_device_properties(load_built):
    model = load_built(small_builder(device=None))
    assert model.meta.devices == []
    assert model.device is None
    assert len(model.kernels) == 15
    report = analyze_model(model)  # rules that need the device must cope
    assert not any("failed" in n for n in report.notes), report.notes


def test_float_nanosecond_timestamps(load_built):
    """PyTorch ≥ 2.0 writes µs timestamps with ns fractions; they must not be rounded."""
    d = {"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 1700000000000.125, "dur": 3.25, "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
         "ts": 1700000000005.5, "dur": 1.375, "args": {"correlation": 9, "stream": 7, "device": 0}},
    ]}
    model = load_built(d)
    k = model.kernels.iloc[0]
    assert k["ts"] == pytest.approx(5.375, abs=1e-6)
    assert k["dur"] == pytest.approx(1.375, abs=1e-9)
    assert model.runtime["dur"].iloc[0] == pytest.approx(3.25, abs=1e-9)
    assert model.meta.base_ts_us == pytest.approx(1700000000000.125)
    launch = compute(model).launches.iloc[0]
    assert launch["delay_us"] == pytest.approx(5.375 - 3.25, abs=1e-6)


def test_memory_instant_events_without_category(load_built):
    b = small_builder()
    b.memory(1 << 20, 3 << 20, 8 << 20)
    d = b.to_dict()
    d["traceEvents"].append({"ph": "i", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4242, "ts": b.t + 5,
                             "args": {"Device Type": 1, "Device Id": 0, "Addr": 123, "Bytes": -(1 << 20),
                                      "Total Allocated": 2 << 20, "Total Reserved": 8 << 20}})
    model = load_built(d)
    assert len(model.memory) == 2
    assert list(model.memory["bytes"]) == [1 << 20, -(1 << 20)]
    assert list(model.memory["total_allocated"]) == [3 << 20, 2 << 20]
    assert set(model.memory["device"]) == {0}
    assert model.meta.unknown_categories == {}


def test_instant_events_with_names_that_are_not_text_beside_memory_and_metadata(load_built):
    """Uncategorised events whose name is a list or a number are ignored; the [memory] event and the
    process name among them are kept."""
    b = small_builder()
    d = b.to_dict()
    d["traceEvents"] += [{"ph": "i", "name": [1, 2], "pid": 4242, "tid": 4242, "ts": b.t + 1},
                         {"ph": "i", "name": [3, 4], "pid": 4242, "tid": 4242, "ts": b.t + 2},
                         {"ph": "i", "name": 7, "pid": 4242, "tid": 4242, "ts": b.t + 3},
                         {"ph": "i", "name": "[memory]", "pid": 4242, "tid": 4242, "ts": b.t + 4,
                          "args": {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 1024}},
                         {"ph": "M", "name": "process_name", "pid": 77, "args": {"name": "trainer"}}]
    model = load_built(d)
    assert list(model.memory["bytes"]) == [512]
    assert model.meta.process_names[77] == "trainer"


def test_rocm_trace(load_built):
    b = TraceBuilder(device="AMD Instinct MI300X", compute=(9, 4), platform="rocm")
    for _ in range(2):
        with b.step():
            for _ in range(5):
                b.kernel("Cijk_Alik_Bljk_SB_MT128x128x8_MI16x16x4x1", 100)
            b.copy("HtoD", "Pinned", "Device", dur=50)
            b.sync("hipStreamSynchronize")
    b.finish()
    model = load_built(b)
    assert model.meta.platform == "rocm"
    assert model.device.vendor == "amd"
    names = set(model.runtime["name"].astype(str))
    assert {"hipLaunchKernel", "hipMemcpyWithStream", "hipStreamSynchronize", "hipDeviceSynchronize"} <= names
    m = compute(model)
    assert len(m.launches) == 12  # 10 kernels + 2 copies joined to their hip calls
    assert m.syncs["profiler_sync"].sum() == 1  # hipDeviceSynchronize at the end is the profiler's


def test_rocm_platform_from_call_names_alone(load_built):
    b = TraceBuilder(platform="rocm", device=None)
    with b.step():
        b.kernel("Cijk_Alik_Bljk_HHS_BH_MT128x128x32", 100)
    d = b.to_dict()
    d.pop("hip_runtime_version")
    assert load_built(d).meta.platform == "rocm"


# ----------------------------------------------------------------------------------------------------
# Legacy (2021) traces


LEGACY = {
    "schemaVersion": 1,
    "traceEvents": [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#3", "pid": 100, "tid": "100", "ts": 1000, "dur": 500,
         "args": {"external id": 1}},
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 100, "tid": "100", "ts": 1010, "dur": 40,
         "args": {"external id": 2, "Call stack": "train.py(10): forward"}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": "100", "ts": 1020, "dur": 10,
         "args": {"correlation": 77, "external id": 2}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": "stream 7", "ts": 1040, "dur": 200,
         "args": {"correlation": 77, "external id": 2, "device": 0, "context": 1}},
        {"ph": "X", "cat": "Runtime", "name": "cudaMemcpyAsync", "pid": 100, "tid": "100", "ts": 1100, "dur": 8,
         "args": {"correlation": 78, "external id": 3}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": "stream 7",
         "ts": 1250, "dur": 20, "args": {"correlation": 78, "external id": 3, "bytes": 4096}},
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 9", "ts": 1300, "dur": 5,
         "args": {"device": 0}},
        {"ph": "f", "cat": "async_gpu", "id": 77, "pid": 0, "tid": "stream 7", "ts": 1040, "bp": "e"},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": "100", "args": {"name": "thread 100 (python)"}},
    ],
}


def test_legacy_categories_and_string_ids(load_built):
    model = load_built(LEGACY)
    assert len(model.kernels) == 1
    k = model.kernels.iloc[0]
    assert k["stream"] == 7 and k["device"] == 0
    assert k["correlation"] == 77 and k["external_id"] == 2  # lowercase "external id"
    copy = model.copies.iloc[0]
    assert copy["stream"] == 7 and copy["bytes"] == 4096
    memset = model.gpu[model.gpu["kind"] == "memset"].iloc[0]
    assert memset["stream"] == 9
    assert set(model.runtime["tid"]) == {100} and set(model.cpu["tid"]) == {100}
    assert set(model.runtime["external_id"]) == {2, 3}
    assert model.meta.unknown_categories == {}
    assert model.meta.thread_names[(100, 100)] == "thread 100 (python)"
    m = compute(model)
    assert [s.number for s in m.steps] == [3]
    assert list(m.launches["correlation"]) == [77, 78]
    assert list(m.kernels["name"]) == ["volta_sgemm_128x64_nn"]
    assert m.syncs["name"].tolist() == ["cudaMemcpyAsync"]  # pageable DtoH copy blocks


# ----------------------------------------------------------------------------------------------------
# Unusual and damaged content


def test_unknown_categories_are_counted_not_fatal(load_built):
    d = small_builder().to_dict()
    d["traceEvents"] += [
        {"ph": "X", "cat": "my_vendor_thing", "name": "x", "pid": 1, "tid": 1, "ts": 1500, "dur": 3},
        {"ph": "X", "cat": "my_vendor_thing", "name": "y", "pid": 1, "tid": 1, "ts": 1600, "dur": 3},
        {"ph": "X", "cat": "Weird", "name": "z", "pid": 1, "tid": 1, "ts": 1700, "dur": 3},
    ]
    model = load_built(d)
    assert model.meta.unknown_categories == {"my_vendor_thing": 2, "Weird": 1}
    assert len(model.kernels) == 15
    report = analyze_model(model)
    assert any("unknown categories" in n and "my_vendor_thing" in n for n in report.notes)


def test_malformed_events_skipped_or_repaired(load_built):
    b = small_builder()
    good = counts(b)["kernel"]
    d = b.to_dict()
    base = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "dur": 10.0, "args": {"stream": 7, "device": 0}}
    d["traceEvents"] += [
        {**base, "name": "ts_as_string", "ts": "1012.5"},  # repairable
        {**base, "name": "args_as_list", "ts": 1020.0, "args": [1, 2]},  # repairable: args dropped
        {**base, "name": "ts_missing"},  # unusable
        {**base, "name": "negative_dur", "ts": 1030.0, "dur": -5.0},  # unusable
        {**base, "name": "ts_garbage", "ts": "soon"},  # unusable
        "not an event",  # unusable
    ]
    model = load_built(d)
    names = set(model.kernels["name"].astype(str))
    assert {"ts_as_string", "args_as_list"} <= names
    assert not names & {"ts_missing", "negative_dur", "ts_garbage"}
    assert len(model.kernels) == good + 2
    assert model.meta.events_skipped == 4
    fixed = model.kernels[model.kernels["name"] == "ts_as_string"].iloc[0]
    assert fixed["ts"] + model.meta.base_ts_us == pytest.approx(1012.5)
    # the rest of the trace is untouched
    report = analyze_model(model)
    assert len(report.metrics.steps) == 3
    assert any("4 malformed events" in n for n in report.notes)


def test_wrongly_typed_args_field_keeps_the_event(load_built):
    d = small_builder().to_dict()
    d["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "odd_args", "pid": 0, "tid": 7, "ts": 1500.0,
                             "dur": 5.0, "args": {"stream": "seven", "device": 0, "correlation": 99999}})
    model = load_built(d)
    k = model.kernels[model.kernels["name"] == "odd_args"]
    assert len(k) == 1 and k["correlation"].iloc[0] == 99999


def _cut(tmp_path: Path, gz: bool) -> tuple[Path, int]:
    b = TraceBuilder()
    for _ in range(10):
        with b.step():
            for _ in range(30):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 100)
            b.sync()
    b.finish()
    full = b.write(tmp_path / ("full.json.gz" if gz else "full.json"))
    data = full.read_bytes()
    cut = tmp_path / ("cut.json.gz" if gz else "cut.json")
    cut.write_bytes(data[: int(len(data) * 0.6)])
    return cut, load_trace(full).meta.events_total


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_truncated_trace_is_salvaged(tmp_path, gz):
    cut, total = _cut(tmp_path, gz)
    model = load_trace(cut)
    assert model.meta.truncated is True
    assert 0 < model.meta.events_total < total
    assert len(model.kernels) > 50
    assert model.device is not None and model.device.compute_major == 8  # header before the events survives
    m = compute(model)
    assert m.steps and m.has_gpu


def test_truncated_bare_list_is_salvaged(tmp_path):
    b = small_builder(steps=5)
    data = json.dumps(b.to_dict()["traceEvents"]).encode()
    p = tmp_path / "cut.json"
    p.write_bytes(data[: int(len(data) * 0.6)])
    model = load_trace(p)
    assert model.meta.truncated is True
    assert 0 < len(model.kernels) < 25


# ----------------------------------------------------------------------------------------------------
# Errors a user can cause


def _error(path) -> str:
    with pytest.raises(InputError) as exc:
        load_trace(path)
    return str(exc.value)


def test_missing_file(tmp_path):
    msg = _error(tmp_path / "nope.json")
    assert "no such file" in msg and "nope.json" in msg


def test_directory_is_not_a_trace(tmp_path):
    assert "folder" in _error(tmp_path)


@pytest.mark.parametrize("content", [b"", b"   \n\t  "], ids=["empty", "whitespace"])
def test_empty_file(tmp_path, content):
    p = tmp_path / "empty.json"
    p.write_bytes(content)
    msg = _error(p)
    assert "empty file" in msg and "empty.json" in msg


def test_empty_gzip(tmp_path):
    p = tmp_path / "empty.json.gz"
    p.write_bytes(gzip.compress(b""))
    assert "empty file" in _error(p)


@pytest.mark.parametrize("content", [b"hello world", b"\x00\x01\x02binary", b"<html></html>"])
def test_not_json(tmp_path, content):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    assert "not a JSON trace" in _error(p)


def test_broken_json_object(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b'{"a": 1, "b": [1, 2')
    assert "not valid JSON" in _error(p)


def test_broken_json_list(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b'[{"ph": "X", "cat": "kern')  # cut inside the first event: nothing to salvage
    assert "not valid JSON" in _error(p)


def test_empty_event_list_is_an_empty_trace(tmp_path):
    p = tmp_path / "empty-list.json"
    p.write_bytes(b"[]")
    model = load_trace(p)
    assert model.gpu.empty and model.cpu.empty and model.meta.events_total == 0


@pytest.mark.parametrize("doc", [{"a": 1}, {}, {"traceEvents": None}])
def test_json_that_is_not_a_trace(tmp_path, doc):
    p = tmp_path / "other.json"
    p.write_text(json.dumps(doc))
    msg = _error(p)
    assert "traceEvents" in msg and "not a PyTorch profiler trace" in msg


@pytest.mark.parametrize("value", [{"x": 1}, "events", 42])
def test_trace_events_not_a_list(tmp_path, value):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": value}))
    assert "'traceEvents' is not a list" in _error(p)


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(b"\x1f\x8b\x08\x00" + b"\xde\xad\xbe\xef" * 64)
    assert "corrupt gzip" in _error(p)


def test_input_error_carries_path_and_problem(tmp_path):
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    with pytest.raises(InputError) as exc:
        load_trace(p)
    assert exc.value.path == str(p) and exc.value.problem == "empty file"


def test_parse_trace_bytes_directly():
    b = small_builder(steps=1)
    model = parse_trace_bytes(json.dumps(b.to_dict()).encode(), Path("mem.json"))
    assert len(model.kernels) == 5
    assert model.meta.path == "mem.json"
    assert model.meta.bytes_total > 0


def test_many_events_across_chunks(load_built, monkeypatch):
    """Chunked decoding must neither drop nor duplicate events at chunk borders."""
    from gpuadvise.analyzer.read import chunks

    monkeypatch.setattr(chunks, "CHUNK_EVENTS", 7)
    b = small_builder(steps=4, kernels=9)
    d = b.to_dict()
    d["traceEvents"].insert(20, {"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "dur": 1.0})
    model = load_built(d)
    assert len(model.kernels) == 36
    assert model.meta.events_skipped == 1
    assert model.kernels["ts"].notna().all()
    assert model.kernels["correlation"].is_unique

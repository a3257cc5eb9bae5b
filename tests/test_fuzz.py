"""Fuzzing the trace reader and everything behind it.

Property, for every input: loading it, analysing it and rendering it in all three formats either gives a
clean report or raises `InputError` with a one-line message. Any other exception is a bug, and so is a
rule that fails (the engine turns a rule's exception into a "rule … failed" note, which would hide it),
and so is a control character from a trace name reaching the text or markdown report.

- `test_generated_traces`: Kineto-like documents built from scratch: events with random subsets of the
  fields, of random types, in real and junk categories, under random headers; sometimes a bare list,
  sometimes with Python's NaN/Infinity tokens.
- `test_generated_bytes`: arbitrary bytes, and JSON-ish byte soup.
- `test_mutated_real_trace`: a real trace (the HTA alexnet trace from the shared corpus, or a builder
  fixture when the corpus is absent) cut at a random byte, with fields deleted, values swapped for other
  types, bytes flipped, ranges dropped or repeated; plain and gzipped.
- `test_corpus_truncated`: every trace of the shared corpus (holdout included; `GPUADVISE_TRACES`
  overrides the folder) cut at 10 %, 50 % and 90 % of its JSON bytes is salvaged with a note saying so,
  or refused with a one-line `InputError`.

Budget: the four property tests take about 20 s of CPU together in the everyday suite (a few hundred
examples each: every run draws new ones), the corpus cuts about 50 s; `--hypothesis-profile=thorough` runs
ten times as many examples, for a fuzzing session (tests/_hypothesis_support.py).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from _cli_support import REPO, is_corpus_trace
from _hypothesis_support import examples
from gpuadvise.analyzer.report import json as render_json
from gpuadvise.analyzer.report import markdown as render_markdown
from gpuadvise.analyzer.report import text as render_text
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.read.loader import load_trace, parse_trace_bytes
from gpuadvise.rules import find_rule

pytestmark = pytest.mark.slow  # fuzzing, and the whole corpus cut three ways
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
ALEXNET = TRACES / "hta/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"


def fuzz_settings(n: int):
    return settings(max_examples=examples(n), deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


# ---------------------------------------------------------------------------------------------------
# the property


def check(data: bytes, name: str = "fuzz.json") -> str:
    """Parse bytes as a trace, analyse, render. Returns "report" or "refused"; anything else raises."""
    try:
        model = parse_trace_bytes(data, Path(name))
    except InputError as exc:
        return _refused(exc)
    return _report(model, name)


def check_file(data: bytes, name: str) -> str:
    """The same through load_trace (the gzip reader too), from a real file."""
    with tempfile.TemporaryDirectory(prefix="gpuadvise-fuzz-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(data)
        try:
            model = load_trace(path)
        except InputError as exc:
            return _refused(exc)
        return _report(model, name)


def _refused(exc: InputError) -> str:
    msg = str(exc)
    assert msg and "\n" not in msg, f"an InputError message must be one line: {msg!r}"
    return "refused"


def _report(model, name: str) -> str:
    report = analyze_model(model, source=name)
    failed = [n for n in report.notes if "failed:" in n]
    assert not failed, f"a rule crashed on this input: {failed}"
    text = render_text.render([report])
    md = render_markdown.render([report])
    doc = json.loads(render_json.render([report]))
    assert doc["tool"] == "gpuadvise"
    for what, out in (("text", text), ("markdown", md)):
        bad = CONTROL.findall(out)
        assert not bad, f"control characters reach the {what} report: {bad[:5]!r}"
    return "report"


# ---------------------------------------------------------------------------------------------------
# strategies: Kineto-like traces

REAL_CATS = ["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation",
             "gpu_user_annotation", "python_function", "cuda_sync", "cpu_instant_event", "cuda_profiler_range",
             "overhead", "ac2g", "fwdbwd", "Trace", "Kernel", "Memcpy", "Memset", "Runtime", "Operator",
             "", "collective_comm"]
NAMES = ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#", "ProfilerStep#-1",
         "ProfilerStep#99999999999999999999", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "aten::mm", "aten::linear",
         "aten::conv2d", "aten::_local_scalar_dense", "aten::item", "aten::to", "aten::copy_",
         "Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad",
         "cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy",
         "cudaEventSynchronize", "hipLaunchKernel", "hipMemcpyWithStream", "cudaMalloc", "cudaFree",
         "ampere_sgemm_128x64_nn", "volta_sgemm_64x64_nn", "sm90_xmma_gemm_bf16", "ncclDevKernel_AllReduce",
         "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)", "Memset (Device)",
         "[memory]", "process_name", "thread_name", "Iteration Start: PyTorch Profiler",
         "void at::native::vectorized_elementwise_kernel<4, float>", "train.py(12): <module>"]

finite = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False, allow_infinity=False)
small_int = st.integers(min_value=-5, max_value=2**40)
junk = st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                 st.integers(min_value=-(2**70), max_value=2**70))
nonfinite = st.sampled_from([math.nan, math.inf, -math.inf])


def value(base, nan_ok: bool):
    """Mostly `base`, sometimes junk of another type, sometimes (when allowed) NaN/Infinity."""
    options = [base, base, base, junk]
    if nan_ok:
        options.append(nonfinite)
    return st.one_of(*options)


# The strategies are built once per nan_ok and reused: building one validates it, which cost more than
# drawing from it when every event built its own.
@functools.cache
def time_values(nan_ok: bool):
    return value(st.one_of(st.floats(min_value=0, max_value=5e4, allow_nan=False), st.integers(0, 50_000),
                           st.sampled_from(["1012.5", "soon", "-3"]), st.just(1.7e12)), nan_ok)


ident = st.one_of(st.integers(0, 8), st.sampled_from(["7", "stream 7", "stream 7 ", "1234", "gpu", "-1", ""]),
                  st.just(2**63), st.integers(-3, -1))

ARG_KEYS = {
    "correlation": st.integers(0, 40), "External id": st.integers(0, 40), "external id": st.integers(0, 40),
    "stream": ident, "device": ident, "bytes": st.integers(0, 2**32), "Bytes": st.integers(-(2**30), 2**30),
    "Total Allocated": st.integers(0, 2**36), "Total Reserved": st.integers(0, 2**36), "Device Type": st.integers(0, 2),
    "Device Id": st.integers(-1, 2), "Addr": st.integers(0, 2**48), "Python id": st.integers(0, 40),
    "Python parent id": st.integers(0, 40),
    "Input type": st.lists(st.sampled_from(["float", "c10::Half", "c10::BFloat16", "", "Scalar"]), max_size=3),
    "Input Dims": st.lists(st.lists(st.integers(0, 4096), max_size=3), max_size=3),
    "Call stack": st.sampled_from(["train.py(12): <module>", "/usr/lib/python3/site-packages/torch/x.py(1): f;train.py(3): g", ""]),
    "name": st.sampled_from(["python", "GPU 0", "thread 1 (python)"]),
    "labels": st.text(max_size=5),
}
arg_keys = st.lists(st.sampled_from(sorted(ARG_KEYS)), max_size=6, unique=True)


@functools.cache
def arg_values(nan_ok: bool) -> dict:
    return {k: value(s, nan_ok) for k, s in ARG_KEYS.items()}


@st.composite
def args(draw, nan_ok: bool):
    if draw(st.integers(0, 9)) == 0:
        return draw(junk)
    values = arg_values(nan_ok)
    return {k: draw(values[k]) for k in draw(arg_keys)}


@functools.cache
def event_fields(nan_ok: bool) -> dict:
    return {
        "ph": st.sampled_from(["X", "X", "X", "i", "M", "f", "s", "B", "E", ""]),
        "cat": st.one_of(st.sampled_from(REAL_CATS), st.text(max_size=6), junk),
        "name": st.one_of(st.sampled_from(NAMES), st.text(max_size=12), junk),
        "pid": ident, "tid": ident,
        "ts": time_values(nan_ok), "dur": time_values(nan_ok),
        "args": args(nan_ok),
        "s": st.just("t"), "id": st.integers(0, 40), "bp": st.just("e"),
    }


@functools.cache
def field_subsets(nan_ok: bool):
    fields = list(event_fields(nan_ok))
    return st.lists(st.sampled_from(fields), min_size=0, max_size=len(fields), unique=True)


@st.composite
def event(draw, nan_ok: bool):
    fields = event_fields(nan_ok)
    keep = draw(field_subsets(nan_ok))
    # most events carry the core fields, so that the analysis (not just the loader) gets exercised
    if draw(st.integers(0, 3)):
        keep = list(dict.fromkeys(["ph", "cat", "name", "ts", "dur", "pid", "tid", "args", *keep]))
    ev = {}
    for k in keep:
        ev[k] = draw(fields[k])
    return ev


@functools.cache
def header_values(nan_ok: bool) -> dict:
    return {
        "id": value(st.integers(0, 3), nan_ok),
        "name": st.one_of(st.sampled_from(["NVIDIA A100-SXM4-80GB", "Tesla V100", "AMD Instinct MI300X",
                                           "Quadro GP100", ""]), junk),
        "computeMajor": value(st.integers(0, 12), nan_ok),
        "computeMinor": value(st.integers(0, 9), nan_ok),
        "totalGlobalMem": value(st.integers(0, 2**37), nan_ok),
        "numSms": value(st.integers(0, 200), nan_ok),
        "distributedInfo": st.one_of(
            st.fixed_dictionaries({"rank": value(st.integers(0, 8), nan_ok), "world_size": value(st.integers(1, 8), nan_ok)}),
            junk),
    }


header_scalar = st.one_of(st.integers(0, 13000), junk)


@st.composite
def header(draw, nan_ok: bool):
    h = {}
    values = header_values(nan_ok)
    if draw(st.booleans()):
        prop = {k: draw(values[k]) for k in ("id", "name", "computeMajor", "computeMinor", "totalGlobalMem", "numSms")}
        h[draw(st.sampled_from(["deviceProperties", "computeProperties"]))] = draw(
            st.one_of(st.just([prop]), st.just(prop), junk))
    if draw(st.booleans()):
        h["distributedInfo"] = draw(values["distributedInfo"])
    for key in ("schemaVersion", "cuda_runtime_version", "hip_runtime_version", "cupti_version", "record_shapes",
                "with_stack", "baseTimeNanoseconds", "displayTimeUnit"):
        if draw(st.integers(0, 3)) == 0:
            h[key] = draw(header_scalar)
    return h


@st.composite
def kineto_document(draw) -> bytes:
    nan_ok = draw(st.integers(0, 4)) == 0  # Python's json.dumps writes NaN/Infinity tokens
    events = draw(st.lists(event(nan_ok), max_size=30))
    if draw(st.integers(0, 2)) == 0:  # a recognisable training step around a share of them
        events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                       "ts": 0, "dur": 60_000})
    shape = draw(st.sampled_from(["document", "document", "bare-list", "events-not-a-list"]))
    if shape == "bare-list":
        doc = events
    else:
        doc = draw(header(nan_ok))
        doc["traceEvents"] = events if shape == "document" else draw(junk)
        if draw(st.booleans()):  # header keys after the events, as some writers put them
            doc = dict(sorted(doc.items(), key=lambda kv: kv[0] == "traceEvents"))
    return json.dumps(doc, allow_nan=True).encode()


@fuzz_settings(300)
@given(kineto_document())
def test_generated_traces_load(data):
    """The loader alone (fast): parsed into a model, or refused with a one-line InputError."""
    try:
        parse_trace_bytes(data, Path("fuzz.json"))
    except InputError as exc:
        _refused(exc)


# A runtime call that launches nothing, beside a kernel without a duration: the replay once indexed the
# calls' stall times with no call to index (low-gpu-utilization crashed).
NO_CALL_TO_INDEX = json.dumps({"traceEvents": [
    {"ph": "X", "cat": "cuda_runtime", "name": "ProfilerStep#0", "ts": 0.0, "dur": 1.7e12, "pid": 0, "tid": 0, "args": None},
    {"ph": "X", "cat": "kernel", "name": "ProfilerStep#0", "pid": 0, "tid": 0, "ts": 0.0},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 60000}]}).encode()


@fuzz_settings(150)
@given(kineto_document())
@example(NO_CALL_TO_INDEX)
def test_generated_traces(data):
    """The whole pipeline (about 0.1 s an example): load, analyse, render in the three formats."""
    check(data)


@st.composite
def byte_soup(draw) -> bytes:
    pieces = [b"{", b"}", b"[", b"]", b",", b":", b'"traceEvents"', b'"ph"', b'"X"', b'"cat"', b'"kernel"',
              b'"name"', b'"ts"', b'"dur"', b"1", b"-2.5e3", b"NaN", b"null", b"true", b'"', b"\\", b"\\u0000",
              b"\\ud800", b"\xff", b"\xc3", b"\x00", b" ", b"\n", b"\xef\xbb\xbf"]
    return b"".join(draw(st.lists(st.sampled_from(pieces), max_size=60)))


@fuzz_settings(700)
@given(st.one_of(st.binary(max_size=200), byte_soup()))
def test_generated_bytes(data):
    check(data)


# ---------------------------------------------------------------------------------------------------
# mutations of a real trace


def _base() -> tuple[bytes, dict, str]:
    if ALEXNET.is_file():
        raw = gzip.decompress(ALEXNET.read_bytes())
        return raw, json.loads(raw), "alexnet"
    doc = find_rule("dataloader-stall").positive().to_dict()
    return json.dumps(doc).encode(), doc, "builder"


BASE_BYTES, BASE_DOC, BASE_NAME = _base()
N_EVENTS = len(BASE_DOC["traceEvents"])


KINDS = ["truncate", "flip", "delete-field", "swap-type", "drop-range", "repeat-range", "gz-truncate", "gz-flip"]


@st.composite
def mutation(draw) -> tuple:
    """A short recipe (so that a failing example prints in a few lines); `apply` turns it into bytes."""
    n = len(BASE_BYTES)
    kind = draw(st.sampled_from(KINDS))
    if kind == "truncate":
        return kind, draw(st.integers(0, n))
    if kind == "flip":
        return kind, draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 255)), min_size=1, max_size=5))
    if kind in ("drop-range", "repeat-range"):
        return kind, draw(st.integers(0, n - 1)), draw(st.integers(1, 4096))
    if kind in ("delete-field", "swap-type"):
        edits = st.tuples(st.integers(0, N_EVENTS - 1), st.booleans(), st.integers(0, 50),
                          st.one_of(junk, nonfinite, st.text(max_size=10), finite))
        return kind, draw(st.lists(edits, min_size=1, max_size=8))
    return kind, draw(st.integers(0, 10**9)), draw(st.lists(st.integers(0, 255), min_size=1, max_size=3))


def apply(recipe: tuple) -> bytes:
    kind, *params = recipe
    raw = BASE_BYTES
    if kind == "truncate":
        return raw[: params[0]]
    if kind == "flip":
        b = bytearray(raw)
        for pos, byte in params[0]:
            b[pos] = byte
        return bytes(b)
    if kind in ("drop-range", "repeat-range"):
        i, length = params
        j = min(len(raw), i + length)
        return raw[:i] + raw[j:] if kind == "drop-range" else raw[:j] + raw[i:j] + raw[j:]
    if kind in ("delete-field", "swap-type"):
        doc = json.loads(raw)
        for index, in_args, key_no, new in params[0]:
            e = doc["traceEvents"][index]
            if not isinstance(e, dict) or not e:
                continue
            target = e["args"] if in_args and isinstance(e.get("args"), dict) and e["args"] else e
            key = sorted(target)[key_no % len(target)]
            if kind == "delete-field":
                del target[key]
            else:
                target[key] = new
        return json.dumps(doc, allow_nan=True).encode()
    at, bytes_ = params  # gz-truncate / gz-flip: damage the compressed stream
    gz = bytearray(GZ_BYTES)
    if kind == "gz-truncate":
        return bytes(gz[: at % (len(gz) + 1)])
    for k, byte in enumerate(bytes_):
        gz[(at + k * 7919) % len(gz)] = byte
    return bytes(gz)


GZ_BYTES = gzip.compress(BASE_BYTES, 6)


@fuzz_settings(80)
@given(mutation())
def test_mutated_real_trace(recipe):
    data = apply(recipe)
    if recipe[0].startswith("gz"):
        check_file(data, f"{BASE_NAME}.json.gz")
    else:
        check(data, f"{BASE_NAME}.json")


def test_unmutated_base_gives_a_report():
    """The fuzz base itself must analyse cleanly, or every mutation above tests nothing."""
    assert check(BASE_BYTES, f"{BASE_NAME}.json") == "report"


# ---------------------------------------------------------------------------------------------------
# the corpus, cut short


def _corpus() -> list[str]:
    if not TRACES.is_dir():
        return []
    files = [p for p in TRACES.rglob("*") if is_corpus_trace(p)]
    return sorted(p.relative_to(TRACES).as_posix() for p in files)


CORPUS = _corpus()
_JSON_CACHE: dict[str, bytes] = {}


def _json_bytes(rel: str) -> bytes:
    if rel not in _JSON_CACHE:
        _JSON_CACHE.clear()  # one file at a time: the biggest inflates to ~60 MB
        path = TRACES / rel
        raw = path.read_bytes()
        _JSON_CACHE[rel] = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    return _JSON_CACHE[rel]


CUTS = (10, 50, 90)  # % of the JSON bytes kept
# Every file is cut at one of CUTS in turn (neighbours at different points: each point covers a third of
# the corpus); under `--hypothesis-profile=thorough` every file at all three.
TRUNCATIONS = [(rel, pct) for i, rel in enumerate(CORPUS or ["-"])
               for pct in (CUTS if examples(1) > 1 else CUTS[i % len(CUTS):][:1])]


@pytest.mark.skipif(not CORPUS, reason=f"trace corpus not found at {TRACES} (set GPUADVISE_TRACES to its folder)")
@pytest.mark.parametrize(("rel", "pct"), TRUNCATIONS)
def test_corpus_truncated(tmp_path, rel, pct):
    """Cut at pct % of the JSON bytes (as a crashed writer leaves it), written as plain JSON, and read
    through the whole pipeline: salvaged with a note that says so, or refused in one line."""
    data = _json_bytes(rel)
    cut = tmp_path / (Path(rel).name.removesuffix(".gz").removesuffix(".json") + f".cut{pct}.json")
    cut.write_bytes(data[: len(data) * pct // 100])
    try:
        reports = analyze_paths([str(cut)])
    except InputError as exc:
        msg = str(exc)
        assert "\n" not in msg and str(cut) in msg, msg
        return
    (report,) = reports
    assert report.model.meta.truncated, "a cut file was read as if complete"
    assert any("cut off" in n for n in report.notes), f"no note says the trace was cut: {report.notes}"
    failed = [n for n in report.notes if "failed:" in n]
    assert not failed, failed
    for render in (render_text.render, render_markdown.render):
        render(reports)
    json.loads(render_json.render(reports))

"""The compiled events scanner (`_jsonscan.scan`) against msgspec, the exact path it stands in for.

`scan(buf)` turns one JSON array of Kineto events into flat columns, or answers None ("use the slow,
exact path"). None is never wrong; a result that differs from what `msgspec.json.Decoder(list[Event])`
puts in the structs always is. So every test here goes through `expected`, which decodes the same bytes
with msgspec and checks each column against the structs, to the bit for floats.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pathlib
import re
import struct
import sys

import msgspec
import numpy as np
import pytest
from _hypothesis_support import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_jsonscan = pytest.importorskip("gpuadvise.analyzer.read._jsonscan")

from gpuadvise.analyzer.read import chunks  # noqa: E402
from gpuadvise.analyzer.read.events import HEADER, Event  # noqa: E402

scan = _jsonscan.scan
DECODER = msgspec.json.Decoder(list[Event])
# the shared trace corpus, as the corpus tests find it
TRACES = pathlib.Path(os.environ.get("GPUADVISE_TRACES") or pathlib.Path(__file__).resolve().parents[2] / "shared" / "traces")

# column ← JSON key inside args
NUM_ARGS = {
    "correlation": "correlation", "external_id": "External id", "external_id_legacy": "external id",
    "stream": "stream", "device": "device", "nbytes": "bytes", "mem_bytes": "Bytes",
    "total_allocated": "Total Allocated", "total_reserved": "Total Reserved", "device_type": "Device Type",
    "device_id": "Device Id", "addr": "Addr", "python_id": "Python id", "python_parent_id": "Python parent id",
    "sequence_number": "Sequence number", "group_size": "Group size", "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems", "comm_seq": "Seq", "graph_id": "graph id", "graph_node_id": "graph node id",
}
RAW_ARGS = {"input_type": "Input type", "input_dims": "Input Dims", "input_concrete": "Concrete Inputs",
            "comms_id": "Comms Id"}  # msgspec.Raw fields
ANY_ARGS = {  # Any fields; the struct attribute of meta_name is `name`
    "call_stack": "Call stack", "collective_name": "Collective name", "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description", "pg_ranks": "Process Group Ranks",
    "dtype": "dtype", "meta_name": "name", "labels": "labels",
}
ATTR = {"meta_name": "name"}
INT32 = ["ph", "cat", "name", "pid_raw", "tid_raw", *RAW_ARGS, *ANY_ARGS]
ALL_COLUMNS = {
    "ph": "i4", "cat": "i4", "name": "i4", "pid": "i8", "pid_raw": "i4", "tid": "i8", "tid_raw": "i4",
    "ts": "f8", "dur": "f8", "has_args": "i1",
    **{c: "f8" for c in NUM_ARGS}, **{c: "i4" for c in RAW_ARGS}, **{c: "i4" for c in ANY_ARGS},
}
MISSING = {"i4": -1, "i8": 0, "f8": math.nan, "i1": 0}


def _bits(x) -> bytes:
    return np.float64(math.nan if x is None else float(x)).tobytes()


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def expected(buf):
    """scan(buf), checked against msgspec: None, or columns equal to what msgspec's structs hold."""
    got = scan(buf)
    try:
        events, error = DECODER.decode(buf), None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as e:
        events, error = None, e
    if got is None:
        return None
    n, cols, raws = got
    assert isinstance(n, int) and isinstance(cols, dict) and isinstance(raws, list)
    assert set(cols) <= set(ALL_COLUMNS), set(cols) - set(ALL_COLUMNS)
    arrays = {}
    for name, dtype in ALL_COLUMNS.items():
        if name in cols:
            assert isinstance(cols[name], bytes)
            arrays[name] = np.frombuffer(cols[name], dtype=dtype)
            assert len(arrays[name]) == n, name
        else:
            missing = -2 if name in ("pid_raw", "tid_raw") else MISSING[dtype]
            arrays[name] = np.full(n, missing, dtype=dtype)
    assert all(isinstance(r, bytes) for r in raws)
    assert len(set(raws)) == len(raws), "the same text got two ids"
    used = set()
    for name in INT32:
        ids = arrays[name]
        assert ((ids >= -2) & (ids < len(raws))).all(), name
        used.update(int(i) for i in ids if i >= 0)
    assert used == set(range(len(raws))), "a raw text no column refers to"
    if error is not None:
        # The one accepted disagreement: text msgspec decodes into str is not UTF-8. The caller decodes the
        # raw texts it uses and falls back then.
        decoded = ["ph", "cat", "name", "pid_raw", "tid_raw", *ANY_ARGS]
        assert isinstance(error, UnicodeDecodeError), f"scan accepted what msgspec rejects: {error!r}"
        assert any(not _utf8(raws[i]) for c in decoded for i in arrays[c] if i >= 0), error
        return got
    assert n == len(events)

    def raw_any(col, i, value, default):
        rid = int(arrays[col][i])
        if rid == -1:
            assert value == default, (col, i, value)
        else:
            assert type(msgspec.json.decode(raws[rid])) is type(value), (col, i)
            assert msgspec.json.decode(raws[rid]) == value, (col, i, raws[rid], value)

    for i, ev in enumerate(events):
        raw_any("ph", i, ev.ph, "")
        raw_any("cat", i, ev.cat, "")
        raw_any("name", i, ev.name, "")
        for key in ("pid", "tid"):
            value, rid, v = getattr(ev, key), int(arrays[key + "_raw"][i]), int(arrays[key][i])
            if rid == -2:
                assert value is None and v == 0, (key, i, value)
            elif rid == -1:
                assert type(value) is int and value == v, (key, i, value, v)
            else:
                assert type(value) is str and msgspec.json.decode(raws[rid]) == value and v == 0, (key, i)
        assert arrays["ts"][i].tobytes() == _bits(ev.ts), (i, ev.ts)
        assert arrays["dur"][i].tobytes() == _bits(ev.dur), (i, ev.dur)
        assert int(arrays["has_args"][i]) == (ev.args is not None), i
        a = ev.args
        for col, key in NUM_ARGS.items():
            value = None if a is None else getattr(a, col)
            assert arrays[col][i].tobytes() == _bits(value), (col, i, value)
        for col in RAW_ARGS:
            rid = int(arrays[col][i])
            value = b"null" if a is None else bytes(getattr(a, col))
            if rid == -1:
                assert value == b"null", (col, i)  # absent: msgspec's default Raw(b"null")
            else:
                assert raws[rid] == value, (col, i, raws[rid], value)
        for col in ANY_ARGS:
            raw_any(col, i, None if a is None else getattr(a, ATTR.get(col, col)), None)
    return got


# ---------------------------------------------------------------------------------------------------
# real traces


def _trace_files():
    if not TRACES.is_dir():
        return []
    return sorted(p for p in TRACES.rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file())


PREFIX = 2 << 20  # bytes read from each file: the first pieces are what is compared
_ARRAY = re.compile(rb'"traceEvents"\s*:\s*\[')


def _events_pieces(path: pathlib.Path, monkeypatch):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read(PREFIX + 1)
    whole = len(data) <= PREFIX
    if whole:
        try:
            array = HEADER.decode(data).traceEvents
        except msgspec.DecodeError:
            array = msgspec.Raw(data) if data.lstrip()[:1] == b"[" else msgspec.Raw(b"null")
        if bytes(array) == b"null":
            return []
        mv = memoryview(array)
        lo, hi = None, None
    else:  # a long file: the array's start (a piece cut short at the end of it must be refused by both)
        m = _ARRAY.search(data)
        if m is None:
            return []
        mv, lo, hi = memoryview(data), m.end(), len(data)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 32 << 10)  # small pieces, cut by the reader's own cutter
    pieces = []
    for piece in chunks.array_chunks(mv, lo, hi):
        pieces.append(piece)
        if len(pieces) == 2:
            break
    return pieces


@pytest.mark.skipif(not _trace_files(), reason="no shared trace corpus")
def test_scan_agrees_with_msgspec_on_real_traces(monkeypatch):
    files = 0
    for path in _trace_files():
        pieces = _events_pieces(path, monkeypatch)
        files += bool(pieces)
        for piece in pieces:
            got = expected(piece)
            try:
                DECODER.decode(piece)
                ok = True
            except (msgspec.DecodeError, UnicodeDecodeError):
                ok = False
            # real events are exactly what the scanner is for: it must not fall back on them
            assert got is not None or not ok, path
    assert files > 0


# ---------------------------------------------------------------------------------------------------
# hand-written edge cases


def one(event: bytes):
    """The single event `event` scanned (checked against msgspec); None when the scanner refused it."""
    return expected(b"[" + event + b"]")


def col(got, name, row=0):
    n, cols, raws = got
    if name not in cols:
        return None
    v = np.frombuffer(cols[name], dtype=ALL_COLUMNS[name])[row]
    return raws[v] if name in INT32 and v >= 0 else v.item()


def test_a_typical_event_lands_in_every_column():
    got = one(
        b'{"ph":"X","cat":"kernel","name":"k<1>","pid":0,"tid":"stream 7","ts":1661938466265032.5,"dur":25,'
        b'"args":{"correlation":12,"External id":3,"external id":4,"stream":7,"device":0,"bytes":1e3,'
        b'"Bytes":-5,"Total Allocated":1.5,"Total Reserved":2.25,"Device Type":1,"Device Id":0,"Addr":140000000000,'
        b'"Python id":9,"Python parent id":8,"Sequence number":77,"Group size":8,"In msg nelems":1024,'
        b'"Out msg nelems":2048,"Seq":5,"Input type":["float", "int"],"Input Dims":[[1,2],[]],"Concrete Inputs":["", "1"],'
        b'"Call stack":"a;b","Collective name":"allreduce","Process Group Name":"0","dtype":"Float",'
        b'"Process Group Description":"mesh_dp","Process Group Ranks":"[0, 2]","Comms Id":18446744073709551557,'
        b'"graph id":3,"graph node id":41,'
        b'"name":"thread 1","labels":["x"],"other":{"deep":[1,2,{"x":null}]}}}'
    )
    assert got is not None
    n, cols, raws = got
    assert n == 1 and set(cols) == set(ALL_COLUMNS)
    assert col(got, "ph") == b'"X"' and col(got, "tid_raw") == b'"stream 7"' and col(got, "tid") == 0
    assert col(got, "pid") == 0 and col(got, "pid_raw") == -1  # -1: an integer
    assert col(got, "ts") == 1661938466265032.5 and col(got, "nbytes") == 1000.0
    assert col(got, "input_dims") == b"[[1,2],[]]" and col(got, "input_type") == b'["float", "int"]'
    assert col(got, "input_concrete") == b'["", "1"]'
    # a Comms Id beyond int64 stays its text; a graph's node is a number
    assert col(got, "comms_id") == b"18446744073709551557" and col(got, "graph_node_id") == 41.0


def test_raw_texts_are_shared_and_in_first_seen_order():
    got = expected(b'[{"cat":"a","name":"b"},{"cat":"b","name":"a","ph":"a"}, {"args":{"dtype":"a"}}]')
    n, cols, raws = got
    assert raws == [b'"a"', b'"b"']
    assert np.frombuffer(cols["cat"], "i4").tolist() == [0, 1, -1]
    assert np.frombuffer(cols["name"], "i4").tolist() == [1, 0, -1]
    assert np.frombuffer(cols["dtype"], "i4").tolist() == [-1, -1, 0]


def test_columns_that_are_all_missing_may_be_left_out():
    n, cols, raws = expected(b'[{"ph":"X"},{}]')
    assert n == 2 and raws == [b'"X"']
    assert np.frombuffer(cols["ph"], "i4").tolist() == [0, -1]
    assert "ts" not in cols or np.isnan(np.frombuffer(cols["ts"])).all()


@pytest.mark.parametrize("text", [b"[]", b" [ ] ", b"\t\r\n[\n]\n", b"[{}]", b"[ { } , {}\t]"])
def test_empty_arrays_and_whitespace_are_accepted(text):
    got = expected(text)
    assert got is not None and got[0] == text.count(b"{")


def test_negative_zero_follows_msgspec():
    # an integer literal: msgspec gives the int 0, which converts to +0.0; a float literal keeps its sign
    assert _bits(col(one(b'{"ts":-0}'), "ts")) == _bits(0.0)
    assert _bits(col(one(b'{"ts":-0.0}'), "ts")) == _bits(-0.0)
    assert _bits(col(one(b'{"args":{"stream":-0}}'), "stream")) == _bits(0.0)
    assert _bits(col(one(b'{"args":{"stream":-0e0}}'), "stream")) == _bits(-0.0)
    assert col(one(b'{"pid":-0}'), "pid") == 0


@pytest.mark.parametrize(
    "number", [b"1.5", b"0.1", b"1e5", b"1E+05", b"123.456e-7", b"1661938466265032.123", b"9007199254740993",
               b"9007199254740993.0", b"0.30000000000000004", b"4.9e-300", b"123456789012345678",
               b"-123456789012345678", b"12345678901234567.89e3", b"1.7976931348623157e300", b"-2.5E-3"],
)
def test_float_conversions_are_exact(number):
    # `expected` compares the bits with msgspec's
    got = one(b'{"ts":' + number + b',"dur":' + number + b',"args":{"Addr":' + number + b"}}")
    assert got is not None and col(got, "ts") == col(got, "addr") == float(number)


@pytest.mark.parametrize("number", [b"2.2250738585072014e-308", b"1.7976931348623157e308", b"5e-324", b"1e-305"])
def test_numbers_near_the_ends_of_the_double_range_are_left_to_msgspec(number):
    assert one(b'{"ts":' + number + b"}") is None


@pytest.mark.parametrize(
    "event",
    [
        b'{"ts":1e400}', b'{"ts":-1e400}', b'{"args":{"stream":1e400}}', b'{"cat":1e400}', b'{"name":[1e999]}',
        b'{"ts":1234567890123456789}', b'{"args":{"device":12345678901234567890}}', b'{"pid":1234567890123456789}',
        b'{"cat":12345678901234567890123}', b'{"ts":1' + b"0" * 400 + b'.0}',
    ],
)
def test_numbers_out_of_reach_answer_none(event):
    assert one(event) is None


def test_eighteen_digit_integers_are_read_exactly():
    got = one(b'{"pid":123456789012345678,"tid":-123456789012345678,"ts":999999999999999999}')
    assert col(got, "pid") == 123456789012345678 and col(got, "tid") == -123456789012345678
    assert col(got, "ts") == float(999999999999999999)


def test_out_of_range_numbers_in_skipped_values_are_fine():
    # msgspec only checks the grammar of what it skips (unknown keys, Raw fields)
    got = one(b'{"x":1e400,"y":[123456789012345678901234567890],"args":{"Input Dims":[1e999],"z":-1e400}}')
    assert got is not None and col(got, "input_dims") == b"[1e999]"


@pytest.mark.parametrize(
    "literal", [b"01", b"-01", b"1.", b".5", b"-", b"+1", b"1e", b"1e+", b"NaN", b"Infinity", b"-Infinity",
                b"0x10", b"1.5.3", b"--1", b"tru", b"nul", b"fals", b"True", b"None", b"'a'", b"1_000"],
)
@pytest.mark.parametrize("key", [b'"ts"', b'"x"', b'"cat"', b'"pid"'])
def test_malformed_literals_answer_none(literal, key):
    assert one(b"{" + key + b":" + literal + b"}") is None
    assert one(b'{"args":{"Input Dims":[' + literal + b"]}}") is None


def test_escapes_in_values_are_validated_and_kept_raw():
    got = one(rb'{"name":"a\"b\\c\/d\b\f\n\r\t\u00e9\u20AC","cat":"\u0000"}')
    assert col(got, "name") == rb'"a\"b\\c\/d\b\f\n\r\t\u00e9\u20AC"'
    assert one(rb'{"name":"\x"}') is None
    assert one(rb'{"name":"\u00g0"}') is None
    assert one(rb'{"x":"\u12"}') is None
    assert one(rb'{"x":"\'"}') is None


@pytest.mark.parametrize("escape", [rb"\ud800", rb"\uDFFF", rb"\ud83d\ude00", rb"\udc00\ud800"])
@pytest.mark.parametrize("key", [b'"name"', b'"x"', b'"args"'])
def test_surrogate_escapes_answer_none(escape, key):
    value = b'"' + escape + b'"'
    if key == b'"args"':
        value = b'{"Input type":' + value + b"}"
    assert one(b"{" + key + b":" + value + b"}") is None


@pytest.mark.parametrize("byte", [0, 1, 0x09, 0x0A, 0x0D, 0x1F])
def test_control_bytes_inside_strings_answer_none(byte):
    c = bytes([byte])
    assert one(b'{"name":"a' + c + b'b"}') is None
    assert one(b'{"x":"' + c + b'"}') is None
    assert one(b'{"k' + c + b'":1}') is None


def test_bytes_above_ascii_pass_raw():
    got = one(b'{"x":"\xff","args":{"Input type":"\xc3\xa9\xff"},"name":"\xc3\xa9"}')
    assert col(got, "input_type") == b'"\xc3\xa9\xff"' and col(got, "name") == '"é"'.encode()
    # msgspec fails on the str it decodes; the scanner hands the text on, the caller decodes it
    got = scan(b'[{"cat":"\xff"}]')
    assert got is not None and got[2] == [b'"\xff"']
    expected(b'[{"cat":"\xff"}]')


def test_keys_with_escapes_answer_none():
    assert one(rb'{"\u0070h":"X"}') is None  # msgspec reads it as "ph"
    assert one(rb'{"x\n":1}') is None
    assert one(rb'{"args":{"Seq\u0020":1}}') is None
    assert one(rb'{"x":{"\u0070h":1}}') is not None  # keys inside skipped values are just strings


@pytest.mark.parametrize(
    "event",
    [b'{"ph":"X","ph":"Y"}', b'{"cat":1,"cat":1}', b'{"ts":1,"ts":1}', b'{"args":null,"args":{}}',
     b'{"pid":1,"pid":null}', b'{"args":{"stream":1,"stream":2}}', b'{"args":{"name":"a","name":"a"}}',
     b'{"args":{"Input Dims":[],"Input Dims":[]}}'],
)
def test_recognised_keys_twice_answer_none(event):
    assert one(event) is None


def test_unrecognised_keys_twice_are_fine():
    got = one(b'{"x":1,"x":"2","args":{"y":[],"y":{}},"ph":"i","External id":5}')
    assert got is not None and col(got, "ph") == b'"i"'
    assert "external_id" not in got[1]  # "External id" counts only inside args


def test_keys_match_case_sensitively():
    got = one(b'{"args":{"External id":1,"external id":2,"bytes":3,"Bytes":4,"Name":"no"}}')
    assert (col(got, "external_id"), col(got, "external_id_legacy")) == (1.0, 2.0)
    assert (col(got, "nbytes"), col(got, "mem_bytes")) == (3.0, 4.0)
    assert "meta_name" not in got[1]
    assert one(b'{"PH":"X","Ts":1}') is not None


def test_args_null_is_no_args_and_args_of_another_type_answers_none():
    got = one(b'{"args":null}')
    assert col(got, "has_args") in (None, 0)
    got = one(b'{"args":{}}')
    assert col(got, "has_args") == 1
    for value in (b"[]", b"1", b'"a"', b"true", b"[{}]"):
        assert one(b'{"args":' + value + b"}") is None


@pytest.mark.parametrize("value", [b'"1"', b"true", b"[1]", b'{"a":1}'])
def test_numeric_fields_of_another_type_answer_none(value):
    assert one(b'{"ts":' + value + b"}") is None
    assert one(b'{"args":{"correlation":' + value + b"}}") is None


def test_ph_must_be_a_string():
    for value in (b"null", b"1", b"[]", b"{}", b"true"):
        assert one(b'{"ph":' + value + b"}") is None
    assert col(one(b'{"ph":""}'), "ph") == b'""'


def test_cat_and_name_take_any_value():
    for value in (b"null", b"1", b"-2.5", b"[1, [2]]", b'{"a": {"b": null}}', b"true", b'"s"'):
        got = one(b'{"cat":' + value + b',"name":' + value + b"}")
        assert col(got, "cat") == value and col(got, "name") == value


def test_pid_float_answers_none_and_pid_string_gets_a_raw_id():
    for value in (b"1.0", b"1e3", b"true", b"[]", b"{}", b"-0.0"):
        assert one(b'{"pid":' + value + b"}") is None
        assert one(b'{"tid":' + value + b"}") is None
    got = one(b'{"pid":"rank 0","tid":null}')
    assert col(got, "pid_raw") == b'"rank 0"' and col(got, "pid") == 0
    assert np.frombuffer(got[1].get("tid_raw", struct.pack("i", -2)), "i4")[0] == -2


def test_null_in_a_raw_arg_gets_the_id_of_null():
    got = one(b'{"args":{"Input type":null,"labels":null,"stream":null}}')
    assert col(got, "input_type") == b"null" and col(got, "labels") == b"null"
    assert math.isnan(col(got, "stream") if "stream" in got[1] else math.nan)


def test_nested_skipped_values_are_validated():
    assert one(b'{"x":[[[[{"a":[1,{"b":[]}]}]]]]}') is not None
    assert one(b'{"x":[1,]}') is None
    assert one(b'{"x":[1 2]}') is None
    assert one(b'{"x":{"a" 1}}') is None
    assert one(b'{"x":{"a":1,}}') is None
    assert one(b'{"x":{1:1}}') is None
    assert one(b'{"x":[' * 10 + b"]" * 10 + b"}") is None  # unbalanced
    assert one(b'{"x":' + b"[" * 100 + b"]" * 100 + b"}") is not None
    assert one(b'{"x":' + b"[" * 5000 + b"]" * 5000 + b"}") is None  # too deep: left to the slow path


def test_nesting_allowed_follows_the_recursion_limit():
    # msgspec's RecursionError comes sooner when less of the recursion limit is left: so does the None
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    texts = [b'[{"x":' + b"[" * d + b"]" * d + b',"cat":' + b"[" * d + b"]" * d + b"}]" for d in (5, 20, 40, 70, 100, 300)]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 80)
    try:
        results = [expected(text) for text in texts]
    finally:
        sys.setrecursionlimit(old)
    assert results[0] is not None and results[-1] is None
    assert [expected(text) is not None for text in texts] == [True] * 5 + [False] * 1


@pytest.mark.parametrize(
    "text",
    [b"", b" ", b"[", b"]", b"{}", b"[{}] x", b"[{}]\x0c", b"\xef\xbb\xbf[{}]", b"[{},]", b"[,{}]", b"[{}{}]",
     b"[1]", b"[null]", b'["a"]', b"[[]]", b"[{}] []", b'[{"a" 1}]', b'[{"a":}]', b'[{"a":1,}]', b'[{,}]',
     b"\x0b[]", b"[]\x00"],
)
def test_malformed_documents_answer_none(text):
    assert expected(text) is None


def test_truncation_at_every_byte_answers_none_or_agrees():
    text = (
        b'[ {"ph":"X","cat":"kernel","name":"k\\u00e9","pid":1,"tid":"t","ts":1.5e3,"dur":-0,'
        b'"args":{"stream":7,"Input Dims":[[1,2]],"labels":null,"x":[true,false,{"y":"z"}]}} ,\n{"ts":12} ]  '
    )
    assert expected(text) is not None
    for cut in range(len(text)):
        got = expected(text[:cut])
        if got is not None:  # only the trailing whitespace may go
            assert text[:cut].rstrip() == text.rstrip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
def test_never_reads_past_the_end_of_the_buffer():
    # every prefix of a few inputs placed right before an unreadable page: a read past the end crashes
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    texts = [
        b'[{"ph":"X","cat":"kernel","name":"void at::native::elementwise_kernel<128, 4>(int)","pid":1,'
        b'"tid":"stream 7","ts":1661938466265032.125,"dur":12345678,"args":{"External id":12,'
        b'"Input Dims":[[1,2],[3]],"Input type":["float",""],"x":"\\u00e9\\n","y":[true,false,null,-1.5e-3]}}]',
        b'[{"name":"' + b"a" * 40 + b'\\"' + b"b" * 17 + b'"},{"ts":1234567890123456,"dur":0.5}]  ',
    ]
    m = mmap.mmap(-1, 2 * page)
    anchor = ctypes.c_char.from_buffer(m)
    base = ctypes.addressof(anchor)
    assert libc.mprotect(base + page, page, 0) == 0  # PROT_NONE
    try:
        for text in texts:
            assert expected(text) is not None
            for cut in range(len(text) + 1):
                piece = text[:cut]
                m[page - cut : page] = piece
                with memoryview(m)[page - cut : page] as mv:
                    got = scan(mv)
                assert (got is None) == (scan(piece) is None)
    finally:
        assert libc.mprotect(base + page, page, mmap.PROT_READ | mmap.PROT_WRITE) == 0
        del anchor
        m.close()


def test_buffer_kinds():
    text = b'[{"ph":"X","ts":1.25,"args":{"Input Dims":[]}}]'
    want = expected(text)
    for buf in (bytearray(text), memoryview(bytearray(text)), memoryview(text), memoryview(b"  " + text)[2:]):
        got = scan(buf)
        assert got == want
    # the raw texts are copies: changing the buffer afterwards does not change them
    ba = bytearray(text)
    got = scan(memoryview(ba))
    ba[:] = b" " * len(ba)
    assert got == want
    with pytest.raises(TypeError):
        scan("not bytes")


def test_a_read_only_mmap_is_scanned_in_place(tmp_path):
    import mmap

    path = tmp_path / "events.json"
    path.write_bytes(b'[{"ph":"X","name":"a"},{"ph":"X","name":"b","ts":3}]')
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        with memoryview(m) as mv:
            got = expected(mv)
    assert got is not None and got[0] == 2 and got[2] == [b'"X"', b'"a"', b'"b"']


def test_many_events_and_many_distinct_texts():
    events = [
        {"ph": "X", "name": f"op{i}", "cat": "cpu_op", "pid": i % 7, "tid": f"t{i % 3}", "ts": i * 0.5,
         "dur": i, "args": {"External id": i, "Input Dims": [[i]]}}
        for i in range(20000)
    ]
    text = json.dumps(events).encode()
    got = scan(text)
    assert got is not None and got[0] == 20000
    n, cols, raws = got
    names = np.frombuffer(cols["name"], "i4")
    assert [raws[i] for i in names[:3]] == [b'"op0"', b'"op1"', b'"op2"']
    assert raws[names[-1]] == b'"op19999"'
    assert np.array_equal(np.frombuffer(cols["ts"]), np.arange(20000) * 0.5)
    assert np.array_equal(np.frombuffer(cols["pid"], "i8"), np.arange(20000) % 7)
    expected(json.dumps(events[:500]).encode())


def test_threads_scan_at_once_and_agree():
    # the parse runs without the GIL; each call has its own buffers (one set is kept between calls)
    from concurrent.futures import ThreadPoolExecutor

    texts = [
        json.dumps([{"ph": "X", "name": f"k{i % (50 + t)}", "ts": i * 1.25, "args": {"stream": t}} for i in range(3000)]).encode()
        for t in range(4)
    ]
    want = [scan(t) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(scan, texts * 3)) == want * 3


# ---------------------------------------------------------------------------------------------------
# hypothesis: random events, serialized by hand so duplicates, odd numbers and odd spacing occur

ws = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n", "  "])

def mostly(usual, odd):
    """`usual` six times in seven: a document is refused as a whole when one value is off."""
    return st.one_of(usual, usual, usual, usual, usual, usual, odd)


int_texts = mostly(
    st.one_of(st.integers(-(10**6), 10**6).map(str), st.integers(-(10**18) + 1, 10**18 - 1).map(str)),
    st.sampled_from(["0", "-0", "123456789012345678", "1234567890123456789", "-12345678901234567890", "01"]),
)
float_texts = mostly(
    st.one_of(
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda x: f"{x:.9g}"),
        st.builds(lambda a, b, e: f"{a}.{b}e{e}", st.integers(-999, 999), st.integers(0, 10**20), st.integers(-330, 330)),
        st.builds(lambda a, b: f"{a}.{b}", st.integers(0, 10**16), st.integers(0, 10**6)),
    ),
    st.sampled_from(["1e400", "-1e400", "1e-400", "0e999", "1.", ".5", "1e", "-0.0", "1E+2", "2.5e-3", "NaN"]),
)
string_texts = mostly(
    st.one_of(
        st.text(max_size=12).map(lambda s: json.dumps(s, ensure_ascii=False)),
        st.text(max_size=12).map(json.dumps),
    ),
    st.sampled_from(['"\\ud800"', '"\\u00e9"', '"\\x"', '"a\\"b"', '""', '"\\/"', '"\t"', '"kernel"', '"X"']),
)
scalar_texts = st.one_of(
    int_texts, float_texts, string_texts, mostly(st.sampled_from(["true", "false", "null"]), st.sampled_from(["nul", "True"]))
)


def _containers(children):
    pair = st.tuples(string_texts, ws, children, ws)
    return st.one_of(
        st.lists(st.tuples(ws, children), max_size=4).map(lambda xs: "[" + ",".join(w + x for w, x in xs) + "]"),
        st.lists(pair, max_size=4).map(lambda ps: "{" + ",".join(f"{k}{a}:{b}{v}" for k, a, v, b in ps) + "}"),
    )


json_texts = st.recursive(scalar_texts, _containers, max_leaves=8)

EVENT_KEYS = {
    "ph": mostly(string_texts, json_texts),
    "cat": json_texts,
    "name": json_texts,
    "pid": mostly(st.one_of(int_texts, string_texts, st.just("null")), json_texts),
    "tid": mostly(st.one_of(int_texts, string_texts, st.just("null")), json_texts),
    "ts": mostly(st.one_of(int_texts, float_texts, st.just("null")), json_texts),
    "dur": st.one_of(int_texts, float_texts, st.just("null")),
}
ARGS_KEYS = [*NUM_ARGS.values(), *RAW_ARGS.values(), *ANY_ARGS.values()]
UNKNOWN_KEYS = st.sampled_from(["id", "bp", "s", "Trace name", "External ID", "Name", "args ", "x"])


def _object(draw, keys: dict, extra) -> str:
    chosen = draw(st.lists(st.sampled_from(sorted(keys)), unique=True, max_size=len(keys)))
    pairs = [(k, draw(keys[k])) for k in chosen]
    pairs += [(draw(UNKNOWN_KEYS), draw(json_texts)) for _ in range(draw(st.integers(0, 2)))]
    pairs += extra
    if pairs and draw(st.integers(0, 40)) == 0:  # a duplicate now and then
        pairs.append(draw(st.sampled_from(pairs)))
    pairs = draw(st.permutations(pairs))
    return "{" + ",".join(f"{draw(ws)}{json.dumps(k)}{draw(ws)}:{draw(ws)}{v}{draw(ws)}" for k, v in pairs) + "}"


@st.composite
def events_texts(draw):
    events = []
    for _ in range(draw(st.integers(0, 4))):
        args_keys = {
            k: (mostly(st.one_of(int_texts, float_texts, st.just("null")), json_texts) if k in NUM_ARGS.values() else json_texts)
            for k in ARGS_KEYS
        }
        extra = []
        choice = draw(st.integers(0, 5))
        if choice <= 3:
            extra = [("args", _object(draw, args_keys, []))]
        elif choice == 4:
            extra = [("args", draw(st.one_of(st.just("null"), json_texts)))]
        events.append(_object(draw, EVENT_KEYS, extra))
    return draw(ws) + "[" + ",".join(draw(ws) + e + draw(ws) for e in events) + "]" + draw(ws)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events_texts())
def test_random_events_agree_with_msgspec(text):
    expected(text.encode("utf-8", "surrogatepass"))


# BMP text without lone surrogates: json.dumps escapes other characters as surrogate pairs, left to the slow path
BMP_TEXT = st.text(alphabet=st.characters(max_codepoint=0xFFFF, blacklist_categories=("Cs",)), max_size=10)
# finite floats away from the subnormal and near-overflow ranges the scanner leaves to the slow path
NORMAL_FLOATS = st.floats(-1e300, 1e300).filter(lambda x: x == 0 or abs(x) > 1e-290)


@st.composite
def well_formed_events(draw):
    """Events the scanner is meant to accept: the usual key types, nothing it refuses."""
    events = []
    for _ in range(draw(st.integers(1, 4))):
        parts = []
        if draw(st.booleans()):
            parts.append(f'"ph":{json.dumps(draw(st.sampled_from(["X", "i", "M", "s", "f"])))}')
        for key in ("cat", "name"):
            if draw(st.booleans()):
                parts.append(f'"{key}":{json.dumps(draw(BMP_TEXT))}')
        for key in ("pid", "tid"):
            if draw(st.booleans()):
                parts.append(f'"{key}":{draw(st.one_of(st.integers(-(10**17), 10**17).map(str), BMP_TEXT.map(json.dumps)))}')
        for key in ("ts", "dur"):
            if draw(st.booleans()):
                parts.append(f'"{key}":{draw(st.one_of(st.integers(-(10**17), 10**17).map(str), NORMAL_FLOATS.map(repr)))}')
        if draw(st.booleans()):
            args = [f'"{k}":{draw(NORMAL_FLOATS.map(repr))}' for k in draw(st.lists(st.sampled_from(list(NUM_ARGS.values())), unique=True))]
            args += [f'"{k}":{json.dumps(draw(st.lists(st.integers(0, 99), max_size=3)))}' for k in draw(st.lists(st.sampled_from(list(RAW_ARGS.values()) + list(ANY_ARGS.values())), unique=True))]
            parts.append('"args":{' + ",".join(args) + "}")
        events.append("{" + ",".join(parts) + "}")
    return ("[" + ",".join(events) + "]").encode()


@settings(max_examples=examples(100), deadline=None)
@given(well_formed_events())
def test_well_formed_events_are_accepted_and_agree(text):
    assert expected(text) is not None, text


MUTATION_BYTES = st.one_of(st.sampled_from(list(b'"\\{}[],:0123456789.eE+-ntfu \x00\x1f\x7f\xff')), st.integers(0, 255))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(well_formed_events(), st.data())
def test_single_byte_mutations_answer_none_or_agree(text, data):
    pos = data.draw(st.integers(0, len(text) - 1))
    how = data.draw(st.sampled_from(["replace", "insert", "delete"]))
    byte = bytes([data.draw(MUTATION_BYTES)])
    if how == "replace":
        mutated = text[:pos] + byte + text[pos + 1 :]
    elif how == "insert":
        mutated = text[:pos] + byte + text[pos:]
    else:
        mutated = text[:pos] + text[pos + 1 :]
    expected(mutated)

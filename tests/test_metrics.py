"""Metrics: interval arithmetic against a brute-force reference, and per-step numbers worked out by hand
from the builder's clock rules (a launch costs 6 µs of CPU; its kernel starts 4 µs later or when the
stream frees up; a sync returns 2 µs after the GPU drains)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _hypothesis_support import examples
from gpuadvise.analyzer.measure.basics import intervals as iv
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.measure.basics.tables import copy_table
from gpuadvise.analyzer.measure.basics.spans import dataloader_spans
from gpuadvise.analyzer.measure.basics.steps import find_steps
from gpuadvise.analyzer.measure.basics.syncs import sync_table
from gpuadvise.analyzer.measure.basics.source_lines import user_frame_from_stack
from gpuadvise.fixtures.builder import TraceBuilder

GEMM = "ampere_tf32_s1688gemm_64x64_nn"
SINGLE_LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

# ----------------------------------------------------------------------------------------------------
# Interval arithmetic vs brute force on a unit grid

SPAN = 60
interval = st.tuples(st.integers(0, SPAN), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1]))
interval_lists = st.lists(interval, max_size=25)


def cells(intervals) -> np.ndarray:
    """Which unit cells [i, i+1) the half-open intervals cover."""
    grid = np.zeros(SPAN + 25, dtype=bool)
    for s, e in intervals:
        grid[int(s):int(e)] = True
    return grid


@settings(max_examples=examples(200), deadline=None)
@given(interval_lists)
def test_union_matches_brute_force(ivs):
    s = [a for a, _ in ivs]
    e = [b for _, b in ivs]
    ms, me = iv.union(s, e)
    assert len(ms) == len(me)
    # sorted, disjoint and not touching (touching intervals are merged)
    assert np.all(me >= ms)
    assert np.all(ms[1:] > me[:-1])
    # covers exactly the same points
    assert np.array_equal(cells(zip(ms, me)), cells(ivs))
    assert iv.total(ms, me) == cells(ivs).sum()
    # every input lies inside one merged interval, and every merged interval is made of inputs
    for a, b in ivs:
        assert any(x <= a and b <= y for x, y in zip(ms, me))
    assert set(ms) <= set(s) and set(me) <= set(e)


@settings(max_examples=examples(200), deadline=None)
@given(interval_lists, st.lists(st.tuples(st.integers(-5, SPAN + 25), st.integers(0, 40)), min_size=1, max_size=8))
def test_covered_matches_brute_force(ivs, windows):
    ms, me = iv.union([a for a, _ in ivs], [b for _, b in ivs])
    grid = cells(ivs)
    lo = np.array([w[0] for w in windows], dtype=float)
    hi = lo + np.array([w[1] for w in windows], dtype=float)
    got = iv.covered(ms, me, lo, hi)
    want = [grid[max(int(a), 0):max(int(b), 0)].sum() for a, b in zip(lo, hi)]
    assert np.array_equal(got, np.array(want, dtype=float))


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), st.floats(0, 1e4, allow_nan=False)), max_size=30))
def test_union_float_total_and_overlap_each(pairs):
    s = np.array([a for a, _ in pairs])
    e = s + np.array([d for _, d in pairs])
    ms, me = iv.union(s, e)
    # each input is fully covered by the union of all inputs
    assert np.allclose(iv.overlap_each(s, e, ms, me), e - s)
    assert iv.total(ms, me) <= float((e - s).sum()) + 1e-6
    if len(pairs):
        assert iv.total(ms, me) >= float((e - s).max()) - 1e-6


@settings(max_examples=examples(200), deadline=None)
@given(interval_lists, interval_lists)
def test_intersect_and_subtract_of_unions_match_brute_force_and_the_pointwise_way(a, b):
    """Merged unions (what callers pass) go by binary search; the answer is the grid's, and the same
    arrays, to the bit, as the point-by-point way that any intervals (unmerged ones) still take."""
    ua = iv.union([x for x, _ in a], [y for _, y in a])
    ub = iv.union([x for x, _ in b], [y for _, y in b])
    for got, keep_b, want in ((iv.intersect(ua, ub), True, cells(a) & cells(b)),
                              (iv.subtract(ua, ub), False, cells(a) & ~cells(b))):
        assert np.array_equal(cells(zip(*got)), want)
        assert np.all(got[0][1:] > got[1][:-1]) and np.all(got[1] > got[0])  # apart, none empty
        slow = iv._combine_pointwise(*ua, *ub, keep_b)
        assert np.array_equal(got[0], slow[0]) and np.array_equal(got[1], slow[1])


def test_union_empty_and_unsorted():
    ms, me = iv.union([], [])
    assert ms.size == 0 and iv.total(ms, me) == 0.0
    assert np.array_equal(iv.covered(ms, me, [0, 5], [10, 20]), [0.0, 0.0])
    ms, me = iv.union([10, 0, 4], [12, 5, 6])
    assert ms.tolist() == [0, 10] and me.tolist() == [6, 12]
    assert iv.covered(ms, me, 3, 11).tolist() == [4.0]


# ----------------------------------------------------------------------------------------------------
# Per-step GPU time from a builder trace with known numbers


def two_step_trace(gaps=(1_000, 500)) -> TraceBuilder:
    b = TraceBuilder()
    for gap in gaps:
        with b.step():
            b.idle(gap)
            for _ in range(10):
                b.kernel(GEMM, 100)
            b.sync()
    return b


def test_per_step_gpu_busy_by_hand(load_built):
    # Step = gap, then 10 launches: kernel 1 starts 10 µs after its call, the rest queue back to back,
    # so the GPU is busy 1000 µs from gap+10 to gap+1010; the sync returns at gap+1012.
    m = compute(load_built(two_step_trace((1_000, 500))))
    ps = m.per_step
    assert ps["step"].tolist() == [0, 1]
    assert ps["dur_us"].tolist() == pytest.approx([2_012, 1_512])
    assert ps["gpu_busy_us"].tolist() == pytest.approx([1_000, 1_000])
    assert ps["kernel_us"].tolist() == pytest.approx([1_000, 1_000])
    assert ps["memcpy_us"].tolist() == [0, 0] and ps["comm_us"].tolist() == [0, 0]
    assert ps["gpu_busy_pct"].tolist() == pytest.approx([100 * 1000 / 2012, 100 * 1000 / 1512])
    assert ps["idle_us"].tolist() == pytest.approx([1_012, 512])
    assert ps["sync_us"].tolist() == pytest.approx([1_012 - 60, 1_012 - 60])  # sync from the 10th launch's end
    assert m.busy_in_steps_pct == pytest.approx(100 * 2000 / 3524)
    assert m.median_step_us == pytest.approx((2012 + 1512) / 2)
    # HTA temporal breakdown: first kernel start to last kernel end
    # (first kernel at 1_000 + 10, last one ends at 2_012 + 500 + 1_010)
    assert m.temporal["kernel_time_us"] == pytest.approx(2_012 + 500 + 1_010 - 1_010)
    assert m.temporal["idle_us"] == pytest.approx(512)
    assert m.temporal["busy_pct"] == pytest.approx(100 * 2000 / 2512)
    assert m.temporal["compute_us"] == pytest.approx(2_000)
    k = m.kernels.iloc[0]
    assert (k["name"], k["count"], k["total_us"], k["precision"]) == (GEMM, 20, 2000, "tensor-core")


def test_launch_stats_by_hand(load_built):
    m = compute(load_built(two_step_trace((1_000,))))
    la = m.launches.sort_values("gpu_ts")
    assert len(la) == 10
    assert (la["cpu_us"] == 6).all()
    assert la["delay_us"].iloc[0] == pytest.approx(4)  # idle stream: the launch latency
    assert la["delay_us"].iloc[1] == pytest.approx(110 - 12)  # queued behind kernel 1
    assert m.launch_thread == (4242, 4242)


def test_no_steps_whole_trace_is_one_window(load_built):
    b = TraceBuilder()
    b.idle(1_000)
    for _ in range(10):
        b.kernel(GEMM, 100)
    b.sync()
    m = compute(load_built(b))
    assert m.steps == []
    assert m.per_step["step"].tolist() == [-1]
    assert m.per_step["gpu_busy_us"].iloc[0] == pytest.approx(1_000)
    assert m.gpu_busy_pct == pytest.approx(100.0)  # HTA: kernels back to back


def test_comm_kernels_are_not_compute(load_built):
    b = TraceBuilder()
    with b.step():
        b.kernel(GEMM, 300)
        b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 200, stream=20)
        b.sync()
    m = compute(load_built(b))
    assert m.per_step["comm_us"].iloc[0] == pytest.approx(200)
    assert m.per_step["kernel_us"].iloc[0] == pytest.approx(300)
    assert m.temporal["compute_us"] == pytest.approx(300)


# ----------------------------------------------------------------------------------------------------
# Idle breakdown on a handcrafted trace


def _x(cat, name, ts, dur, **args):
    pid, tid = (0, 7) if cat == "kernel" else (1, 1)
    if cat == "kernel":
        args = {"stream": 7, "device": 0, **args}
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_idle_breakdown_host_vs_kernel_wait(load_built):
    # stream 7:  K1 [0,100)  K2 [110,200)  K3 [300,400)  K4 [450,500)
    # K2 was launched at 50 (before K1 ended), 10 µs gap       → kernel wait
    # K3 was launched at 250 (after K2 ended at 200), 100 µs   → host wait
    # K4 was launched at 150 (before K3 ended), 50 µs ≥ 30 µs  → other
    events = [
        _x("cuda_runtime", "cudaLaunchKernel", -10, 5, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 50, 5, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 150, 5, correlation=4),
        _x("cuda_runtime", "cudaLaunchKernel", 250, 5, correlation=3),
        _x("kernel", "K1", 0, 100, correlation=1),
        _x("kernel", "K2", 110, 90, correlation=2),
        _x("kernel", "K3", 300, 100, correlation=3),
        _x("kernel", "K4", 450, 50, correlation=4),
    ]
    m = compute(load_built({"traceEvents": events}))
    ib = m.idle_breakdown
    assert ib["stream"].tolist() == [7]
    row = ib.iloc[0]
    assert row["idle_us"] == pytest.approx(160)
    assert row["host_wait_us"] == pytest.approx(100)
    assert row["kernel_wait_us"] == pytest.approx(10)
    assert row["other_us"] == pytest.approx(50)


def test_idle_breakdown_overlapping_ops_have_no_gap(load_built):
    # K2 lies inside K1: no idle between them; K3 after K1's end is measured from K1, not K2
    events = [
        _x("cuda_runtime", "cudaLaunchKernel", 0, 5, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 5, 5, correlation=2),
        _x("cuda_runtime", "cudaLaunchKernel", 300, 5, correlation=3),
        _x("kernel", "K1", 10, 200, correlation=1),
        _x("kernel", "K2", 20, 50, correlation=2),
        _x("kernel", "K3", 310, 10, correlation=3),
    ]
    row = compute(load_built({"traceEvents": events})).idle_breakdown.iloc[0]
    assert row["idle_us"] == pytest.approx(100)
    assert row["host_wait_us"] == pytest.approx(100)


# ----------------------------------------------------------------------------------------------------
# Steps, syncs, copies, DataLoader sources


def test_find_steps_dedupes_duplicated_annotations(load_built):
    events = [
        _x("user_annotation", "ProfilerStep#7", 0, 1_000),
        _x("cpu_op", "ProfilerStep#7", 2, 990),  # the same step recorded twice
        _x("user_annotation", "ProfilerStep#8", 1_000, 800),
        _x("cpu_op", "ProfilerStep#8", 1_001, 700),
        _x("user_annotation", "ProfilerStep#9", 1_800, 900),
        _x("user_annotation", "ProfilerStep#abc", 0, 10),  # not a step
    ]
    steps = find_steps(load_built({"traceEvents": events}))
    assert [s.number for s in steps] == [7, 8, 9]
    assert [(s.start, s.end) for s in steps] == [(0, 1_000), (1_000, 1_800), (1_800, 2_700)]


def test_find_steps_ordered_by_time_not_number(load_built):
    events = [_x("user_annotation", "ProfilerStep#12", 500, 100), _x("user_annotation", "ProfilerStep#11", 0, 500)]
    assert [s.number for s in find_steps(load_built({"traceEvents": events}))] == [11, 12]


def test_sync_table_flags_profiler_final_sync(load_built):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(5):
                b.kernel(GEMM, 100)
            b.sync()
            b.sync("cudaDeviceSynchronize")  # a user's device sync inside the step
    b.finish()
    model = load_built(b)
    s = sync_table(model, find_steps(model))
    assert len(s) == 7
    assert s["profiler_sync"].tolist() == [False] * 6 + [True]
    last = s.iloc[-1]
    assert last["name"] == "cudaDeviceSynchronize" and last["step"] == -1
    assert s["step"].tolist()[:6] == [0, 0, 1, 1, 2, 2]
    assert set(s["kind"][:6]) == {"stream", "device"}


def test_sync_table_device_sync_followed_by_launches_is_the_users(load_built):
    b = TraceBuilder()
    with b.step():
        b.kernel(GEMM, 100)
        b.sync("cudaDeviceSynchronize")
        b.kernel(GEMM, 100)
    model = load_built(b)
    s = sync_table(model, find_steps(model))
    assert s["profiler_sync"].tolist() == [False]


def test_sync_table_adds_pageable_dtoh_async_copies(load_built):
    b = TraceBuilder()
    with b.step():
        b.kernel(GEMM, 100)
        b.item()
    model = load_built(b)
    s = sync_table(model, find_steps(model))
    assert s["name"].tolist() == ["cudaMemcpyAsync", "cudaStreamSynchronize"]
    assert s["kind"].tolist() == ["pageable device→host copy", "stream"]


def test_a_pageable_htod_copy_that_waits_for_the_stream_is_a_sync(load_built):
    b = TraceBuilder()
    with b.step():
        for _ in range(5):
            b.kernel(GEMM, 1_000)  # 5 ms queued ahead of the copy
        with b.op("aten::copy_"):
            b.copy("HtoD", "Pageable", "Device", nbytes=4096, dur=3.0)
    with b.step():  # the GPU is idle here: the same copy returns once staged, no sync
        b.idle(10_000)
        with b.op("aten::copy_"):
            b.copy("HtoD", "Pageable", "Device", nbytes=4096, dur=3.0)
    model = load_built(b)
    s = sync_table(model, find_steps(model))
    assert s["name"].tolist() == ["cudaMemcpyAsync"]
    assert s["kind"].tolist() == ["pageable host→device copy (waits for the stream)"]
    assert s["op"].tolist() == ["aten::copy_"]
    assert s["dur"].iloc[0] > 4_900


def test_copy_table_parses_names(load_built):
    b = TraceBuilder()
    with b.step():
        b.copy("HtoD", "Pageable", "Device", nbytes=1000, dur=10)
        b.copy("DtoH", "Device", "Pinned", nbytes=2000, dur=10)
        b.copy("DtoD", "Device", "Device", nbytes=3000, dur=10)
        b.sync()
    d = b.to_dict()
    d["traceEvents"].append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
                             "ts": b.t + 10, "dur": 3, "args": {"stream": 7, "device": 0, "bytes": 64}})
    model = load_built(d)
    c = copy_table(model, find_steps(model))
    rows = list(zip(c["name"], c["kind"], c["direction"], c["src"], c["dst"], c["bytes"]))
    assert rows == [
        ("Memcpy HtoD (Pageable -> Device)", "memcpy", "HtoD", "Pageable", "Device", 1000),
        ("Memcpy DtoH (Device -> Pinned)", "memcpy", "DtoH", "Device", "Pinned", 2000),
        ("Memcpy DtoD (Device -> Device)", "memcpy", "DtoD", "Device", "Device", 3000),
        ("Memset (Device)", "memset", "", "", "", 64),
    ]
    assert c["call"].tolist()[:3] == ["cudaMemcpyAsync"] * 3
    assert c["step"].tolist() == [0, 0, 0, -1]
    summary = compute(model).copy_summary
    htod = summary[summary["direction"] == "HtoD"].iloc[0]
    assert htod["gbps"] == pytest.approx(1000 / 10 / 1e3)


STACK = ("/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py(633): __next__;"
         "/home/me/proj/train.py(42): train_one_epoch;"
         "/home/me/proj/train.py(90): main;"
         "/usr/lib/python3.10/runpy.py(86): _run_code")


def test_dataloader_source_from_legacy_call_stack(load_built):
    b = TraceBuilder()
    with b.step():
        b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5_000, **{"Call stack": STACK})
        b.kernel(GEMM, 100)
        b.sync()
    with b.step():
        b.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 3_000)
        b.kernel(GEMM, 100)
        b.sync()
    model = load_built(b)
    dl = dataloader_spans(model, find_steps(model))
    assert dl["source"].tolist() == ["/home/me/proj/train.py(42): train_one_epoch", ""]
    assert dl["single_process"].tolist() == [True, False]
    assert dl["step"].tolist() == [0, 1]
    assert dl["dur"].tolist() == [5_000, 3_000]


@pytest.mark.parametrize("stack, want", [
    (STACK, "/home/me/proj/train.py(42): train_one_epoch"),
    ("torch/nn/modules/module.py(1501): _call_impl;model.py(7): forward", "model.py(7): forward"),
    ("/opt/conda/lib/python3.11/threading.py(1016): run;<built-in method>", ""),
    ("", ""),
    ("nan", ""),
])
def test_user_frame_from_stack(stack, want):
    assert user_frame_from_stack(stack) == want


def test_inside_any_agrees_with_checking_every_span():
    """The sorted sweep behind ops_inside / gpu_ops_launched_in gives what checking each span gives,
    with nested and overlapping spans on several threads."""
    import numpy as np
    import pandas as pd

    from gpuadvise.analyzer.measure.basics.spans import inside_any

    rng = np.random.default_rng(7)
    s_ts = rng.uniform(0, 1000, 60)
    spans = pd.DataFrame({"ts": s_ts, "end": s_ts + rng.uniform(0, 200, 60), "tid": rng.integers(0, 3, 60)})
    ts = rng.uniform(-50, 1250, 5000)
    ends = ts + rng.uniform(0, 80, 5000)
    tid = rng.integers(0, 4, 5000)
    inside = np.zeros(5000, bool)
    launched = np.zeros(5000, bool)
    for a, b, t in spans.itertuples(index=False):
        inside |= (ts >= a) & (ends <= b) & (tid == t)
        launched |= (ts >= a) & (ts < b) & (tid == t)
    assert inside.any() and not inside.all()
    assert (inside_any(ts, tid, spans, ends=ends) == inside).all()
    assert (inside_any(ts, tid, spans) == launched).all()


# ----------------------------------------------------------------------------------------------------
# Subtracting and intersecting unions (the idle explanation's arithmetic) vs brute force


@settings(max_examples=examples(200), deadline=None)
@given(interval_lists, interval_lists)
def test_subtract_and_intersect_match_brute_force(a, b):
    ua = iv.union([x for x, _ in a], [y for _, y in a])
    ub = iv.union([x for x, _ in b], [y for _, y in b])
    ga, gb = cells(a), cells(b)
    diff = iv.subtract(ua, ub)
    both = iv.intersect(ua, ub)
    assert np.array_equal(cells(zip(*diff)), ga & ~gb)
    assert np.array_equal(cells(zip(*both)), ga & gb)


# ----------------------------------------------------------------------------------------------------
# Steps on the GPU timeline


def runs_ahead_trace(steps: int = 4, kernels: int = 10, kernel_us: float = 1_000) -> TraceBuilder:
    """A loop with no sync: each step's CPU span launches 10 ms of GPU work in ~60 µs, so the CPU runs
    ahead and the GPU works through the queue long after the step's span has ended."""
    b = TraceBuilder()
    for _ in range(steps):
        with b.step():
            for _ in range(kernels):
                b.kernel(GEMM, kernel_us)
    b.finish()
    return b


def test_steps_are_measured_on_the_gpu_when_the_cpu_runs_ahead(load_built):
    m = compute(load_built(runs_ahead_trace()))
    ps = m.per_step
    # each CPU span is 10 launches × 6 µs; the GPU time of a step is its 10 kernels back to back
    assert ps["cpu_dur_us"].tolist() == pytest.approx([60] * 4)
    assert ps["gpu_dur_us"].tolist() == pytest.approx([10_000] * 4)
    assert ps["dur_us"].tolist() == pytest.approx([10_000] * 4)
    assert ps["gpu_bound"].all()
    assert m.median_step_us == pytest.approx(10_000) and m.median_cpu_step_us == pytest.approx(60)
    assert m.busy_in_steps_pct == pytest.approx(100)
    # each step's work, wherever the GPU got to it: step 2 starts when step 1's 10 kernels are done
    starts = ps["start_us"].to_numpy()
    assert np.diff(starts) == pytest.approx([10_000] * 3)
    assert starts[0] == pytest.approx(m.steps[0].start + 10)  # first launch's end + latency


def test_steps_keep_the_cpu_span_when_the_gpu_keeps_up(load_built):
    # the GPU work comes at the end of each span (a data-loading wait first): the GPU's step-to-step time
    # would include the next step's wait, which is the CPU's time, not this step's GPU time
    b = TraceBuilder()
    for wait in (20_000, 30_000, 10_000):
        with b.step():
            b.cpu(SINGLE_LOADER, wait)
            for _ in range(10):
                b.kernel(GEMM, 100)
            b.sync()
    b.finish()
    m = compute(load_built(b))
    ps = m.per_step
    assert not ps["gpu_bound"].any()
    assert ps["dur_us"].tolist() == pytest.approx(ps["cpu_dur_us"].tolist())
    assert ps["gpu_dur_us"].tolist() == pytest.approx([1_000] * 3)
    assert ps["dataloader_us"].tolist() == pytest.approx([20_000, 30_000, 10_000])


def test_copies_belong_to_the_step_that_issued_them(load_built):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            b.copy("HtoD", "Pinned", "Device", nbytes=1 << 20, dur=200, blocking=False)
            for _ in range(10):
                b.kernel(GEMM, 1_000)
    b.finish()
    m = compute(load_built(b))
    copies = m.copies[m.copies["kind"] == "memcpy"]
    # the later copies run long after their step's CPU span ended, behind the previous steps' kernels
    assert (copies["ts"].to_numpy()[1:] > np.array([s.end for s in m.steps])[1:]).all()
    assert copies["step"].tolist() == [0, 1, 2]


def test_a_call_stack_is_judged_again_when_the_library_paths_change(monkeypatch):
    stack = "vendored/lib.py(3): helper;train.py(9): step"
    assert user_frame_from_stack(stack) == "vendored/lib.py(3): helper"
    monkeypatch.setenv("GPUADVISE_LIBRARY_PATHS", "vendored")  # now that folder is library code
    assert user_frame_from_stack(stack) == "train.py(9): step"


def test_kernels_and_copies_follow_the_gpu_frame_they_come_from(load_built):
    b = TraceBuilder()
    with b.step():
        b.kernel("gemm_a", 100)
        b.copy(nbytes=1 << 20)
    b.finish()
    model = load_built(b)
    assert model.kernels["name"].astype(str).tolist() == ["gemm_a"]
    assert len(model.copies) == 1
    model.gpu = model.gpu[model.gpu["kind"] != "kernel"]  # a new frame: what was read from the old one is not kept
    assert model.kernels.empty and len(model.copies) == 1

"""Predictions that hold on real models: one fixture per mechanism the replay must model, each
written to a file, loaded with the real loader and analysed as `gpuadvise analyze` would. The expected
savings are derived on paper in each fixture's docstring (fixtures/mechanisms.py); a prediction must land
within ±25 % of it, or ±5 points.
"""

from __future__ import annotations

import pytest

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.replay.calibration import recorded_starts
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.measure.replay.whatif import Scenario, baseline_of
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures import mechanisms as mx

REL_TOL, ABS_TOL = 0.25, 5.0


def within(predicted: float, paper: float) -> bool:
    return abs(predicted - paper) <= max(REL_TOL * abs(paper), ABS_TOL)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    cache = {}

    def get(name: str):
        if name not in cache:
            path = getattr(mx, name)().write(tmp_path_factory.mktemp(name) / "trace.json.gz")
            cache[name] = analyze_model(load_trace(path, cache=False))
        return cache[name]

    return get


def finding(report, topic: str):
    found = [f for f in report.findings if f.topic == topic]
    assert found, f"{topic} not reported (reported: {sorted(f.topic for f in report.findings)})"
    return found[0]


def test_full_launch_queue_is_a_wait_so_faster_matmuls_pay_off(analysed):
    report = analysed("full_launch_queue")
    assert report.figures.median_step_ms == pytest.approx(32.8, rel=0.02)  # the paper's GPU-bound step
    f = finding(report, "no-tensor-cores")
    assert within(f.impact.est_step_saving_pct, mx.PAPER["queue"]), (f.impact.est_step_saving_pct, f.impact.basis)


def test_full_launch_queue_is_not_called_launch_bound(analysed):
    # the launches take ~800 µs each only because they wait for a slot: removing launch overhead saves nothing
    report = analysed("full_launch_queue")
    assert not [f for f in report.findings if f.topic == "launch-bound" and f.impact.est_step_saving_pct >= 5]


def test_sync_prediction_counts_the_work_that_feeds_the_syncs(analysed):
    f = finding(analysed("syncs_fed_by_their_own_work"), "host-sync")
    n = f.evidence.numbers
    assert within(n["saving_syncs_alone_pct"], mx.PAPER["feeding_syncs_alone"]), n
    assert within(n["saving_with_feeding_work_pct"], mx.PAPER["feeding_with_work"]), n
    # the headline is the larger of the two, and the message gives both and says which
    assert f.impact.est_step_saving_pct == pytest.approx(max(n["saving_syncs_alone_pct"], n["saving_with_feeding_work_pct"]), abs=0.1)
    assert "The syncs alone:" in f.message and "aten::linalg_vector_norm" in f.message and "headline" in f.message


def test_a_once_per_step_scalar_read_takes_no_work_with_it(analysed, tmp_path):
    # loss.item() once per step: the loss feeds backward too, so nothing but the sync is removed
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(10):
                with b.op("aten::mm"):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            with b.op("aten::mse_loss"):
                b.kernel(mx.NORM, 30)
            b.item()
            b.idle(2_000)
    b.finish()
    report = analyze_model(load_trace(b.write(tmp_path / "t.json.gz"), cache=False))
    n = finding(report, "host-sync").evidence.numbers
    assert n["saving_with_feeding_work_pct"] is None
    assert n["saving_syncs_alone_pct"] > 5


def test_a_pageable_copy_that_waits_for_the_stream_is_a_host_sync(analysed):
    f = finding(analysed("pageable_copy_waits"), "host-sync")
    assert within(f.impact.est_step_saving_pct, mx.PAPER["pageable_wait"]), (f.impact.est_step_saving_pct, f.impact.basis)
    assert "pageable host→device copy" in f.message and "aten::copy_" in f.message


def test_reads_after_a_loop_of_norms_take_the_loop_with_them(tmp_path):
    # norms = [p.grad.norm() for p in params]; then [n.item() for n in norms]: one burst of reads per step,
    # fed by the loop of norms before it (and not by the GEMMs before that)
    from gpuadvise.fixtures.builder import TraceBuilder

    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(20):
                with b.op("aten::mm"):
                    b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            for _ in range(30):
                b.idle(100)
                with b.op("aten::linalg_vector_norm"):
                    b.kernel(mx.NORM, 10)
            for _ in range(30):
                b.item()
                b.idle(20)
    b.finish()
    report = analyze_model(load_trace(b.write(tmp_path / "t.json.gz"), cache=False))
    f = finding(report, "host-sync")
    n = f.evidence.numbers
    # without the reads and the loop that feeds them only the GEMMs are left: more saved than by the reads alone
    assert n["saving_with_feeding_work_pct"] > n["saving_syncs_alone_pct"]
    assert "120 reads" in f.message  # 30 per step, 4 steps
    assert "aten::mm" not in f.message.split("fed by")[1]


def test_profiler_overhead_is_taken_per_recorded_op(tmp_path):
    # the same loop without the profiler is the paper's: its step is what run.json records
    plain = mx.per_op_profiler_overhead(overhead_us=0.0).write(tmp_path / "plain.json.gz")
    assert analyze_model(load_trace(plain, cache=False)).figures.median_step_ms == pytest.approx(mx.UNPROFILED_MS, rel=0.01)
    b = mx.per_op_profiler_overhead()
    report = analyze_model(load_trace(b.write(tmp_path / "traced.json.gz"), cache=False), facts=b.facts)
    assert report.figures.median_step_ms > 2 * mx.UNPROFILED_MS  # the profiler more than doubled the step
    # the calibration finds the cost that was planted per recorded op
    assert report.calibration.per_event_us == pytest.approx(mx.PROFILER_US_PER_OP, rel=0.25)
    assert "per recorded op" in report.calibration.describe()
    n = finding(report, "host-sync").evidence.numbers
    assert within(n["saving_with_feeding_work_pct"], mx.PAPER["per_op_fix"]), n
    assert within(n["saving_syncs_alone_pct"], mx.PAPER["per_op_syncs_alone"]), n
    # the layers are GPU-bound once the profiler's share is gone: faster GEMMs pay off
    bf16 = finding(report, "no-tensor-cores").evidence.numbers["saving_by_fix_pct"]["bf16"]
    assert within(bf16, mx.PAPER["per_op_bf16"]), bf16


def test_a_blocking_copy_behind_collectives_is_a_host_sync(analysed):
    # the copy waits through an event for the compute stream, which runs a step behind the CPU behind an
    # all-reduce and CUDA-graph work the trace does not record
    report = analysed("blocking_copy_behind_collectives")
    assert report.figures.median_step_ms == pytest.approx(20.0, rel=0.02)  # the paper's traced step
    f = finding(report, "host-sync")
    assert within(f.impact.est_step_saving_pct, mx.PAPER["blocking_copy"]), (f.impact.est_step_saving_pct, f.impact.basis)
    assert "pageable device→host copy" in f.message and "aten::copy_" in f.message


def test_pageable_memcpy_says_how_long_its_copies_hold_the_thread(analysed):
    # 2 µs of copying, ~14 ms of waiting per step: the copy time alone would hide the problem
    report = analysed("blocking_copy_behind_collectives")
    f = finding(report, "pageable-memcpy")
    n = f.evidence.numbers
    assert n["held_ms_per_step"] > 10 and n["waiting_ms_per_step"] > 10 and n["copy_ms"] < 0.1, n
    assert "host-sync" in f.message
    # both findings replay the same fix (the copies stop blocking): they agree on what it saves
    hs = finding(report, "host-sync")
    assert f.impact.est_step_saving_pct == pytest.approx(hs.impact.est_step_saving_pct, abs=1.0)


@pytest.mark.parametrize("budget", [200, 400])
def test_a_replay_of_middle_steps_reproduces_them_and_predicts_the_same(budget, tmp_path, monkeypatch):
    # a window of middle steps starts with the previous step's GPU work queued (left out) and ends with its
    # own last step's GPU work still running: the unrecorded graph work must be a wait of its length, not a
    # fixed time, or the replay over-runs the steps and the copies' fix saves nothing
    from gpuadvise.analyzer.measure.replay import replay_graph
    from gpuadvise.analyzer.measure.basics.metrics import compute

    model = load_trace(mx.blocking_copy_behind_collectives().write(tmp_path / "t.json.gz"), cache=False)
    metrics = compute(model)
    monkeypatch.setattr(replay_graph, "NODE_BUDGET", budget)  # room for only a few of the 6 steps
    replay = replay_graph.build(model, metrics)
    assert 2 <= replay.steps < len(metrics.steps) and replay.window[0] > metrics.steps[0].start
    assert replay.baseline_us == pytest.approx(replay.actual_us, rel=0.05)
    copies = Scenario("copies stop blocking", unblock=lambda c: c["name"].eq("cudaMemcpyAsync").to_numpy())
    assert within(replay.saving_pct(copies), mx.PAPER["blocking_copy"]), replay.saving_pct(copies)


def test_a_blocking_copy_on_a_gpu_paced_loop_is_no_host_sync_but_still_named(tmp_path):
    # the same copy, with almost no Python after it: the GPU has work queued throughout, so ending the wait
    # saves ~0.2 % (paper): no host-sync finding, but pageable-memcpy still gives the thread time and says why
    model = load_trace(mx.blocking_copy_behind_collectives(python_us=20).write(tmp_path / "t.json.gz"), cache=False)
    report = analyze_model(model)
    assert not [f for f in report.findings if f.topic == "host-sync"]
    f = finding(report, "pageable-memcpy")
    assert f.evidence.numbers["waiting_ms_per_step"] > 10
    assert f.impact.est_step_saving_pct < 1.0 and "the GPU side" in f.message and "paces the steps" in f.message


def test_allocator_churn_counts_cudamalloc_as_a_device_sync(tmp_path):
    # the same loop without the profiler is the paper's: its step is what run.json records
    plain = mx.allocator_churn_many_blocks(overhead_us=0.0).write(tmp_path / "plain.json.gz")
    report = analyze_model(load_trace(plain, cache=False))
    assert report.figures.median_step_ms == pytest.approx(mx.CHURN_UNPROFILED_MS, rel=0.02)
    f = finding(report, "allocator-churn")
    assert within(f.impact.est_step_saving_pct, mx.PAPER["churn_many_blocks"]), (f.impact.est_step_saving_pct, f.impact.basis)
    # profiled: no cudaMalloc waits in the trace, yet the calibrated prediction still finds the syncs' cost
    b = mx.allocator_churn_many_blocks()
    f = finding(analyze_model(load_trace(b.write(tmp_path / "traced.json.gz"), cache=False), facts=b.facts), "allocator-churn")
    assert within(f.impact.est_step_saving_pct, mx.PAPER["churn_many_blocks"]), (f.impact.est_step_saving_pct, f.impact.basis)


def test_allocator_syncs_are_the_churn_scenarios_alone(tmp_path):
    """The profiled churn loop with the planted per-event cost taken off: replayed with allocator syncs it
    is the unprofiled loop, and the calibration in that mode finds the planted cost; the default mode (every
    other rule's) keeps cudaMalloc as CPU time, and so its baseline."""
    b = mx.allocator_churn_many_blocks()
    model = load_trace(b.write(tmp_path / "traced.json.gz"), cache=False)
    a = Analysis(model, compute(model), b.facts)
    replay = a.replay
    events = recorded_starts(model, replay.calls)
    planted = (events, mx.PROFILER_US_PER_OP)
    synced = replay.simulate(Scenario("unprofiled", cpu_per_event=planted, alloc_syncs=True)) / replay.steps
    as_cpu = replay.simulate(Scenario("unprofiled", cpu_per_event=planted)) / replay.steps
    assert synced / 1e3 == pytest.approx(mx.CHURN_UNPROFILED_MS, rel=0.03)
    assert as_cpu / 1e3 == pytest.approx(mx.CHURN_AS_CPU_MS, rel=0.03)
    # the mode's calibration takes the measured step as the planted per-event cost, not as less of it
    cal = a._calibration(baseline_of(Scenario("churn", alloc_syncs=True)))
    assert cal.per_event_us == pytest.approx(mx.PROFILER_US_PER_OP, rel=0.15), cal
    assert a.calibration.per_event_us < 0.5 * mx.PROFILER_US_PER_OP, a.calibration
    # the switch is off unless asked for: the default baseline is the as-CPU replay
    assert replay.baseline_us == pytest.approx(replay.simulate(Scenario("default")))

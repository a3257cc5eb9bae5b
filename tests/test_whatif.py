"""The critical-path replay: unchanged, it reproduces the trace; each scenario saves what the fix would,
and overlapped work does not come back."""

from __future__ import annotations

import numpy as np
import pytest

from gpuadvise.analyzer.measure.basics import intervals as iv
from gpuadvise.analyzer.measure.replay import replay_graph
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import all_rules

GEMM = "ampere_tf32_s1688gemm_64x64_nn"
BASELINE = Scenario("baseline")


def replay_of(model):
    replay = replay_graph.build(model, compute(model))
    assert replay is not None
    return replay


def traced_time(model, replay) -> float:
    """What the trace shows for the replayed window: from its start until both the CPU has left the
    window and the GPU has finished the work launched in it."""
    ws, we = replay.window
    ops_end = float(replay.ops["end"].max()) if len(replay.ops) else we
    return max(we, ops_end) - ws


def saved_us(replay, scenario) -> float:
    return replay.baseline_us - replay.simulate(scenario)


def gpu_bound_trace() -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel(GEMM, 1_000)
            b.sync()
    b.finish()
    return b


def sync_heavy_trace() -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(5):
                for _ in range(10):
                    b.kernel(GEMM, 200)
                b.sync()
                b.idle(1_500)  # python work after each sync, while the GPU idles
    b.finish()
    return b


def overlap_trace() -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(10):
                b.kernel(GEMM, 1_500)  # 15 ms queued on the GPU
            b.cpu("preprocess_next_batch", 20_000)  # 20 ms of CPU work while it runs
            b.sync()
    b.finish()
    return b


CUSTOM = {"gpu-bound": gpu_bound_trace, "sync-heavy": sync_heavy_trace, "overlap": overlap_trace}
# every rule fixture that is a trace (memory rules' snapshot fixtures have no timeline to replay)
FIXTURES = [(f"{r.name}-{kind}", getattr(r, kind)) for r in all_rules() for kind in ("positive", "negative")
            if isinstance(getattr(r, kind)(), TraceBuilder)]
ALL = list(CUSTOM.items()) + FIXTURES


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """(model, replay) of each trace in ALL, loaded through the real loader once per module."""
    from gpuadvise.analyzer.read.loader import load_trace

    d, cache = tmp_path_factory.mktemp("whatif"), {}

    def get(name):
        if name not in cache:
            model = load_trace(dict(ALL)[name]().write(d / f"{name}.json.gz"))
            if model.gpu.empty:
                pytest.skip("no GPU timeline to replay")
            cache[name] = model, replay_of(model)
        return cache[name]

    return get


@pytest.mark.parametrize("name", [n for n, _ in ALL])
def test_replay_reproduces_traced_time(name, replayed):
    model, replay = replayed(name)
    traced = traced_time(model, replay)
    assert replay.baseline_us == pytest.approx(traced, rel=0.05), (
        f"replayed {replay.baseline_us:.0f} µs, traced {traced:.0f} µs (steps {replay.actual_us:.0f} µs)")


@pytest.mark.parametrize("name", [n for n, _ in ALL])
def test_baseline_scenario_saves_nothing(name, replayed):
    _, replay = replayed(name)
    assert replay.simulate(BASELINE) == pytest.approx(replay.baseline_us)
    assert replay.saving_pct(BASELINE) == 0.0
    # and doing nothing is stable: simulating twice gives the same answer
    assert replay.simulate(BASELINE) == replay.simulate(Scenario("again"))


def test_replay_covers_the_steps(load_built):
    model = load_built(gpu_bound_trace())
    replay = replay_of(model)
    m = compute(model)
    assert replay.steps == 4
    assert replay.window == (m.steps[0].start, m.steps[-1].end)
    assert len(replay.ops) == 80


def test_removing_overlapped_cpu_time_saves_less_than_its_length(load_built):
    model = load_built(overlap_trace())
    replay = replay_of(model)
    cpu = model.cpu[model.cpu["name"] == "preprocess_next_batch"]
    removed = iv.union(cpu["ts"], cpu["end"])
    length = iv.total(*removed)
    assert length == pytest.approx(4 * 20_000)
    saved = saved_us(replay, Scenario("no preprocessing", cpu_removed=removed))
    # each step drops from ≈ 20.07 ms (CPU-bound) to ≈ 15.07 ms (GPU-bound): 5 ms of the 20 ms come back
    assert 0 < saved < length
    assert saved == pytest.approx(4 * 5_000, rel=0.1)


def test_removing_cpu_time_that_nothing_overlaps_saves_all_of_it(load_built):
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu("preprocess", 5_000)
            for _ in range(10):
                b.kernel(GEMM, 100)
            b.sync()
    b.finish()
    model = load_built(b)
    replay = replay_of(model)
    cpu = model.cpu[model.cpu["name"] == "preprocess"]
    saved = saved_us(replay, Scenario("no preprocessing", cpu_removed=iv.union(cpu["ts"], cpu["end"])))
    assert saved == pytest.approx(4 * 5_000, rel=0.02)


def test_unblocking_syncs_saves_time(load_built):
    model = load_built(sync_heavy_trace())
    replay = replay_of(model)
    pct = replay.saving_pct(Scenario("no syncs", unblock=lambda c: c["blocking"].to_numpy()))
    # per sync: ≈ 2.01 ms of GPU work then 1.5 ms of Python, serialised (≈ 3.5 ms); without the sync the
    # Python work overlaps the next kernels and the loop is GPU-bound at ≈ 2 ms: ≈ 40 % saved
    assert 30 <= pct <= 45, pct


def test_unblocking_nothing_saves_nothing(load_built):
    replay = replay_of(load_built(sync_heavy_trace()))
    none = Scenario("no change", unblock=lambda c: np.zeros(len(c), dtype=bool))
    assert replay.saving_pct(none) == 0.0


def test_half_speed_kernels_on_gpu_bound_trace(load_built):
    model = load_built(gpu_bound_trace())
    replay = replay_of(model)
    gpu_time = float(replay.ops["dur"].sum())
    assert gpu_time / replay.baseline_us > 0.99  # really GPU-bound
    saved = saved_us(replay, Scenario("kernels 2x faster", gpu_scale=lambda ops: np.full(len(ops), 0.5)))
    assert saved == pytest.approx(gpu_time / 2, rel=0.02)


def test_faster_kernels_on_cpu_bound_trace_save_little(load_built):
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel(GEMM, 50)
                b.idle(200)  # the CPU, not the GPU, sets the pace
            b.sync()
    b.finish()
    replay = replay_of(load_built(b))
    pct = replay.saving_pct(Scenario("kernels 2x faster", gpu_scale=lambda ops: np.full(len(ops), 0.5)))
    assert pct < 2, pct


def test_slower_scenario_is_clamped_to_zero_saving(load_built):
    replay = replay_of(load_built(gpu_bound_trace()))
    slower = Scenario("kernels 2x slower", gpu_scale=lambda ops: np.full(len(ops), 2.0))
    assert replay.simulate(slower) > replay.baseline_us
    assert replay.saving_pct(slower) == 0.0


def test_savings_are_monotonic_in_cpu_scale(load_built):
    replay = replay_of(load_built(sync_heavy_trace()))
    times = [replay.simulate(Scenario(f"cpu x{s}", cpu_scale=s)) for s in (1.0, 0.75, 0.5, 0.25, 0.0)]
    assert all(a >= b - 1e-6 for a, b in zip(times, times[1:])), times
    assert times[-1] < times[0]


def test_no_runtime_calls_means_no_replay(load_built):
    b = TraceBuilder()
    with b.step():
        b.kernel(GEMM, 100)
        b.sync()
    d = b.to_dict()
    d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") != "cuda_runtime"]
    model = load_built(d)
    assert replay_graph.build(model, compute(model)) is None


def test_blocking_pageable_htod_copy_is_not_counted_twice(load_built):
    """cudaMemcpyAsync from pageable memory returns only after the copy (the builder, like CUDA, makes the
    call last as long as the DMA): the replay must treat the call as waiting for its copy, not as CPU
    work followed by the copy."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.copy("HtoD", "Pageable", "Device", nbytes=64 << 20, dur=6_000)
            for _ in range(10):
                b.kernel(GEMM, 400)
            b.sync()
    b.finish()
    model = load_built(b)
    replay = replay_of(model)
    assert replay.baseline_us == pytest.approx(traced_time(model, replay), rel=0.05)


# ----------------------------------------------------------------------------------------------------
# A CPU that runs ahead: the replay is the steps' own work, not the queue earlier steps left behind


def runs_ahead_trace(steps: int = 8) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(steps):
        with b.step():
            for _ in range(10):
                b.kernel(GEMM, 1_000)
    b.finish()
    return b


def test_replay_of_a_cpu_that_runs_ahead_is_the_steps_gpu_time(load_built):
    # 8 steps of 10 ms GPU work launched in 0.5 ms of CPU: the middle steps' CPU spans sit on top of the
    # first steps' GPU work. The replay must cost each step its own 10 ms, as the GPU timeline does.
    model = load_built(runs_ahead_trace())
    m = compute(model)
    replay = replay_of(model)
    per_step = replay.baseline_us / replay.steps
    assert replay.actual_us == pytest.approx(replay.steps * 10_000, rel=0.01)
    assert per_step == pytest.approx(10_000, rel=0.02)
    assert m.median_step_us == pytest.approx(10_000, rel=0.01)
    # and a fix that halves the kernels halves the step (earlier steps' queue no longer pins it)
    pct = replay.saving_pct(Scenario("kernels 2x faster", gpu_scale=lambda ops: np.full(len(ops), 0.5)))
    assert pct == pytest.approx(50, abs=2)


def test_replay_leaves_out_the_queue_left_by_unprofiled_steps(load_built):
    """The profiler's warm-up steps launched GPU work it did not record: their kernels (no launch in the
    trace) fill the GPU's queue when the recorded steps begin. That queue is not the steps' time."""
    d = runs_ahead_trace().to_dict()
    warmup_end = next(e["ts"] for e in d["traceEvents"] if e.get("name") == "ProfilerStep#3")
    d["traceEvents"] = [e for e in d["traceEvents"]
                        if not (e.get("cat") in ("cuda_runtime", "user_annotation") and e.get("ts", 0) < warmup_end)]
    model = load_built(d)
    m = compute(model)
    replay = replay_of(model)
    assert [s.number for s in m.steps] == [3, 4, 5, 6, 7]
    unlaunched = ~model.kernels["correlation"].isin(model.runtime["correlation"])
    assert unlaunched.sum() == 30  # the warm-up steps' kernels, 30 ms of queue
    assert not replay.ops["correlation"].isin(model.kernels.loc[unlaunched, "correlation"]).any()
    assert replay.baseline_us / replay.steps == pytest.approx(10_000, rel=0.02)
    assert m.median_step_us == pytest.approx(10_000, rel=0.01)


def cudafree_trace(free_us: float = 300, python_us: float = 3_000) -> TraceBuilder:
    """Each step: Python, 5 ms of GPU work, then empty_cache(): cudaFree calls while the GPU has drained."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.idle(python_us)
            for _ in range(5):
                b.kernel(GEMM, 1_000)
            b.sync()
            b.cpu("cudaFree", free_us, cat="cuda_runtime")
    b.finish()
    return b


def test_cudafree_waits_for_the_gpu_once_the_cpu_gets_there_sooner(load_built):
    replay = replay_of(load_built(cudafree_trace()))
    calls = replay.calls
    assert calls["name"].eq("cudaFree").sum() == 4 and calls.loc[calls["name"] == "cudaFree", "blocking"].all()
    sync = lambda c: c["name"].eq("cudaStreamSynchronize").to_numpy()  # noqa: E731
    # without the stream syncs, the CPU would run ahead... but each step's cudaFree still waits for the GPU
    gone = replay.simulate(Scenario("no syncs", unblock=sync))
    both = replay.simulate(Scenario("no syncs, no frees", unblock=sync,
                                    remove=lambda c: c["name"].eq("cudaFree").to_numpy()))
    assert both < gone - 3 * 3_000 * 0.9  # the frees' device syncs kept ~3 steps of Python serialised


def test_cheaper_launches_do_not_shrink_a_driver_stall(load_built):
    # one launch takes 200 ms (the driver loading its modules on first use) among 200 of 6 µs: a scenario
    # that halves CPU and launch overhead halves the 4 × 50 × 106 µs of loop (21.2 ms → 10.6 ms) and leaves
    # the stall: 221.2 ms → 210.6 ms, 4.8 % (halving the stall too would claim 50 %). The metrics are the
    # trace as recorded: by default the step holding the stall is left out as a one-time cost (warmup.py)
    b = TraceBuilder()
    for step in range(4):
        with b.step():
            for i in range(50):
                b.idle(100)
                if step == 0 and i == 0:
                    b.launch_us = 200_000.0
                b.kernel(GEMM, 20)
                b.launch_us = 6.0
    b.finish()
    model = load_built(b)
    replay = replay_graph.build(model, compute(model, steady=False))
    saving = replay.saving_pct(Scenario("launch and CPU overhead halved", cpu_scale=0.5))
    assert saving == pytest.approx(4.8, abs=1.0)


def _rank_of_a_job(waits_us: list[float]):
    """Rank 3 of a 16-rank job: six layers per step, each read back with `.item()` (the thread waits for
    the GPU), then an all-reduce that waits `waits_us[i]` for the other ranks, the optimizer behind it."""
    from gpuadvise.fixtures.builder import COMM_STREAM, FUSED_ADAM, GEMM

    b = TraceBuilder(rank=3, world_size=16)
    for w in waits_us:
        with b.step():
            for _ in range(6):
                b.idle(300)
                with b.op("aten::linear"):
                    b.kernel(GEMM, 400)
                b.item()
            with b.op("nccl:all_reduce"):
                b.comm(600 + w)
            with b.op("Optimizer.step#AdamW.step"):
                b.kernel(FUSED_ADAM, 100, wait_for=COMM_STREAM)
            b.item()
    b.finish()
    return b


def test_one_rank_of_a_job_predicts_the_fix_on_every_rank(tmp_path):
    """With only rank 3's trace, a finding says what ending it on every rank saves: the saving of the rank's
    own work when no collective waits for another rank, which is what the same rank predicts when its
    all-reduces take their transfer time only (their shortest in the trace, 1.0 ms)."""
    from gpuadvise.analyzer.run.engine import analyze_paths

    waits = [9_000, 400, 7_000, 10_000, 6_000, 8_000]
    (job,) = analyze_paths([str(_rank_of_a_job(waits).write(tmp_path / "rank3.json.gz"))], jobs=1)
    (alone,) = analyze_paths([str(_rank_of_a_job([400] * len(waits)).write(tmp_path / "nowait.json.gz"))], jobs=1)
    f = next(f for f in job.findings if f.topic == "host-sync")
    g = next(f for f in alone.findings if f.topic == "host-sync")
    assert f.impact.job_pct is not None and "only rank 3's trace was analysed" in f.impact.job_basis
    assert "16-rank job" in f.impact.job_basis and "every rank runs the same steps" in f.impact.job_basis
    # the same own work saved, over the traced step (the waits stay): the no-wait rank's saving scaled
    saved_ms = g.impact.est_step_saving_pct / 100 * alone.metrics.median_step_us / 1e3
    assert f.impact.job_pct == pytest.approx(100 * saved_ms * 1e3 / job.metrics.median_step_us, abs=2.0)


def test_replays_agree_with_and_without_the_compiled_longest_path(replayed, monkeypatch):
    """Every scenario a rule fixture's replay answers is the same number from the C loop and the Python one."""
    from gpuadvise.analyzer.measure.replay import whatif

    if whatif._compiled_longest_path is None:
        pytest.skip("the compiled longest path was not built (no C compiler at install)")
    scenarios = [BASELINE, Scenario("half", cpu_scale=0.5), Scenario("unblock", unblock=lambda c: np.ones(len(c), bool)),
                 Scenario("gpu", gpu_scale=lambda ops: np.full(len(ops), 0.5))]
    for name in ("gpu-bound", "sync-heavy", "overlap"):
        _, replay = replayed(name)
        compiled = [replay.simulate(s) for s in scenarios]
        replay._simulated.clear()
        monkeypatch.setattr(whatif, "_compiled_longest_path", None)
        python = [replay.simulate(s) for s in scenarios]
        monkeypatch.undo()
        replay._simulated.clear()
        assert compiled == python


def test_a_scenario_callable_is_asked_once_per_replay_and_never_kept(load_built):
    """A prediction replays its scenario several times: the callable's answer is reused while the callable
    lives, and the replay does not keep the callable (a rule's closure over the Analysis that holds the
    replay would be a cycle that keeps every trace's analysis alive until the collector runs)."""
    import gc
    import weakref

    replay = replay_of(load_built(sync_heavy_trace()))
    asked = []

    class Holder:  # stands for the Analysis a rule's lambda closes over
        pass

    holder = Holder()
    holder.replay = replay

    def blocking(c, _h=holder):
        asked.append(1)
        return c["blocking"].to_numpy()

    s = Scenario("no syncs", unblock=blocking)
    first = replay.saving_pct(s)
    assert replay.saving_pct(s) == first and replay.simulate(s) > 0
    assert len(asked) == 1
    other = Scenario("no syncs, asked anew", unblock=lambda c: c["blocking"].to_numpy())
    assert replay.saving_pct(other) == first  # another callable: asked for its own answer
    alive = weakref.ref(holder)
    was = gc.isenabled()
    gc.disable()
    try:
        del holder, blocking, s
        assert alive() is None, "the replay kept the scenario's callable, and through it what the callable holds"
    finally:
        if was:
            gc.enable()

"""When syncs hold the training thread while the GPU waits for something other than this thread (another
rank, a collective), the report says what the GPU waits for and predicts ending the syncs on every rank
of the job, not the one-rank replay's ~0 %."""

from __future__ import annotations

import pytest

from gpuadvise.analyzer.measure.basics.gpuwaits import gpu_waits
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import COMM_STREAM, FUSED_ADAM, GEMM, TraceBuilder

STEPS = 6


def rank_held_by_peers(world_size: int | None = 16, peer_us: float = 12_000) -> TraceBuilder:
    """One rank of an SPMD job. Per step the CPU launches, in ~0.1 ms: 5 GEMMs of 500 µs, work whose start
    waits `peer_us` for a signal this trace does not record (another rank's), an all-reduce of 2,000 µs and
    the optimizer's 500 µs kernel; then `.cpu()` of a metric (a pageable copy on a side stream that waits
    for the compute stream) holds the thread until all of it is done, and 200 µs of Python follow.

    Traced step ≈ 2.5 + 12 + 2 + 0.5 = 17.0 ms (+ the copy's return, the Python and the next launches,
    ~0.25 ms): the GPU computes 3.0 ms, runs the all-reduce alone 2.0 ms and idles with its work queued
    12 ms of it; the copy holds the thread ~16.9 ms.
    This rank alone without the copy's sync: its GPU still waits 12 ms for the peer; only the Python and
    the launches after the copy (~0.6 ms) come off: saving ≈ 4 %.
    Every rank without it (SPMD: the peer's signal is late by its own sync): the GPU's 5.0 ms of work set
    the step: saving ≈ 1 − 5.0 / 17.25 ≈ **71 %**.
    """
    b = TraceBuilder(rank=0 if world_size else None, world_size=world_size or 1)
    for _ in range(STEPS):
        with b.step():
            for _ in range(5):
                with b.op("aten::mm"):
                    b.kernel(GEMM, 500)
            b.unseen(peer_us)
            b.comm(2_000)
            with b.op("Optimizer.step#Adam.step"):
                b.kernel(FUSED_ADAM, 500, wait_for=COMM_STREAM)
            with b.op("aten::to"):
                with b.op("aten::copy_"):
                    b.copy("DtoH", "Device", "Pageable", nbytes=256, dur=2.0, stream=27, wait_for=7)
            b.idle(200)
    b.finish()
    return b


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    cache = {}

    def get(world_size):
        if world_size not in cache:
            path = rank_held_by_peers(world_size).write(tmp_path_factory.mktemp("rank") / "trace.json.gz")
            model = load_trace(path, cache=False)
            cache[world_size] = analyze_model(model)
        return cache[world_size]

    return get


def host_sync(report):
    found = [f for f in report.findings if f.topic == "host-sync"]
    return found[0] if found else None


def test_what_the_gpu_waits_for_is_split_by_hand(analysed):
    report = analysed(16)
    assert report.figures.median_step_ms == pytest.approx(17.25, rel=0.03)
    w = gpu_waits(report.model, report.metrics)
    assert w.computing_us == pytest.approx(3_000, rel=0.05)
    assert w.collective_alone_us == pytest.approx(2_000, rel=0.05)
    assert w.queued_wait_us == pytest.approx(12_000, rel=0.05)
    assert w.launch_wait_us < 500
    assert w.waits_on_others and w.world_size == 16


def test_syncs_held_by_peers_are_predicted_on_every_rank(analysed):
    f = host_sync(analysed(16))
    assert f is not None, "host-sync not reported"
    n = f.evidence.numbers
    assert n["saving_this_rank_alone_pct"] < 5.0  # the one-rank replay: the GPU still waits for the peer
    assert f.impact.est_step_saving_pct == n["saving_every_rank_pct"] == pytest.approx(71.0, abs=4)
    assert f.impact.range_pct[0] == pytest.approx(n["saving_this_rank_alone_pct"], abs=0.1)
    assert n["gpu_time_per_step_ms"]["idle_with_work_queued"] == pytest.approx(12.0, rel=0.05)
    assert "another rank" in f.message and "every rank" in f.message and "16-rank job" in f.impact.basis
    assert "every rank" in f.advice


def test_a_single_process_is_not_given_the_every_rank_prediction(analysed):
    f = host_sync(analysed(None))
    # the same trace without a job: no peers to end the wait for; the one-process replay stands
    assert f is None or "saving_every_rank_pct" not in f.evidence.numbers

"""One rank's trace read alone: exposed-comm says how much of its step its collectives leave it idle (the
wait for other ranks and the transfer in one figure); once every rank's trace is there, the job's rules
(comm-overlap, straggler) replace it."""

from __future__ import annotations

import pytest

from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import TraceBuilder, job_folder
from gpuadvise.rules import find_rule

RULE = find_rule("exposed-comm")


def _findings(load_built, b: TraceBuilder) -> list:
    report = analyze_model(load_built(b), getattr(b, "facts", None), rules=[RULE, find_rule("exposed-allgather")])
    return [f for f in report.findings if f.rule == RULE.code]


def test_an_all_reduce_after_backward_is_exposed_by_its_own_figures(load_built):
    # 10 ms of compute, then 3 ms of all-reduce with nothing beside it, then the optimizer and a sync
    (f,) = _findings(load_built, RULE.positive())
    n = f.evidence.numbers
    assert n["exposed_ms_per_step"] == pytest.approx(3.0, abs=0.05)
    assert n["comm_overlap_pct"] < 5
    # share, saving and severity come from the same median step
    step_ms = n["exposed_ms_per_step"] * 100 / n["exposed_share_pct"]
    assert 12.5 < step_ms < 14.5
    assert f.impact.est_step_saving_pct == n["exposed_share_pct"] and f.impact.upper_bound
    assert "one of 4 in the job" in f.message and "cannot be told from the transfer" in f.message
    assert [row["collective"] for row in f.evidence.items] == ["all-reduce"]


def test_buckets_reduced_beside_the_next_buckets_compute_are_not_flagged(load_built):
    assert _findings(load_built, RULE.negative()) == []


def test_a_wait_for_a_slower_rank_counts_on_the_rank_that_waits(load_built):
    # rank 0 waits 4 ms in each step's all-reduce for rank 1 (1.4× its compute); rank 1 itself waits for no one
    job = job_folder(ranks=2, straggler=1, compute_us=10_000, transfer_us=300)
    (f,) = _findings(load_built, job.ranks[0])
    assert f.evidence.numbers["exposed_ms_per_step"] == pytest.approx(4.3, abs=0.1)
    assert _findings(load_built, job.ranks[1]) == []  # 0.3 ms of a 14 ms step


def test_all_gathers_are_left_to_exposed_allgather(load_built):
    b = find_rule("exposed-allgather").positive()
    report = analyze_model(load_built(b), None, rules=[RULE, find_rule("exposed-allgather")])
    assert [f.topic for f in report.findings] == ["exposed-allgather"]


def test_with_every_ranks_trace_the_job_rules_replace_it(tmp_path):
    folder = job_folder(ranks=4, compute_us=10_000, transfer_us=3_000, buckets=1).write(tmp_path / "job")
    alone = analyze_paths([str(folder / "rank0.trace.json.gz")])
    assert RULE.code in {f.rule for f in alone[0].findings}
    reports = analyze_paths([str(folder)], jobs=1)
    assert not any(f.rule == RULE.code for t in reports for f in t.findings)
    assert "comm-overlap" in {f.topic for f in reports.job.findings}


def test_the_fix_leaves_out_the_ddp_settings_run_json_shows_set(load_built):
    b = RULE.positive()
    b.facts = {"distributed": {"world_size": 4, "backend": "nccl", "ddp": [
        {"created_at": "train.py:40", "static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 25}]}}
    (f,) = _findings(load_built, b)
    assert "static_graph=True" not in f.fix and "gradient_as_bucket_view=True" not in f.fix
    # the default 25 in use: the fix asks for smaller buckets, never for the value run.json shows
    assert "bucket_cap_mb=25" not in f.fix and "bucket_cap_mb=10" in f.fix and "no_sync()" in f.fix
    b.facts["distributed"]["ddp"][0]["bucket_cap_mb"] = 5
    (small,) = _findings(load_built, b)
    assert "bucket_cap_mb=" not in small.fix
    (plain,) = _findings(load_built, RULE.positive())  # no run.json: the whole fix
    assert "static_graph=True" in plain.fix and "bucket_cap_mb=10" in plain.fix


def test_the_fix_passes_device_ids_only_to_a_gpu_job(load_built):
    """The positive fixture's collectives are NCCL kernels: DDP gets its GPU; a gloo job on the CPU (its
    collectives a CPU backend's) gets no device_ids, which DDP refuses for a CPU module."""
    from gpuadvise.rules.exposed_comm import ddp_fix

    (gpu,) = _findings(load_built, RULE.positive())
    assert "device_ids=[local_rank]" in gpu.fix
    cpu = ddp_fix(RULE.fix, {}, gpu=False)
    assert "device_ids" not in cpu and "model = DDP(\n    model,\n" in cpu


def test_a_gpu_jobs_collectives_on_gloo_are_left_to_cpu_backend_on_gpu(load_built):
    b = find_rule("cpu-backend-on-gpu").positive()
    report = analyze_model(load_built(b), getattr(b, "facts", None), rules=[RULE, find_rule("cpu-backend-on-gpu")])
    assert [f.topic for f in report.findings] == ["cpu-backend-on-gpu"]


def test_the_advice_follows_the_collective_that_holds_the_rank_longest(load_built):
    b = TraceBuilder(rank=0, world_size=2)
    for _ in range(3):
        with b.step():
            with b.op("aten::linear"):
                b.kernel("ampere_sgemm_128x64_nn", 5_000)
            with b.op("nccl:send"):
                b.comm(2_000, name="ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)")
            b.sync()
    b.finish()
    (f,) = _findings(load_built, b)
    assert [row["collective"] for row in f.evidence.items] == ["send/receive"]
    assert "pipeline's bubble" in f.advice and "DDP" not in f.advice

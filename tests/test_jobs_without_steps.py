"""Jobs whose ranks recorded no ProfilerStep (one profiled iteration per rank, as research code and
framework profilers record it): each rank's trace is compared as one step, the collectives are lined up
across the ranks by process group and sequence number, else by their order, for every kind (all-to-all,
send/recv, all-reduce), and the job table, the waits per collective, the straggler and the job what-if
work on them. In a job's report a rank's finding is as severe, and stands as high in the list, as what
its fix saves the job.

The jobs are built by fixtures/stepless_job.py, which plants each rank's wait (the hand count).
"""

from __future__ import annotations

from collections import Counter

import pytest

from gpuadvise.analyzer.measure.job.jobmodel import job_saving_pct
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.report import render
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.fixtures.stepless_job import stepless_job

SIMT = "ampere_sgemm_128x64_nn"  # fp32 without Tensor Cores: no-tensor-cores fires on the rank that runs it


def analysed(folder, **kw):
    job = stepless_job(**kw)
    return job, analyze_paths([str(job.write(folder))], jobs=1)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """3 ranks, all-to-all with the metadata recorded; rank 2 gets 4× the tokens, rank 0 runs its experts
    in fp32 SIMT GEMMs (a cost of its own, hidden: it waits for rank 2 in every all-to-all)."""
    return analysed(tmp_path_factory.mktemp("moe") / "job", ranks=3, slow_rank=2, attention_us=400.0, expert_us=450.0,
                    expert_skew=4.0, expert_gemm={0: SIMT})


@pytest.fixture(scope="module")
def by_order(tmp_path_factory):
    """2 ranks, all-to-all without metadata in the kernels' args (only the `nccl:all_to_all` call)."""
    return analysed(tmp_path_factory.mktemp("order") / "job", ranks=2, slow_rank=1, recorded=False)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """2 ranks exchanging their tokens with paired sends and receives; rank 0, which gets 1.5× the tokens,
    runs its experts in fp32 SIMT GEMMs: the job waits for exactly that work."""
    return analysed(tmp_path_factory.mktemp("p2p") / "job", ranks=2, slow_rank=0, exchange="send_recv", expert_skew=1.5,
                    expert_gemm={0: SIMT})


@pytest.fixture(scope="module")
def jobs(moe, by_order, pairs) -> dict:
    """The three jobs by name (a module-scoped fixture: the README's test command keeps their tests on one
    worker, so each job is analysed once)."""
    return {"moe": moe, "by_order": by_order, "pairs": pairs}


def rows_of(reports) -> dict:
    return {row["rank"]: row for row in reports.job.view.per_rank()}


@pytest.mark.parametrize("case, by, kinds", [
    ("moe", "sequence number", {"all_to_all": 8, "all_reduce": 1}),
    ("by_order", "order within the step", {"all_to_all": 8, "all_reduce": 1}),
    ("pairs", "sequence number", {"send_recv": 8, "all_reduce": 1}),
])
def test_every_collective_is_lined_up_across_the_ranks(jobs, case, by, kinds):
    job, reports = jobs[case]
    view = reports.job.view
    assert view.whole_trace and len(view.steps) == 1
    assert view.matched is not None and view.matched.by == by and view.matched.unmatched == 0
    assert Counter(view.matched.kind) == kinds == Counter(job.collectives)
    assert reports.job.to_dict()["matched_collectives"] == len(job.collectives)
    assert any("each rank's trace is compared as one step" in n for n in reports.job.notes)


@pytest.mark.parametrize("case", ["moe", "by_order", "pairs"])
def test_each_ranks_wait_is_the_hand_count(jobs, case):
    job, reports = jobs[case]
    rows = rows_of(reports)
    for rank, planted in enumerate(job.waits_us):
        assert rows[rank]["wait_ms"] == pytest.approx(planted / 1e3, abs=0.02), (rank, rows[rank])
        assert rows[rank]["work_ms"] == pytest.approx(rows[rank]["median_step_ms"] - planted / 1e3, abs=0.02)
    slowest = max(range(len(job.waits_us)), key=lambda r: -job.waits_us[r])  # the one that never waits
    others = sorted(w for r, w in enumerate(job.waits_us) if r != slowest)
    assert rows[slowest]["caused_wait_ms"] == pytest.approx(others[len(others) // 2] / 1e3, abs=0.02)
    exchange = next(c for c in reports.job.view.collectives if c["collective"] == job.collectives[0])
    assert {x["rank"]: x["wait_ms"] for x in exchange["ranks"]} == pytest.approx(
        {r: w / 1e3 for r, w in enumerate(job.waits_us)}, abs=0.02)


@pytest.mark.parametrize("case, rank", [("moe", 2), ("by_order", 1), ("pairs", 0)])
def test_the_straggler_is_named_with_what_balancing_it_saves(jobs, case, rank):
    job, reports = jobs[case]
    found = [f for f in reports.job.findings if f.topic == "straggler"]
    assert len(found) == 1 and found[0].rank == rank
    # balanced, every rank would do the others' work: the job's step loses the straggler's extra work,
    # which is the others' wait in the all-to-alls
    step_ms = max(row["median_step_ms"] for row in rows_of(reports).values())
    extra_ms = max(job.waits_us) / 1e3
    assert found[0].impact.est_step_saving_pct == pytest.approx(100 * extra_ms / step_ms, abs=0.5)
    assert found[0].severity == "high"


def test_the_job_what_if_saves_only_where_the_job_waits(moe):
    """A fix on a rank that waits for the straggler saves the job nothing; the same time saved on the
    straggler shortens the job's step, but never below the other ranks' own step."""
    job, reports = moe
    view = reports.job.view
    step_us = view.grid["dur_us"].max()
    assert job_saving_pct(view, {0: 2000.0}) == pytest.approx(0.0, abs=0.1)
    on_straggler = job_saving_pct(view, {2: 2000.0})
    assert 5.0 < on_straggler <= 100 * 2000.0 / step_us + 0.1
    floor = 100 * (1 - view.grid["work_us"][:2].max() / step_us)  # ranks 0 and 1 need their own work
    assert job_saving_pct(view, {2: step_us}) == pytest.approx(floor, abs=0.5)


def test_a_rank_finding_that_saves_the_job_nothing_is_low_and_after_the_jobs_causes(moe):
    job, reports = moe
    ntc = [f for f in all_findings(reports) if f.topic == "no-tensor-cores"]
    assert len(ntc) == 1 and ntc[0].rank == 0
    f = ntc[0]
    # what it saves rank 0's own step: [medium] at least, on that rank alone (the roofline bounds it, no shapes)
    assert 3.0 <= f.impact.est_step_saving_pct <= 20.0
    assert f.impact.job_pct < 1.0 and f.severity == "low"
    assert f.evidence.numbers["rank_step_saving_pct"] == round(f.impact.est_step_saving_pct, 1)
    assert "rank 0 waits for rank 2 in all-to-all anyway" in f.message
    order = [g.topic for g in all_findings(reports)]
    assert order.index("straggler") < order.index("no-tensor-cores")
    assert order.index("comm-overlap") < order.index("no-tensor-cores")


def test_a_rank_finding_on_the_straggler_keeps_its_severity(pairs):
    """The same fp32 experts on the rank the job waits for: the fix saves the job much of what it saves
    that rank, and the finding stays [high] without a word about waiting."""
    _, reports = pairs
    f = next(f for f in all_findings(reports) if f.topic == "no-tensor-cores")
    assert f.rank == 0 and f.severity == "high" and "anyway" not in f.message
    assert 10.0 <= f.impact.job_pct <= f.impact.est_step_saving_pct + 0.1


def test_the_text_report_reads_the_job_without_steps(moe):
    _, reports = moe
    text = render(reports, "text")
    assert "job: 3 ranks, no ProfilerStep: each rank's trace compared as one step" in text
    assert "the rank the job waited for: rank 2 (others waited" in text
    assert "#-1" not in text
    md = render(reports, "md")
    assert "| the trace | 2 |" in md and "#-1" not in md


def test_the_job_screen_reads_the_job_without_steps(moe):
    """`gpuadvise view`'s Job screen: the ranks compared on their whole traces, the rank waited for, and
    the waits per collective (the screen's own tables, without starting the app)."""
    pytest.importorskip("textual")
    from gpuadvise.tui.screens.job import JobScreen, _collectives

    job, reports = moe
    facts = str(JobScreen._facts(reports.job))
    assert "3 ranks, each rank's trace compared as one step (no ProfilerStep)" in facts
    assert "Waited for rank 2 (5.40 ms)" in facts and "#-1" not in facts
    waits = _collectives(reports.job.view)
    exchange = waits[waits["collective"] == "all_to_all"]
    assert dict(zip(exchange["rank"], exchange["wait_ms"])) == pytest.approx(
        {r: w / 1e3 for r, w in enumerate(job.waits_us)}, abs=0.02)

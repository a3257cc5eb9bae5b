"""Many ranks: a folder of per-rank traces analysed rank by rank (in-process, in worker processes, on a
Dask cluster), reduced to a job view, and the job-level rules (straggler, comm-overlap) run on it.

- the 8-rank synthetic job with a planted straggler (rank 5 computes 1.4× longer, the others wait for
  it in every all-reduce) names rank 5, with the same findings and the same report whether the ranks
  are analysed with -j 1, -j 2 or on a local Dask cluster; a balanced 8-rank job gets no straggler;
- the two real 2-rank folders of the corpus (HTA trace_filter, PARAM dlrm_kineto) give the same
  findings locally and on Dask, and our comm/compute overlap is HTA's;
- what the user sees: the job section of each format, the progress line on a terminal and `-q`, one
  clean error line for a bad rank or an unusable scheduler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _cli_support import REPO, call_main, run_cli
from gpuadvise.analyzer.run import ranks
from gpuadvise.analyzer.report import render
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.read.sources import resolve
from gpuadvise.fixtures.builder import TraceBuilder, write_job_folder

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
REAL_PAIRS = ["hta/tests/data/trace_filter", "param/et_replay/tests/inputs/dlrm_kineto"]


@pytest.fixture(scope="module")
def job8(tmp_path_factory) -> Path:
    return write_job_folder(tmp_path_factory.mktemp("job8") / "straggler", ranks=8, straggler=5)


@pytest.fixture(scope="module")
def balanced8(tmp_path_factory) -> Path:
    return write_job_folder(tmp_path_factory.mktemp("job8") / "balanced", ranks=8, straggler=None)


@pytest.fixture(scope="module")
def local(job8):
    """The straggler job analysed in this process and in two worker processes."""
    return {j: analyze_paths([str(job8)], jobs=j) for j in (1, 2)}


def findings_of(reports) -> list[dict]:
    return [f.to_dict() for f in all_findings(reports)]


def real_pair(rel: str) -> Path:
    d = TRACES / rel
    if not d.is_dir():
        pytest.skip(f"trace corpus not found at {TRACES} (set GPUADVISE_TRACES)")
    return d


# ----------------------------------------------------------------------------------------------------
# The planted straggler, locally


def test_straggler_is_rank_5(local):
    reports = local[1]
    assert [r.rank for r in reports] == list(range(8))
    straggler = [f for f in all_findings(reports) if f.topic == "straggler"]
    assert len(straggler) == 1
    f = straggler[0]
    assert f.rank == 5 and f.trace.endswith("rank5.trace.json.gz")
    assert f.message.startswith("Rank 5 is the rank the job waits for in 4 of 4 steps. It is 38 % slower")
    n = f.evidence.numbers
    assert n["straggler_rank"] == 5 and n["slowest_in_steps"] == 4 and n["ranks"] == 8
    # 14.0 ms of GEMMs against 10.0 ms, plus ~0.5 ms every rank pays: ~38 % more work
    assert 33 <= n["slower_than_median_pct"] <= 40, n
    assert n["others_wait_ms"] == pytest.approx(4.0, abs=0.1)  # the others idle in their all-reduce
    # if rank 5 ran like the others the step would be ~10.5 instead of ~14.5 ms
    assert 24 <= f.impact.est_step_saving_pct <= 31, f.impact
    assert f.severity == "high"
    assert "GPU compute" in f.message  # its extra time is its kernels, not data or host time
    assert f.evidence.steps == [0, 1, 2, 3]


def test_sequential_and_parallel_give_the_same_report(local):
    seq, par = local[1], local[2]
    assert findings_of(seq) == findings_of(par)
    for fmt in ("json", "md", "text"):
        assert render(seq, fmt) == render(par, fmt), fmt


def test_job_view_per_rank_and_per_step(local):
    job = local[2].job
    v = job.view
    assert v.rank_ids == list(range(8)) and v.steps == [0, 1, 2, 3] and v.world_size == 8
    assert [s.rank for s in v.stragglers] == [5, 5, 5, 5]
    rows = {row["rank"]: row for row in v.per_rank()}
    assert rows[5]["wait_ms"] == pytest.approx(0.0, abs=0.01)
    for r in set(rows) - {5}:
        assert rows[r]["wait_ms"] == pytest.approx(4.0, abs=0.05)
        assert rows[r]["work_ms"] < rows[5]["work_ms"] - 3.5
    # every step ends together: the job runs at the straggler's pace
    assert len({row["median_step_ms"] for row in rows.values()}) == 1
    # the all-reduce starts after all compute: nothing overlaps it
    assert all(row["comm_overlap_pct"] == 0.0 for row in rows.values())


def test_balanced_job_has_no_straggler(balanced8):
    reports = analyze_paths([str(balanced8)], jobs=2)
    assert reports.job is not None
    assert "straggler" not in {f.topic for f in all_findings(reports)}
    assert all(abs(s.slower_pct) < 1.0 for s in reports.job.view.stragglers)
    assert "balanced: in every step the slowest rank is less than 1% slower than the others" in render(reports, "text")


# Two ranks over three steps, each step's compute 10 ms × these factors: jitter alone makes rank 1 the
# last rank in two steps, the other rank waiting 2.2 and 1.5 ms for it (15 % of the step, above the
# thresholds on size). A real straggler is 1.4× slower in every step under the same jitter.
JITTER = [[1.00, 1.22], [1.20, 1.00], [0.95, 1.10]]


@pytest.mark.parametrize("slowdown, named", [(1.0, False), (1.4, True)])
def test_a_rank_that_is_last_by_chance_is_no_straggler(tmp_path, slowdown, named):
    folder = write_job_folder(tmp_path / "job", ranks=2, straggler=1, slowdown=slowdown, steps=3, jitter=JITTER)
    reports = analyze_paths([str(folder)], jobs=1)
    assert [s.rank for s in reports.job.view.stragglers].count(1) == (2 if slowdown == 1.0 else 3)
    found = [f for f in all_findings(reports) if f.topic == "straggler"]
    assert bool(found) == named
    if named:
        assert found[0].rank == 1 and found[0].evidence.numbers["slowest_in_steps"] == 3


def test_results_come_back_in_rank_order(tmp_path):
    """File names say nothing (the rank is in distributedInfo), and the ranks finish in any order."""
    d = tmp_path / "job"
    d.mkdir()
    for rank, name in [(2, "a.json"), (0, "b.json"), (1, "c.json")]:
        b = TraceBuilder(rank=rank, world_size=3)
        with b.step():
            b.kernel("ampere_tf32_s1688gemm_64x64_nn", 200)
            b.sync()
        b.write(d / name)
    for j in (1, 2):
        reports = analyze_paths([str(d)], jobs=j)
        assert [(r.rank, Path(r.source).name) for r in reports] == [(0, "b.json"), (1, "c.json"), (2, "a.json")]


@pytest.mark.parametrize("ranks_and_sizes", [[(None, None), (None, None)], [(0, 2), (1, 4)], [(1, 2), (1, 2)]],
                         ids=["no-rank", "different-world-sizes", "same-rank-twice"])
def test_traces_that_are_not_one_job_get_no_job_view(tmp_path, ranks_and_sizes):
    """Separate runs (no rank), ranks of different jobs, or one rank twice: each trace on its own."""
    paths = []
    for k, (rank, size) in enumerate(ranks_and_sizes):
        b = TraceBuilder(rank=rank, world_size=size or 8)
        for _ in range(2):
            with b.step():
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 200 * (k + 1))
                b.sync()
        paths.append(str(b.write(tmp_path / f"t{k}.json")))
    reports = analyze_paths(paths, jobs=1)
    assert len(reports) == 2 and reports.job is None
    assert "job" not in json.loads(render(reports, "json"))
    assert "## Job" not in render(reports, "md")


def test_rank_progress_counts_ranks(job8):
    calls = []
    analyze_paths([str(job8)], jobs=2, rank_progress=lambda done, n, nbytes: calls.append((done, n, nbytes)))
    assert [c[0] for c in calls] == list(range(1, 9)) and {c[1] for c in calls} == {8}
    assert calls[-1][2] == sum(p.stat().st_size for p in job8.iterdir())


def test_default_workers_follow_cpus_and_memory(job8, monkeypatch):
    sources = resolve([str(job8)])
    largest = max(p.stat().st_size for p in job8.iterdir()) * ranks.GZIP_FACTOR
    monkeypatch.setattr(ranks.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(ranks, "available_memory", lambda: None)
    assert ranks.default_jobs(sources) == 1  # small traces: starting workers would cost more than it saves
    monkeypatch.setattr(ranks, "PARALLEL_MIN_BYTES", 0)
    assert ranks.default_jobs(sources) == 8  # one per trace
    monkeypatch.setattr(ranks, "available_memory", lambda: 3 * largest * 3 + 1)
    assert ranks.default_jobs(sources) == 3  # memory for three traces at a time
    monkeypatch.setattr(ranks, "available_memory", lambda: 1)
    assert ranks.default_jobs(sources) == 1
    monkeypatch.setattr(ranks.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ranks, "available_memory", lambda: None)
    assert ranks.default_jobs(sources) == 2


def test_local_workers_one_for_a_single_trace_or_a_scheduler(job8, monkeypatch):
    sources = resolve([str(job8)])
    one = resolve([str(next(job8.iterdir()))])
    assert ranks.local_workers(sources, 3) == 3
    assert ranks.local_workers(sources, 50) == 8  # at most one per trace
    assert ranks.local_workers(sources, 3, scheduler="tcp://host:8786") == 1  # Dask takes the ranks
    assert ranks.local_workers(one, 4) == 1
    monkeypatch.setattr(ranks, "default_jobs", lambda s: 5)
    assert ranks.local_workers(sources, None) == 5


def test_workers_start_early_only_for_a_local_job(job8, monkeypatch):
    """`analyze` starts a job's fork server before importing the analysis; one trace starts nothing."""
    started = []
    monkeypatch.setattr("multiprocessing.forkserver.ensure_running", lambda: started.append(True))
    ranks.start_early(resolve([str(next(job8.iterdir()))]), None)
    ranks.start_early(resolve([str(job8)]), 2, scheduler="tcp://host:8786")
    ranks.start_early(resolve([str(job8)]), 1)
    assert started == []
    ranks.start_early(resolve([str(job8)]), 2)
    assert started == ([True] if "forkserver" in __import__("multiprocessing").get_all_start_methods() else [])


def test_a_failed_worker_becomes_a_note(job8, monkeypatch):
    """A rank whose worker died (not bad input) is reported as a note; the other ranks still count."""
    real = ranks.map_local

    def one_dies(sources, codes, workers, progress=None, cache=None):
        out = real(sources, codes, workers, progress, cache=cache)
        out[3] = ranks.Failure(str(sources[3].path), "its worker process died (out of memory? try fewer workers: -j)")
        return out

    monkeypatch.setattr(ranks, "map_local", one_dies)
    reports = analyze_paths([str(job8)], jobs=2)
    failed = [r for r in reports if r.metrics is None]
    assert len(failed) == 1 and "worker process died" in failed[0].notes[0]
    assert reports.job.view.rank_ids == [0, 1, 2, 4, 5, 6, 7]
    assert any(f.topic == "straggler" and f.rank == 5 for f in all_findings(reports))
    text = render(reports, "text")
    assert "note: analysis failed: its worker process died" in text


# ----------------------------------------------------------------------------------------------------
# What the user sees


def test_json_job_object(capsys, job8):
    rc, out, err = call_main(capsys, "analyze", job8, "-f", "json", "-j", "2")
    assert rc == 0, err
    doc = json.loads(out)
    job = doc["job"]
    assert job["ranks"] == list(range(8)) and job["steps"] == [0, 1, 2, 3] and job["world_size"] == 8
    assert [row["rank"] for row in job["per_rank"]] == list(range(8))
    for key in ("median_step_ms", "gpu_busy_pct", "comm_ms", "exposed_comm_ms", "comm_overlap_pct", "wait_ms", "work_ms"):
        assert all(isinstance(row[key], float) for row in job["per_rank"]), key
    assert [s["rank"] for s in job["straggler_per_step"]] == [5] * 4
    assert all(30 < s["slower_pct"] < 45 for s in job["straggler_per_step"])
    assert doc["summary"]["findings"] == len(doc["findings"])
    assert [f["rank"] for f in doc["findings"] if f["topic"] == "straggler"] == [5]


def test_markdown_and_text_job_sections(capsys, job8):
    rc, md, _ = call_main(capsys, "analyze", job8, "-f", "md", "-j", "1")
    assert rc == 0
    assert "## Job" in md and "8 ranks, 4 steps compared (ProfilerStep#0–#3)." in md
    assert ("| Rank | Median step (ms) | Work (ms) | Wait (ms) | Others waited for it (ms) | GPU busy | Comm (ms) | "
            "Exposed comm (ms) | Comm/compute overlap |") in md
    assert "| #0 | 5 |" in md  # the rank the job waited for, per step
    assert "| all_reduce | – | 1 |" in md  # waits per collective: one all-reduce per step
    rc, text, _ = call_main(capsys, "analyze", job8, "-j", "1")
    assert rc == 0
    assert "job: 8 ranks, 4 steps compared" in text
    assert "the rank the job waited for, per step: #0 rank 5 (others waited 4.00 ms)" in text
    assert "[rank 5]" in text


def test_single_trace_report_has_no_job(capsys, job8):
    rc, out, _ = call_main(capsys, "analyze", job8 / "rank5.trace.json.gz", "-f", "json")
    assert rc == 0
    doc = json.loads(out)
    assert "job" not in doc
    assert not {"straggler", "comm-overlap"} & {f["topic"] for f in doc["findings"]}


def _on_a_terminal(*args: str) -> str:
    """Run `gpuadvise ARGS` with stderr on a pseudo-terminal; what it drew there."""
    import pty
    import select

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "GPUADVISE_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-m", "gpuadvise", *args], stdout=subprocess.DEVNULL, stderr=slave,
                            env=env)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_progress_shows_ranks_done_on_a_terminal_and_quiet_hides_it(job8):
    drawn = _on_a_terminal("analyze", str(job8), "-j", "2")
    assert "ranks 8/8 done" in drawn and "MB/s" in drawn
    assert _on_a_terminal("analyze", str(job8), "-j", "2", "-q") == ""


@pytest.mark.slow
def test_a_bad_rank_is_one_clean_error_line(tmp_path, job8):
    """Bad input stops the run with one line naming the file; with two bad ranks, the first one in
    rank order, as `-j 1` names it, whichever worker finishes first."""
    d = tmp_path / "job"
    d.mkdir()
    for p in sorted(job8.iterdir())[:4]:
        (d / p.name).write_bytes(p.read_bytes())
    (d / "rank1.trace.json.gz").write_bytes(b"\x1f\x8b" + b"\xff" * 64)  # corrupt gzip: found late
    (d / "rank2.trace.json.gz").write_bytes(b"")  # empty: found at once
    lines = {}
    for j in ("1", "2"):
        run = run_cli("analyze", d, "-j", j)
        assert run.returncode == 2, run.stderr
        assert run.stdout == "" and "Traceback" not in run.stderr
        lines[j] = run.stderr.splitlines()
        assert len(lines[j]) == 1 and lines[j][0].startswith("gpuadvise: error:")
        assert "rank1.trace.json.gz" in lines[j][0], lines[j]
    assert lines["1"] == lines["2"]


def test_jobs_must_be_positive(capsys, job8):
    rc, _, err = call_main(capsys, "analyze", job8, "-j", "0")
    assert rc == 2 and "expected a whole number of workers" in err


@pytest.mark.slow
def test_scheduler_without_dask_is_one_clean_error_line(tmp_path, job8):
    fake = tmp_path / "nodask" / "dask"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named dask')\n")
    env = {k: v for k, v in os.environ.items() if k != "GPUADVISE_DEBUG"}
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "gpuadvise", "analyze", str(job8), "--scheduler", "tcp://127.0.0.1:8786"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert run.returncode == 2
    # run from this checkout: the hint installs the extra into it (gpuadvise is not on PyPI)
    checkout = Path(__file__).resolve().parent.parent
    assert run.stderr.splitlines() == [f"gpuadvise: error: --scheduler needs Dask: pip install -e '{checkout}[dask]' "
                                       "(or pip install 'dask[distributed]')"]


# ----------------------------------------------------------------------------------------------------
# The real 2-rank folders


@pytest.mark.parametrize("rel", REAL_PAIRS)
@pytest.mark.slow  # the real two-rank folders
def test_real_two_rank_folder_sequential_and_parallel(rel):
    d = real_pair(rel)
    seq, par = analyze_paths([str(d)], jobs=1), analyze_paths([str(d)], jobs=2)
    assert seq.job is not None and seq.job.view.rank_ids == [0, 1]
    assert findings_of(seq) == findings_of(par)
    assert render(seq, "json") == render(par, "json")


@pytest.mark.filterwarnings("ignore:The inplace keyword")  # HTA's own pandas usage
@pytest.mark.parametrize("rel", REAL_PAIRS)
@pytest.mark.slow  # HTA on the real two-rank folders
def test_comm_overlap_is_htas(rel):
    d = real_pair(rel)
    try:
        import logging

        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        pytest.skip(f"HTA (pip package traceinsight) not importable: {exc}")
    logging.disable(logging.WARNING)
    try:
        hta = TraceAnalysis(trace_dir=str(d), include_last_profiler_step=True).get_comm_comp_overlap(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    want = dict(zip(hta["rank"], hta["comp_comm_overlap_pctg"]))
    ours = {r.rank: r.overlap_pct for r in analyze_paths([str(d)], jobs=1).job.view.ranks}
    assert set(ours) == set(want)
    for rank in ours:
        assert ours[rank] == pytest.approx(want[rank], abs=0.02), (rank, ours[rank], want[rank])  # HTA rounds to 0.01


# ----------------------------------------------------------------------------------------------------
# Dask


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("dask.distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.mark.slow
def test_dask_names_the_same_straggler(dask_client, local, job8):
    reports = analyze_paths([str(job8)], scheduler=dask_client)
    assert findings_of(reports) == findings_of(local[1])
    assert render(reports, "json") == render(local[1], "json")
    assert [f.rank for f in all_findings(reports) if f.topic == "straggler"] == [5]


@pytest.mark.slow
def test_dask_by_address_from_the_command_line(dask_client, local, job8):
    """The real command, in its own process: it makes its own client of the address (not the default one)."""
    run = run_cli("analyze", job8, "-f", "json", "--scheduler", dask_client.scheduler.address)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert json.loads(run.stdout) == json.loads(render(local[1], "json"))


@pytest.mark.parametrize("rel", REAL_PAIRS)
@pytest.mark.slow
def test_dask_real_two_rank_folder(dask_client, rel):
    d = real_pair(rel)
    on_dask = analyze_paths([str(d)], scheduler=dask_client)
    here = analyze_paths([str(d)], jobs=1)
    assert findings_of(on_dask) == findings_of(here)
    assert render(on_dask, "md") == render(here, "md")


@pytest.mark.slow
def test_unusable_scheduler_address_is_one_clean_error_line(job8):
    pytest.importorskip("dask.distributed")
    run = run_cli("analyze", job8, "--scheduler", "127.0.0.1")
    assert run.returncode == 2
    assert run.stderr.splitlines() == ["gpuadvise: error: not a Dask scheduler address: '127.0.0.1' "
                                       "(missing port number in address '127.0.0.1')"]


def test_collective_waits_match_a_hand_count_on_the_dlrm_pair():
    """PARAM's DLRM ranks 0 and 1 of 8 (V100, NCCL, one step): 8 NCCL kernels each (5 all-to-all as
    SendRecv kernels, 3 all-reduces), ending on both ranks within 3 µs of each other (one clock). Counted by
    hand from the raw kernels: rank 0 starts its first all-to-all 5489 µs after rank 1 (rank 1 waits 5489 µs
    of its 7635 µs there), and over the 8 collectives rank 1 waits 5585 µs, rank 0 40 µs (7 + 6 + 27)."""
    reports = analyze_paths([str(real_pair("param/et_replay/tests/inputs/dlrm_kineto"))], jobs=1)
    v = reports.job.view
    m = v.matched
    assert len(m) == 8 and m.unmatched == 0 and list(m.offsets_us) == [0.0, 0.0]
    assert m.kind == ["all_to_all"] * 4 + ["all_reduce", "all_to_all", "all_reduce", "all_reduce"]
    assert m.wait[:, 0].tolist() == pytest.approx([0.0, 5489.0], abs=1.0)
    assert m.wait.sum(axis=1).tolist() == pytest.approx([40.0, 5585.0], abs=2.0)
    assert int(m.last[0]) == 0  # rank 0 arrived last at the first all-to-all: rank 1 waited for it
    rows = {r["rank"]: r for r in v.per_rank()}
    assert rows[1]["caused_wait_ms"] == pytest.approx(0.04, abs=0.01)
    assert rows[0]["caused_wait_ms"] == pytest.approx(5.56, abs=0.03)  # exposed: rank 1 computed 24 µs meanwhile
    (f,) = [f for f in all_findings(reports) if f.topic == "straggler"]
    # the late rank is named; its work in the step is no more than rank 1's: it began the step late
    assert f.rank == 0 and "Rank 1 waits a median 5.56 ms per step for it" in f.message, f.message
    assert "rank 0 starts its steps after the others" in f.message


# -- what better overlap can hide: the compute after the first gradient is ready --------------------------
def _data_parallel_job(tmp_path: Path, grads_ready_per_layer: bool) -> Path:
    """Two ranks, four layers: a forward, then each layer's backward (2 ms of GEMMs), then a 3 ms all-reduce
    with nothing beside it. Gradients are ready after each layer's backward (a deep model, several DDP
    buckets), or all at the end (one layer's worth: `Linear(20, 1)`)."""
    from gpuadvise.analyzer.measure.job.gradients import READY
    from gpuadvise.fixtures.builder import GEMM, RankFolder

    out = []
    for r in range(2):
        b = TraceBuilder(rank=r, world_size=2)
        for _ in range(4):
            with b.step():
                with b.op("aten::linear"):
                    for _ in range(10):
                        b.kernel(GEMM, 300)
                for layer in range(4):
                    with b.op("autograd::engine::evaluate_function: AddmmBackward0"):
                        for _ in range(5):
                            b.kernel(GEMM, 400)
                    if grads_ready_per_layer or layer == 3:
                        b.cpu(READY, 20)
                with b.op("nccl:all_reduce"):
                    b.comm(3_000)
                b.sync()
        b.finish()
        out.append(b)
    return RankFolder(out).write(tmp_path / ("deep" if grads_ready_per_layer else "one-layer"))


def test_comm_overlap_saves_only_what_compute_after_the_first_gradient_can_hide(tmp_path):
    deep = analyze_paths([str(_data_parallel_job(tmp_path, True))], jobs=1)
    flat = analyze_paths([str(_data_parallel_job(tmp_path, False))], jobs=1)
    (d,) = [f for f in deep.job.findings if f.topic == "comm-overlap"]
    (o,) = [f for f in flat.job.findings if f.topic == "comm-overlap"]
    # the same exposed transfer in both; 6 ms of backward follow the first gradient in the deep model (all
    # 3 ms can hide), none in the one-layer one: its saving and severity say there is nothing to overlap with
    assert d.evidence.numbers["exposed_transfer_ms_per_step"] == pytest.approx(o.evidence.numbers["exposed_transfer_ms_per_step"])
    assert d.evidence.numbers["compute_after_first_gradient_ms"] == pytest.approx(6.0, abs=0.3)
    assert o.evidence.numbers["compute_after_first_gradient_ms"] == pytest.approx(0.0, abs=0.05)
    assert d.impact.est_step_saving_pct == pytest.approx(d.evidence.numbers["exposed_share_pct"], abs=0.5)
    assert d.severity == "high" and o.severity == "low" and o.impact.est_step_saving_pct < 1.0
    assert "communicate less" in o.advice and "DDP buckets" in d.advice


def test_comm_overlap_on_a_ddp_whose_gradients_fit_one_bucket(tmp_path):
    """run.json: DDP put its 84 bytes of gradients in one bucket, which no bucket_cap_mb splits (they fit
    the first bucket): nothing to hide the reduction behind, and the fix asks for no bucket size, nor for
    the settings it already has."""
    folder = _data_parallel_job(tmp_path, True)
    facts = {"distributed": {"world_size": 2, "local_world_size": 2, "backend": "gloo", "ddp": [
        {"created_at": "train.py:9", "bucket_cap_mb": 25.0, "static_graph": False, "gradient_as_bucket_view": True,
         "buckets": 1, "parameter_bytes": 84, "params": 2}]}}
    for r in (0, 1):
        (folder / ("run.json" if r == 0 else f"run.rank{r}.json")).write_text(json.dumps({**facts, "rank": r}))
    (f,) = [f for f in analyze_paths([str(folder)], jobs=1).job.findings if f.topic == "comm-overlap"]
    assert f.severity == "low" and f.impact.est_step_saving_pct == 0.0
    assert "DDP reduces its 84 bytes of gradients in one bucket" in f.message
    assert "bucket_cap_mb" not in f.fix and "gradient_as_bucket_view" not in f.fix and "static_graph=True" in f.fix

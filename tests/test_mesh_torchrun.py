"""A real job on a 2 × 2 device mesh, end to end on the CPU: `torchrun --nproc_per_node 4 -m gpuadvise profile`
runs tests/probes/mesh_job.py (FSDP2 `fully_shard` over "dp", tensor parallel `parallelize_module` with
ColwiseParallel into RowwiseParallel over "tp", gloo), once for the module (about 20 s of CPU); every
check reads that run:

- both kinds of group found with their ranks (dp [0, 2] [1, 3] FSDP's, tp [0, 1] [2, 3] tensor parallel's),
  from the run folder (run.json and the traces), from the traces alone as torch.profiler writes them
  (distributedInfo lists the groups), and from the traces with that list taken out (an older torch:
  inferred from which ranks' collectives end together);
- every collective lined up across its group and placed in its phase;
- the exposed time per group and rank within 10 % of a hand count over the raw trace JSON
  (tests/_mesh_handcount.py), and never the time the Steps table counts inside ops;
- run.json's mesh and process groups; the advice names the group that holds the step.

bench/mesh_job.py records the same job with plain torch.profiler (one trace per rank, record_shapes,
as a user writes it) and prints the report's head beside the hand count.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover - a torch built without distributed
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from _mesh_handcount import exposed_ms  # noqa: E402
from gpuadvise.analyzer.model.report import all_findings  # noqa: E402
from gpuadvise.analyzer.run.engine import analyze_paths  # noqa: E402

pytestmark = pytest.mark.slow  # a four-rank job under torchrun

PROBE = Path(__file__).resolve().parent / "probes" / "mesh_job.py"
GROUPS = {"mesh_dp (FSDP)": [[0, 2], [1, 3]], "mesh_tp (tensor parallel)": [[0, 1], [2, 3]]}
PHASES = {"mesh_dp (FSDP)": {"all-gather in forward": 2, "all-gather in backward": 2, "reduce-scatter in backward": 2},
          "mesh_tp (tensor parallel)": {"all-reduce in forward": 2, "all-reduce in backward": 1}}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mesh") / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPUADVISE_DEBUG")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "gpuadvise",
           "profile", "--wait", "1", "--warmup", "1", "--active", "3", "-o", str(folder), str(PROBE), "--steps", "6"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=folder.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def reports(run):
    return analyze_paths([str(run)], jobs=1)


def traces_of(run: Path, into: Path, keep_the_list: bool) -> Path:
    """The run's traces alone in a folder of their own (no run.json), with or without distributedInfo's
    list of process groups."""
    into.mkdir()
    for path in sorted(run.glob("trace.rank*.pt.trace.json.gz")):
        if keep_the_list:
            shutil.copy(path, into / path.name)
            continue
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc["distributedInfo"].pop("pg_config", None)
        (into / path.name).write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return into


def groups(view) -> dict:
    return {g["shown"]: [x["ranks"] for x in g["groups"]] for g in view.groups}


def test_both_groups_are_found_with_their_ranks_and_the_mesh(reports):
    v = reports.job.view
    assert groups(v) == GROUPS
    assert v.mesh["source"] == "run.json" and v.mesh_words() == "dp × tp = 2 × 2: dp [0, 2] [1, 3]; tp [0, 1] [2, 3]"


def test_every_collective_is_lined_up_and_placed_in_its_phase(reports):
    v = reports.job.view
    m = v.matched
    per_rank = sum(len(r.collectives) for r in v.ranks)
    assert m.unmatched == 0 and 2 * len(m) == per_rank  # each ran on its two ranks, none left out
    assert {tuple(np.flatnonzero(m.member[:, k]).tolist()) for k in range(len(m))} == {(0, 2), (1, 3), (0, 1), (2, 3)}
    assert {g["shown"]: {p["where"]: p["per_step"] for p in g["phases"]} for g in v.groups} == PHASES
    assert set(zip(m.scheme, m.phase)) == {("fsdp", "forward"), ("fsdp", "backward"), ("tp", "forward"), ("tp", "backward")}


def test_every_figure_of_the_mesh_jobs_reports_is_stated_once(reports):
    """The job table, the waits per collective, the groups' rows, the Steps tables and the TUI's agree
    (tests/_figures_support.py), as on the other torchrun jobs."""
    from _figures_support import problems

    found = problems(reports)
    assert not found, "\n".join(found)


def test_a_ranks_time_in_ops_and_its_exposed_communication_add_up_to_no_more_than_its_step(reports):
    """The Steps table's time inside ops leaves out the ops that wait in a collective (a functional
    collective's wait_tensor, autograd's node whose hook reduce-scatters), as the job's exposed
    communication counts them: per rank and step, the two never claim the same time."""
    v = reports.job.view
    for i, report in enumerate(reports):
        steps = {s.step: s for s in report.figures.cpu_steps}
        for j, step in enumerate(v.steps):
            exposed_ms = (v.grid["wait_us"][i, j] + v.grid["exposed_transfer_us"][i, j]) / 1e3
            assert steps[step].in_ops_ms + exposed_ms <= steps[step].ms + 0.05, (i, step, steps[step], exposed_ms)


def test_the_exposed_time_per_group_is_the_hand_counts(run, reports):
    hand = {int(p.name.split(".")[1][4:]): exposed_ms(p) for p in run.glob("trace.rank*.pt.trace.json.gz")}
    for g in reports.job.view.groups:
        dim = g["dim"]
        for row in g["per_rank"]:
            counted = hand[row["rank"]][dim]
            assert row["exposed_ms"] == pytest.approx(counted, rel=0.10), (dim, row, counted)


def test_the_traces_alone_give_the_same_groups(run, reports, tmp_path):
    alone = analyze_paths([str(traces_of(run, tmp_path / "alone", keep_the_list=True))], jobs=1).job.view
    assert groups(alone) == GROUPS and alone.mesh["source"] == "trace"
    older = analyze_paths([str(traces_of(run, tmp_path / "older", keep_the_list=False))], jobs=1).job.view
    assert groups(older) == {"FSDP groups": GROUPS["mesh_dp (FSDP)"], "tensor parallel groups": GROUPS["mesh_tp (tensor parallel)"]}
    assert any("inferred from which ranks' collectives end together" in n for n in older.notes)
    exposed = {g["dim"] or g["role"]: g["exposed_ms"] for g in reports.job.view.groups}
    assert {g["role"]: g["exposed_ms"] for g in older.groups} == {"FSDP": exposed["dp"], "tensor parallel": exposed["tp"]}


def test_gloos_all_gathers_and_reduce_scatters_know_their_group_size_from_the_calls_tensors(reports):
    """gloo records no group; FSDP's c10d calls carry tensors whose sizes say it (output = 2 × input on a
    2-rank group), which narrows the groups a trace without names is split into. All-reduces say nothing."""
    for r in reports.job.view.ranks:
        c = r.collectives
        sizes = {(k, int(s)) for k, s in zip(c.kind, c.group_size)}
        assert sizes == {("all_gather", 2), ("reduce_scatter", 2), ("all_reduce", -1)}, (r.rank, sizes)


def test_run_json_records_the_mesh_and_the_groups(run):
    for rank in range(4):
        d = json.loads((run / ("run.json" if rank == 0 else f"run.rank{rank}.json")).read_text())["distributed"]
        (mesh,) = d["meshes"]
        assert mesh["shape"] == [2, 2] and mesh["dim_names"] == ["dp", "tp"] and mesh["mesh"] == [[0, 1], [2, 3]]
        assert mesh["created_at"].split(":")[0].endswith("mesh_job.py")
        mine = {g["desc"]: g["ranks"] for g in d["process_groups"]}
        assert mine["mesh_dp"] == [rank % 2, rank % 2 + 2] and mine["mesh_tp"] == [rank - rank % 2, rank - rank % 2 + 1]


def test_the_advice_names_the_group_that_holds_the_step(reports):
    found = {f.rule: f for f in all_findings(reports)}
    assert "GA131" not in found  # comm-overlap's data-parallel advice does not apply to a mesh
    f = found["GA137"]
    top = f.evidence.numbers["group"]
    assert top in ("mesh_dp", "mesh_tp") and f.message.startswith(f"The {top} groups")
    assert f.advice.startswith("FSDP: " if top == "mesh_dp" else "Tensor parallel: ")
    # four ranks on one node (run.json's local world size): nothing about nodes to replicate across or stay inside
    assert "HSDP" not in f.advice and "node" not in f.advice
    assert 0 < f.impact.est_step_saving_pct < 100 and f.impact.upper_bound

"""Jobs on a device mesh, from fixtures built in process (fixtures/meshjob.py, fixtures/cudagraph.py):

- each collective placed in its group and phase: FSDP2 alone (all-gathers in forward and in backward,
  reduce-scatters in backward), tensor parallel alone (all-reduces in forward and backward), and the 2-D
  mesh (each lined up across its own group's ranks only, the mesh in the report); a slow rank holds up
  only the groups it is in;
- the groups from the trace's names, from its header's list, or, for an older torch's trace that has
  neither, from which ranks' collectives end together (and a guess said to be one when the ranks run in
  lockstep);
- `Comms Id` lines collectives up where the order does not (a collective the profiler missed on one rank);
- a CUDA graph's kernels attributed to the ops captured into it (name, source line, phase);
- the job replay: as recorded it gives back the trace; hiding a group's exposed transfer shortens the step;
- a mesh job merged into one file (as TraceLens merges ranks) has the groups and phases of its rank files.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from gpuadvise.analyzer.measure.job.collectives import rank_collectives
from gpuadvise.analyzer.measure.compiled.cudagraphs import captured
from gpuadvise.analyzer.measure.efficiency.gemm import kernels_by_op
from gpuadvise.analyzer.measure.job.jobmodel import job_saving_pct
from gpuadvise.analyzer.measure.basics.source_lines import attribute
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.report import render
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.fixtures.cudagraph import graphed_training
from gpuadvise.fixtures.merged import tracelens_merge
from gpuadvise.fixtures.meshjob import mesh_job


def job_of(tmp_path, name: str = "job", **kw):
    folder = mesh_job(**kw).write(tmp_path / name)
    return analyze_paths([str(folder)], jobs=1)


def phases(view) -> dict:
    """Each kind of group → {phase words: count per step}."""
    return {g["shown"]: {p["where"]: p["per_step"] for p in g["phases"]} for g in view.groups}


def ranks_of(view) -> dict:
    return {g["shown"]: [x["ranks"] for x in g["groups"]] for g in view.groups}


@pytest.fixture(scope="module")
def mesh2x2(tmp_path_factory):
    """The 2 × 2 mesh with rank 3 computing 1.5× as long as the others."""
    return job_of(tmp_path_factory.mktemp("mesh"), slow={3: 1.5})


def test_fsdp_alone_gathers_in_forward_and_backward_and_reduce_scatters_in_backward(tmp_path):
    v = job_of(tmp_path, dp=2, tp=1).job.view
    assert ranks_of(v) == {"mesh_dp (FSDP)": [[0, 1]]}
    assert phases(v) == {"mesh_dp (FSDP)": {"all-gather in forward": 2, "all-gather in backward": 2,
                                            "reduce-scatter in backward": 2}}
    assert set(v.matched.scheme) == {"fsdp"} and v.matched.by == "sequence number"


def test_tensor_parallel_alone_all_reduces_in_forward_and_backward(tmp_path):
    v = job_of(tmp_path, dp=1, tp=2).job.view
    assert phases(v) == {"mesh_tp (tensor parallel)": {"all-reduce in forward": 2, "all-reduce in backward": 2}}
    assert set(v.matched.scheme) == {"tp"}


def test_a_2d_mesh_lines_each_collective_up_across_its_own_group(mesh2x2):
    v = mesh2x2.job.view
    assert ranks_of(v) == {"mesh_dp (FSDP)": [[0, 2], [1, 3]], "mesh_tp (tensor parallel)": [[0, 1], [2, 3]]}
    assert phases(v)["mesh_dp (FSDP)"] == {"all-gather in forward": 2, "all-gather in backward": 2,
                                           "reduce-scatter in backward": 2}
    assert phases(v)["mesh_tp (tensor parallel)"] == {"all-reduce in forward": 2, "all-reduce in backward": 2}
    m = v.matched
    # every rank ran 30 collectives in its 3 steps, each lined up with its one partner: none left out
    assert len(m) == 60 and m.unmatched == 0
    members = {tuple(np.flatnonzero(m.member[:, k]).tolist()) for k in range(len(m))}
    assert members == {(0, 2), (1, 3), (0, 1), (2, 3)}
    assert v.mesh_words() == "dp × tp = 2 × 2: dp [0, 2] [1, 3]; tp [0, 1] [2, 3]"


def test_a_slow_rank_holds_up_the_groups_it_is_in(mesh2x2):
    """Rank 3 computes 1.5× as long: rank 1 (its FSDP partner) and rank 2 (its TP partner) wait for it
    inside their collectives with it; rank 0 shares no group with it and waits only for those two."""
    v = mesh2x2.job.view
    wait = dict(zip(v.rank_ids, np.median(v.grid["wait_us"], axis=1) / 1e3))
    assert wait[3] < 0.05 and wait[1] > 1.0 and wait[2] > 1.0, wait
    assert {s.rank for s in v.stragglers} == {3}
    straggler = [f for f in all_findings(mesh2x2) if f.topic == "straggler"]
    assert [f.rank for f in straggler] == [3]


def test_the_reports_show_the_groups_by_phase_and_the_mesh(mesh2x2):
    text = render(mesh2x2, "text")
    assert "mesh dp × tp = 2 × 2: dp [0, 2] [1, 3]; tp [0, 1] [2, 3]" in text
    assert "mesh_dp (FSDP) [0, 2] [1, 3]" in text and "    reduce-scatter in backward" in text
    md = render(mesh2x2, "md")
    assert "**Communication by process group and phase**" in md and "| | all-reduce in forward |" in md
    job = json.loads(render(mesh2x2, "json"))["job"]
    assert job["mesh"]["dims"] == ["dp", "tp"] and {g["family"] for g in job["groups"]} == {"mesh_dp", "mesh_tp"}
    tp = next(g for g in job["groups"] if g["family"] == "mesh_tp")
    assert sorted(r["rank"] for r in tp["per_rank"]) == [0, 1, 2, 3]


def test_groups_of_an_older_torch_are_inferred_from_the_timing(tmp_path):
    """No group names on the kernels and no list in the header: which ranks' collectives end together
    decides, as long as the ranks are not in lockstep."""
    v = job_of(tmp_path, pg_names=False, listed=False, slow={3: 1.5}).job.view
    assert ranks_of(v) == {"FSDP groups": [[0, 2], [1, 3]], "tensor parallel groups": [[0, 1], [2, 3]]}
    assert any("inferred from which ranks' collectives end together" in n for n in v.notes), v.notes
    assert not any("guess" in n for n in v.notes)
    lockstep = job_of(tmp_path, "lockstep", pg_names=False, listed=False).job.view
    assert any("their groups are a guess" in n for n in lockstep.notes), lockstep.notes


def test_a_rank_stranded_by_joining_the_closest_pairs_first_still_gets_a_group_of_the_recorded_size(monkeypatch):
    """The pair fits of a real 2 × 2 gloo job's FSDP class (its collectives record groups of 2): ranks 0 and 1 end
    closest, but not as one group; 1 and 2 just break the ends rule, 0–3 and 2–3 clearly. Joining 0 with 1 first
    strands 2 and 3; the only split into pairs where no pair breaks the rule is [0, 2] [1, 3]."""
    from types import SimpleNamespace

    from gpuadvise.analyzer.measure.job import commgroups

    fits = {(0, 1): (0.0, 0.52, 18), (0, 2): (0.0, 0.55, 18), (0, 3): (0.22, 0.69, 18),
            (1, 2): (0.056, 0.37, 18), (1, 3): (0.0, 0.65, 18), (2, 3): (0.22, 0.64, 18)}
    monkeypatch.setattr(commgroups, "_pair_fit", lambda collectives, where, a, b: fits[a, b])
    collectives = [SimpleNamespace(group_size=np.array([2, 2])) for _ in range(4)]
    where = {i: [0, 1] for i in range(4)}
    assert commgroups._partition(collectives, where, [0, 1, 2, 3], {}) == [([[0, 2], [1, 3]], "inferred")]
    # without a recorded size nothing says groups of two: the ranks stay one group
    unsized = [SimpleNamespace(group_size=np.array([-1, -1])) for _ in range(4)]
    assert commgroups._partition(unsized, where, [0, 1, 2, 3], {}) == [([[0, 1, 2, 3]], "one")]


def test_comms_id_lines_collectives_up_where_their_order_does_not(tmp_path):
    """The profiler missed one of rank 1's all-gathers: by order, every later collective of that step on
    rank 1 pairs with the wrong one of rank 0's; by Comms Id each pairs with its own."""
    def drop_one(folder):
        path = folder / "rank1.trace.json.gz"
        trace = json.loads(gzip.decompress(path.read_bytes()))
        events = trace["traceEvents"]
        first = next(i for i, e in enumerate(events) if e.get("cat") == "kernel" and "AllGather" in e["name"]
                     and e["args"].get("Comms Id") == dropped)
        del events[first]
        path.write_bytes(gzip.compress(json.dumps(trace).encode()))

    results = {}
    for with_id in (True, False):
        folder = mesh_job(dp=2, tp=1, comms_id=True, pg_names=False, listed=False).write(tmp_path / str(with_id))
        trace0 = json.loads(gzip.decompress((folder / "rank0.trace.json.gz").read_bytes()))
        gathers = [e for e in trace0["traceEvents"] if e.get("cat") == "kernel" and "AllGather" in e["name"]]
        dropped = gathers[len(gathers) // 2]["args"]["Comms Id"]  # one in the middle step
        drop_one(folder)
        if not with_id:
            for r in (0, 1):
                path = folder / f"rank{r}.trace.json.gz"
                trace = json.loads(gzip.decompress(path.read_bytes()))
                for e in trace["traceEvents"]:
                    e.get("args", {}).pop("Comms Id", None)
                path.write_bytes(gzip.compress(json.dumps(trace).encode()))
        results[with_id] = analyze_paths([str(folder)], jobs=1).job.view.matched
    by_id, by_order = results[True], results[False]
    assert by_id.by == "Comms Id" and by_order.by == "order within the step"
    # by Comms Id: every collective but the missed one lined up, each ending together on both ranks
    assert len(by_id) == 17 and by_id.unmatched == 1
    ends = by_id.arrival + by_id.dur
    assert np.abs(ends[0] - ends[1]).max() < 1.0
    # by order, the step with the missed one pairs different collectives: fewer lined up, or ends apart
    ends = by_order.arrival + by_order.dur
    assert len(by_order) < 17 or np.abs(ends[0] - ends[1]).max() > 100.0


def test_a_cuda_graphs_kernels_go_to_the_ops_captured_into_it(tmp_path):
    path = graphed_training().write(tmp_path / "graphed.json.gz")
    model = load_trace(path, cache=False)
    c = captured(model)
    assert c.graph_ops == 9 and c.unmapped == 0
    ops, sources = attribute(model, c.calls)
    kernels = model.gpu.loc[c.calls.index, "name"].astype(str).str[:4].tolist()
    assert list(zip(kernels, ops, sources))[:3] == [("ampe", "aten::mm", "train.py(12): forward"),
                                                    ("ampe", "aten::mm", "train.py(15): backward_step"),
                                                    ("nccl", "record_param_comms", "train.py(16): backward_step")]
    names = model.cpu.set_index("external_id")["name"].astype(str)
    assert set(names.loc[kernels_by_op(model)["op_external_id"]]) == {"aten::mm", "record_param_comms"}
    report = analyze_paths([str(path)], jobs=1)[0]
    assert any(n.startswith("9 GPU ops ran from CUDA graphs: each is attributed to the op captured") for n in report.notes)
    rows = rank_collectives(report.model, report.metrics)
    assert rows.phase == ["backward"] * 3 and rows.step.tolist() == [0, 1, 2]  # captured in backward, replayed per step


def test_a_graph_captured_before_the_trace_keeps_its_replay(tmp_path):
    path = graphed_training(in_trace=False).write(tmp_path / "graphed.json.gz")
    model = load_trace(path, cache=False)
    assert captured(model).unmapped == 9
    names = model.cpu.set_index("external_id")["name"].astype(str)
    assert set(names.loc[kernels_by_op(model)["op_external_id"]]) == {"CUDAGraph::replay"}
    report = analyze_paths([str(path)], jobs=1)[0]
    assert rank_collectives(report.model, report.metrics).phase == ["graph"] * 3
    assert any("captured before the trace began" in n for n in report.notes)


def test_the_job_replay_gives_the_trace_back_and_hiding_a_groups_transfer_shortens_it(mesh2x2):
    v = mesh2x2.job.view
    assert job_saving_pct(v, {}) == pytest.approx(0.0, abs=1e-6)
    m = v.matched
    tp = np.flatnonzero([s == "tp" for s in m.scheme])
    every = job_saving_pct(v, {}, hidden=np.arange(len(m)))
    assert 0.0 < job_saving_pct(v, {}, hidden=tp) < every


def test_group_comm_advises_in_the_groups_terms(tmp_path):
    reports = job_of(tmp_path, compute_us=2_000, allreduce_us=2_000)
    found = {f.rule: f for f in all_findings(reports)}
    assert "GA131" not in found  # comm-overlap leaves a mesh to group-comm
    f = found["GA137"]
    assert f.message.startswith("The mesh_tp groups (tensor parallel), ranks [0, 1] [2, 3], hold the job's step")
    assert "sequence parallelism" in f.advice and "inside a node" in f.advice
    fsdp = {f.rule: f for f in all_findings(job_of(tmp_path, "fsdp", dp=2, tp=1, compute_us=1_000, allgather_us=2_000))}
    assert fsdp["GA137"].advice.startswith("FSDP: prefetch the next blocks' all-gathers")


@pytest.mark.parametrize("policies, advised", [
    ([], True),  # no run.json: nothing says how the gradients are reduced
    ([{"param_dtype": None, "reduce_dtype": None}], True),  # a policy that leaves both unset: fp32
    ([{"param_dtype": "torch.bfloat16", "reduce_dtype": None}], False),  # unset reduce_dtype: param_dtype's
    ([{"param_dtype": "torch.bfloat16", "reduce_dtype": "None"}], False),  # as run.json files of before wrote it
    ([{"param_dtype": "torch.bfloat16", "reduce_dtype": "torch.float32"}], True),
    ([{"param_dtype": None, "reduce_dtype": "torch.bfloat16"}, {"param_dtype": None, "reduce_dtype": None}], True),
    ([{"param_dtype": None, "reduce_dtype": "torch.bfloat16"}], False),
])
def test_group_comm_asks_for_bf16_gradient_reduction_only_where_the_gradients_are_reduced_in_fp32(policies, advised):
    from gpuadvise.rules.group_comm import _advice

    facts = {"distributed": {"fsdp": {"fully_shard": [{"module": "Block", **p} for p in policies]}}} if policies else {}
    advice = _advice({"scheme": "fsdp"}, {"scheme": "fsdp", "collective": "reduce_scatter", "phase": "backward"}, facts,
                     None)
    assert ("reduce_dtype=torch.bfloat16" in advice) == advised, advice


def test_run_json_writes_a_mixed_precision_dtype_left_unset_as_null():
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from gpuadvise.harness.facts import distributed

    distributed.reset()
    try:
        distributed._record_fully_shard("Block", {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)},
                                        "train.py:10")
        (shard,) = json.loads(json.dumps(distributed._FULLY_SHARD))
    finally:
        distributed.reset()
    assert (shard["param_dtype"], shard["reduce_dtype"]) == ("torch.bfloat16", None)


def test_a_mesh_job_merged_into_one_file_has_the_groups_of_its_rank_files(tmp_path):
    folder = mesh_job(dp=2, tp=2, steps=3).write(tmp_path / "apart")
    traces = [json.loads(gzip.decompress((folder / f"rank{r}.trace.json.gz").read_bytes())) for r in range(4)]
    (tmp_path / "merged.json").write_text(json.dumps(tracelens_merge(traces)))
    apart = analyze_paths([str(folder)], jobs=1).job.view
    merged = analyze_paths([str(tmp_path / "merged.json")], jobs=1).job.view
    assert ranks_of(merged) == {"mesh_dp (FSDP)": [[0, 2], [1, 3]], "mesh_tp (tensor parallel)": [[0, 1], [2, 3]]}
    assert merged.to_dict()["groups"] == apart.to_dict()["groups"] and merged.mesh_words() == apart.mesh_words()

"""Several GPUs in one trace file.

A job's ranks merged into one file, as AMD's TraceLens merges them (fixtures/merged.py: no header, pids
and correlation ids moved per rank, processes named `RANK r - CPU/GPU`), are analysed as the job they
are: the same job table, straggler and comm-overlap findings as the same ranks given one file each. One
process driving several GPUs gets each GPU's figures, and its busy share is the average device's, not the
union of their busy time. A trace that does not name its GPU is named from its kernels.
"""

from __future__ import annotations

import json

import pytest

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.model.devices import from_kernels
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.read.merged import split_ranks
from gpuadvise.analyzer.report import json as json_report, text
from gpuadvise.analyzer.run import analyze
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.merged import (DP_BACKWARD_US, DP_FORWARD_US, DP_SCATTER_US, dataparallel_gpus, merged_job,
                                       tracelens_merge)
from gpuadvise.rules import find_rule


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The merged job analysed from its one file and from its rank files: (merged, apart, folder)."""
    d = tmp_path_factory.mktemp("merged")
    made = merged_job()
    merged = analyze([str(made.write(d / "merged.json.gz"))], jobs=1)
    apart = analyze([str(made.write_ranks(d / "ranks"))], jobs=1)
    return merged, apart, d, made


def _rows(reports) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "trace"} for row in reports.job.view.per_rank()]


def _findings(found) -> list[tuple]:
    return [(f.rule, f.rank, f.severity, f.message, round(f.impact.est_step_saving_pct, 1)) for f in found]


def test_a_merged_job_is_the_job_its_rank_files_are(job):
    merged, apart, _, _ = job
    assert merged.job is not None and apart.job is not None
    assert [r.rank for r in merged] == [0, 1, 2, 3]
    assert _rows(merged) == _rows(apart)
    assert merged.job.view.to_dict()["straggler_per_step"] == apart.job.view.to_dict()["straggler_per_step"]
    assert merged.job.view.to_dict()["collectives"] == apart.job.view.to_dict()["collectives"]
    assert _findings(merged.job.findings) == _findings(apart.job.findings)
    # and every rank's own findings and figures are its own file's
    for m, a in zip(merged, apart):
        assert _findings(m.findings) == _findings(a.findings)
        assert (m.figures.median_step_ms, m.figures.gpu_busy_in_steps_pct, m.figures.kernels, m.figures.step_numbers) \
            == (a.figures.median_step_ms, a.figures.gpu_busy_in_steps_pct, a.figures.kernels, a.figures.step_numbers)


def test_the_merged_job_names_its_straggler_and_its_exposed_communication(job):
    merged, _, _, _ = job
    rules = {f.topic: f for f in merged.job.findings}
    assert rules["straggler"].rank == 3  # the rank that computes 1.5× as long: the others wait for it
    assert {s["rank"] for s in merged.job.view.to_dict()["straggler_per_step"]} == {3}
    assert "comm-overlap" in rules
    assert any("the file holds 4 ranks of one job" in n and "TraceLens" in n for n in merged[0].notes)


def test_the_text_report_has_the_job_table_and_names_the_gpu_from_its_kernels(job):
    merged, _, _, _ = job
    out = text.render(merged)
    assert "job: 4 ranks, 4 steps compared" in out
    assert out.count("(rank ") >= 4
    assert "an AMD CDNA 3 GPU, named from its kernels (ISA942)" in out
    assert "not named in the trace" not in out


def test_a_merge_without_process_names_numbers_the_ranks_by_process(job):
    """An older TraceLens wrote no `RANK r` names: the processes that launch GPU work are the ranks, in
    process-id order (the merge moves rank r's ids by r × 10^k, so that order is the ranks')."""
    merged, _, d, made = job
    data = made.merged()
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("name") not in ("process_name", "process_sort_index")]
    path = d / "unnamed.json"
    path.write_text(json.dumps(data))
    unnamed = analyze([str(path)], jobs=1)
    assert _rows(unnamed) == _rows(merged)
    assert any("no name says their ranks" in n for n in unnamed[0].notes)


def test_one_process_is_never_split(tmp_path):
    one = find_rule("straggler").negative()  # a job folder: one trace per rank
    path = one.ranks[0].write(tmp_path / "rank0.json")
    assert split_ranks(load_trace(path, cache=False)) is None


def test_a_merged_file_keeps_its_ranks_apart_where_their_ids_collide(tmp_path):
    """Ranks on two nodes share device and stream ids (GPU 0, stream 7 on both): the merge's moved
    correlation ids still give each kernel its rank."""
    made = merged_job(ranks=2, straggler=1)
    for trace in made.ranks:
        for e in trace["traceEvents"]:
            if isinstance(e.get("args"), dict) and "device" in e["args"]:
                e["args"]["device"] = 0
    merged = tracelens_merge(made.ranks)
    path = tmp_path / "two_nodes.json"
    path.write_text(json.dumps(merged))
    split = split_ranks(load_trace(path, cache=False))
    assert split is not None and split.ranks == [0, 1]
    assert not any(split.left_out.values())
    kernels = [len(p.model.kernels) for p in split.parts]
    assert kernels[0] == kernels[1] == len(load_trace(path, cache=False).kernels) // 2


@pytest.fixture(scope="module")
def dataparallel(tmp_path_factory):
    path = dataparallel_gpus().write(tmp_path_factory.mktemp("dp") / "dp.json.gz")
    return analyze([str(path)], jobs=1)


def test_one_process_on_four_gpus_gets_each_gpus_figures(dataparallel):
    [r] = dataparallel
    s = r.figures
    assert [g.device for g in s.gpus] == [0, 1, 2, 3]
    step_us = 1e3 * s.median_step_ms
    replica_us = DP_SCATTER_US + DP_FORWARD_US + DP_BACKWARD_US  # all that GPUs 1-3 do in a step
    for g in s.gpus[1:]:
        assert g.busy_in_steps_pct == pytest.approx(100 * replica_us / step_us, abs=2.0)
        assert g.idle_ms == pytest.approx((step_us - replica_us) / 1e3, abs=0.2)
    assert s.gpus[0].busy_in_steps_pct > 90  # GPU 0 also scatters, gathers, reduces and steps the optimizer
    # the process's figure is the average GPU's, not the union (which GPU 0 alone fills)
    mean = sum(g.busy_in_steps_pct for g in s.gpus) / 4
    assert s.gpu_busy_in_steps_pct == pytest.approx(mean, abs=0.1)
    out = text.render(dataparallel)
    assert "4 GPUs, busy" in out and "GPU 3 busy" in out
    doc = json.loads(json_report.render(dataparallel))
    assert [g["device"] for g in doc["traces"][0]["gpus"]] == [0, 1, 2, 3]


def test_one_gpu_has_no_per_gpu_figures(job):
    _, apart, _, _ = job
    assert all(r.figures.gpus == [] for r in apart)
    doc = json.loads(json_report.render(apart))
    assert all("gpus" not in t for t in doc["traces"])


@pytest.mark.parametrize("name, vendor, arch", [
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_ISA942_IU1_K1", "amd", "CDNA 3"),
    ("Cijk_Alik_Bljk_SB_MT64x64x8_SN_1LDSB0_ISA90a_IU1_K1_WG8_8_1", "amd", "CDNA 2"),
    ("MIOpenBatchNormFwdTrainSpatial", "amd", None),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "nvidia", "Hopper"),
    ("volta_sgemm_128x64_nn", "nvidia", "Volta"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>", "nvidia", None),
    ("triton_poi_fused_add_0", None, None),
])
def test_kernel_names_say_the_vendor_and_family(name, vendor, arch):
    seen = from_kernels([name])
    assert (seen.vendor if seen else None, seen.arch if seen else None) == (vendor, arch)


def test_channels_last_names_miopen_on_an_amd_trace_without_device_properties(tmp_path):
    """The convolution library in the advice follows the GPU's vendor, told by the HIP runtime and the
    kernels when the trace has no deviceProperties (a merged trace has none)."""
    b = TraceBuilder(device=None, platform="rocm")
    for _ in range(3):
        with b.step():
            for ch in (3, 64):
                with b.op("aten::miopen_convolution", **{"Input Dims": [[64, ch, 56, 56], [64, ch, 3, 3]]}):
                    b.kernel("batched_transpose_32x16_float", 120)
                    b.kernel("igemm_fwd_gtcx3_nhwc_fp32_bx0_ex1_bt128x128x16_wt32x32x2_ws1x1_wr2x2", 400)
                    b.kernel("batched_transpose_16x32_float", 120)
                with b.op("aten::miopen_batch_norm"):
                    b.kernel("MIOpenBatchNormFwdTrainSpatial", 90)
            b.sync("hipStreamSynchronize")
    b.finish()
    model = load_trace(b.write(tmp_path / "amd.json"), cache=False)
    found = find_rule("channels-last").check(Analysis(model, compute(model)))
    assert found and "MIOpen's NHWC kernels" in found[0].message and "cuDNN" not in found[0].message

"""The device table (analyzer/model/devices.py): every architecture gets its vendor's numbers, each
trace of the shared corpus is matched to the right row by what its header records, and a GPU nobody
knows gets the stated fallback, never another GPU's peaks."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from _cli_support import REPO
from gpuadvise.analyzer.model import devices
from gpuadvise.analyzer.model.runfacts import describe_device
from gpuadvise.analyzer.model.trace import Device
from gpuadvise.fixtures.builder import TraceBuilder

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()


@pytest.mark.parametrize("name, cc, product, arch, matrix", [
    ("Tesla V100-SXM2-16GB", (7, 0), "V100 SXM2", "Volta", ("fp16",)),
    ("Tesla T4", (7, 5), "T4", "Turing", ("fp16",)),
    ("NVIDIA GeForce RTX 2080 Ti", (7, 5), "GeForce RTX 2080 Ti", "Turing", ("fp16",)),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "A100 SXM", "Ampere", ("tf32", "bf16", "fp16")),
    ("NVIDIA A10", (8, 6), "A10", "Ampere", ("tf32", "bf16", "fp16")),
    ("NVIDIA L4", (8, 9), "L4", "Ada", ("tf32", "bf16", "fp16", "fp8")),
    ("NVIDIA GeForce RTX 4090", (8, 9), "GeForce RTX 4090", "Ada", ("tf32", "bf16", "fp16", "fp8")),
    ("NVIDIA H100 80GB HBM3", (9, 0), "H100 SXM", "Hopper", ("tf32", "bf16", "fp16", "fp8")),
    ("NVIDIA H100 PCIe", (9, 0), "H100 PCIe", "Hopper", ("tf32", "bf16", "fp16", "fp8")),
    ("NVIDIA H200", (9, 0), "H200", "Hopper", ("tf32", "bf16", "fp16", "fp8")),
    ("NVIDIA B200", (10, 0), "B200", "Blackwell", ("tf32", "bf16", "fp16", "fp8")),
    ("Tesla P100-PCIE-16GB", (6, 0), "P100", "Pascal", ()),
    ("AMD Instinct MI210", (9, 0), "MI210", "CDNA 2", ("bf16", "fp16")),
    ("AMD Instinct MI250X", (9, 0), "MI250X (one GCD)", "CDNA 2", ("bf16", "fp16")),
    ("AMD Instinct MI300X", (9, 4), "MI300X", "CDNA 3", ("tf32", "bf16", "fp16", "fp8")),
])
def test_every_architecture_gets_its_row(name, cc, product, arch, matrix):
    row = devices.spec(Device(0, name, *cc))
    assert (row.product, row.arch, row.matrix_dtypes, row.matched) == (product, arch, matrix, "name")
    assert row.fp32 > 0 and row.memory_gbps > 0
    # the matrix units are never slower than the SIMT pipeline (GeForce TF32 only matches it: 4090, 3090)
    assert all(row.speedup(d) >= 1 for d in row.matrix_dtypes)


def test_tf32_and_bf16_differ_by_the_datasheet_ratio():
    h100, a100 = devices.spec(Device(0, "NVIDIA H100 80GB HBM3", 9, 0)), devices.spec(Device(0, "NVIDIA A100", 8, 0))
    assert (h100.speedup("tf32"), h100.speedup("bf16")) == (7.4, 14.8)  # 494.7 / 989.4 vs 66.9 TFLOP/s
    assert (a100.speedup("tf32"), a100.speedup("bf16")) == (8.0, 16.0)  # 156 / 312 vs 19.5
    assert h100.bf16 / h100.tf32 == pytest.approx(2.0, rel=0.01)


def test_an_unnamed_device_is_matched_by_its_architecture():
    row = devices.spec(Device(0, "Some Future Part", 8, 9))
    assert (row.arch, row.matched) == ("Ada", "architecture")
    amd = devices.spec(Device(0, "", 9, 4), platform="rocm")  # vLLM's ROCm traces leave the name empty
    assert (amd.product, amd.matched) == ("MI300X", "architecture")
    by_kernels = devices.spec(None, kernel_names=["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"])
    assert (by_kernels.arch, by_kernels.matched) == ("Hopper", "kernel names")


def test_an_unknown_gpu_gets_the_stated_fallback():
    for unknown in (None, Device(0, "Mystery Accelerator"), Device(0, "AMD Radeon RX 7900", 11, 0),
                    Device(0, "", 0, -1)):  # a damaged header's compute capability, below every architecture
        row = devices.spec(unknown)
        assert row is devices.FALLBACK or row.matched == "fallback"
        assert row.has_matrix_units is None and row.matrix_dtypes == () and row.speedup("bf16") is None


def test_the_40gb_a100_has_the_slower_memory():
    small = devices.spec(Device(0, "NVIDIA A100-PG509-200", 8, 0, total_memory=40 * 2**30))
    big = devices.spec(Device(0, "NVIDIA A100-SXM4-80GB", 8, 0, total_memory=80 * 2**30))
    assert small.memory_gbps == 1555 < big.memory_gbps


def test_pinned_bandwidth_follows_the_pcie_generation():
    h100, a100, v100 = (devices.spec(Device(0, n, *cc)) for n, cc in
                        (("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA A100", (8, 0)), ("Tesla V100", (7, 0))))
    assert (h100.pcie_gen, a100.pcie_gen, v100.pcie_gen) == (5, 4, 3)
    assert h100.pinned_copy_gbps > a100.pinned_copy_gbps > v100.pinned_copy_gbps == devices.FALLBACK.pinned_copy_gbps


# -- the corpus: each vendor and generation, read from the trace's own header ----------------------------
CORPUS_ROWS = {
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": "V100 SXM2",
    "hta/tests/data/trace_diff/test/test.json.gz": "V100 SXM2",
    "param/et_replay/tests/inputs/linear_kineto.json.gz": "GeForce RTX 2080 Ti",
    "hta/tests/data/nccl_parser_config/nccl_data.json.gz": "A100 SXM",
    "hta/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz": "P100",
    "h100/tf32-before/trace.json.gz": "H100 SXM",
    "hta/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": "MI250 (one GCD)",
    "tracelens/tests/traces/mi210/gpu_only_trace/gpu_only_trace.json.gz": "MI210",
    "tracelens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz": "MI300X",
    "tracelens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz": "MI300X",
}


def _header_device(path: Path) -> tuple[Device, str]:
    """The first deviceProperties entry and the platform, read from the file itself."""
    text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace") if path.suffix == ".gz" else path.read_text()
    m = re.search(r'"deviceProperties"\s*:\s*(\[.*?\])\s*[,}]', text, re.S)
    p = json.loads(m.group(1))[0]
    platform = "rocm" if re.search(r'"(hip_runtime_version|roctracer_version)"', text) or p.get("warpSize") == 64 else "cuda"
    return Device(0, p.get("name") or "", p.get("computeMajor"), p.get("computeMinor"), p.get("totalGlobalMem")), platform


@pytest.mark.parametrize("rel", sorted(CORPUS_ROWS))
def test_each_corpus_gpu_gets_its_row(rel):
    path = TRACES / rel
    if not path.is_file():
        pytest.skip(f"{path} not found")
    device, platform = _header_device(path)
    assert devices.spec(device, platform).product == CORPUS_ROWS[rel]


def test_the_device_line_says_sm_on_nvidia_and_compute_capability_on_amd(load_built):
    def line(**kw):
        b = TraceBuilder(**kw)
        with b.step():
            b.kernel("ampere_sgemm_128x64_nn", 100)
        b.finish()
        return describe_device(None, load_built(b), has_gpu=True)

    assert "sm 9.0" in line(device="NVIDIA H100 80GB HBM3", compute=(9, 0))
    amd = line(platform="rocm", device="AMD Instinct MI300X", compute=(9, 4))
    assert "compute capability 9.4" in amd and "sm " not in amd

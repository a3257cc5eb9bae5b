"""Run folders for the compare tests (test_compare.py, test_tui_compare.py): small builder traces of a
training loop in the variants a user would compare, each with the run.json `gpuadvise profile` writes.

- `stall`: a single-process DataLoader waits 20 ms per step, and `.item()` syncs every step;
- `fixed`: the same loop with DataLoader workers (the wait gone), `.item()` still there;
- `clean`: workers, no sync, fast TF32 GEMMs;
- `slow`: the clean loop with fp32 SIMT GEMMs twice as long (TF32 turned off: a regression).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuadvise.fixtures.builder import GEMM, TraceBuilder

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
SIMT_GEMM = "ampere_sgemm_128x64_nn"
A100 = "NVIDIA A100-SXM4-80GB"


def training(stall_us: float = 0.0, item: bool = False, gemm: str = GEMM, gemm_us: float = 300,
             device: str = A100, extra_kernel: str | None = None) -> TraceBuilder:
    b = TraceBuilder(device=device)
    for _ in range(4):
        with b.step():
            b.cpu(SINGLE if stall_us else MULTI, stall_us or 100)
            for _ in range(40):
                with b.op("aten::mm"):
                    b.kernel(gemm, gemm_us)
            if extra_kernel:
                b.kernel(extra_kernel, 50)
            if item:
                b.item()
            b.sync()
    b.finish()
    return b


def run_json(num_workers: int = 0, device: str = A100, script: str = "train.py", tf32: bool = True) -> dict:
    return {
        "script": script,
        "argv": [script, "--epochs", "1"],
        "environment": {"torch": "2.4.0+cu124", "cuda": "12.4", "python": "3.11.7", "cudnn": 90100,
                        "device": {"name": device, "capability": [8, 0], "total_memory": 85_899_345_920, "count": 1}},
        "settings": {"cudnn_benchmark": False, "matmul_allow_tf32": tf32},
        "dataloaders": [{"created_at": f"train.py:{40 + num_workers}", "num_workers": num_workers,
                         "pin_memory": num_workers > 0, "batch_size": 64, "prefetch_factor": 2 if num_workers else None,
                         "persistent_workers": num_workers > 0}],
        "optimizers": [{"class": "AdamW", "id": 140000000 + num_workers, "foreach": None, "fused": None, "params": 10}],
        "capture": {"state": "captured", "options": {"record_shapes": True, "with_stack": False},
                    "window": {"wait": 1, "warmup": 2, "active": 3}},
    }


VARIANTS = {
    "stall": (dict(stall_us=20_000, item=True), dict(num_workers=0)),
    "fixed": (dict(item=True), dict(num_workers=8)),
    "clean": (dict(), dict(num_workers=8)),
    "slow": (dict(gemm=SIMT_GEMM, gemm_us=600), dict(num_workers=8, tf32=False)),
}


def run_folder(root: Path, variant: str, name: str | None = None, facts: dict | None = None, **overrides) -> Path:
    """A run folder `root/<name>` of one variant: trace.json.gz and run.json."""
    trace_kw, facts_kw = VARIANTS[variant]
    folder = root / (name or variant)
    folder.mkdir(parents=True, exist_ok=True)
    training(**{**trace_kw, **overrides}).write(folder / "trace.json.gz")
    (folder / "run.json").write_text(json.dumps(facts if facts is not None else run_json(**facts_kw)))
    return folder

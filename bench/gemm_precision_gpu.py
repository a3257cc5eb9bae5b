"""Time GEMMs in fp32 (TF32 off), TF32 and bf16 on a CUDA GPU, without the profiler, next to the roofline
prediction gpuadvise makes for each precision fix (analyzer/measure/efficiency/roofline.py).

    python bench/gemm_precision_gpu.py                # on a machine with a CUDA GPU: JSON table on stdout
    python bench/gemm_precision_gpu.py --repeats 30   # more replays per median
    python bench/gemm_precision_gpu.py --roofline-only --device "NVIDIA H100 80GB HBM3"   # no GPU: the model only

Needs torch only; the predictions appear when gpuadvise imports. Each shape (M×K×N: an M×K times K×N
product) is timed as a CUDA graph of `--calls` back-to-back matmuls into preallocated outputs (so that
kernel time, not the Python launch rate, is measured: what a kernel takes inside a training step), on
enough operand sets in turn (256 MiB) that the weights come from memory rather than L2, with
CUDA events around each replay, after warm-up; the figure is the median replay over `--repeats`, divided
by the calls. A device-to-device copy of 1 GiB gives the memory bandwidth the GPU reaches. For each shape
the JSON has the measured µs per kernel in fp32, tf32 and bf16, and, from the fp32 time, what gpuadvise
predicts for TF32 and bf16 (`roofline_us`, the headline: the kernel as far from its roofline, bounded by
FLOPs/peak, bytes/bandwidth and the launch floor; `reached_us`, the top of the range: at its roofline) and
what the dense peak ratio alone would claim (`peak_ratio_us`). To refresh docs/accuracy.md from a new
measurement: `python bench/gemm_precision_gpu.py > bench/gemm_precision_h100.json` on the H100, then
`python bench/accuracy.py -o docs/accuracy.md`. Runs in well under a minute on an H100. On a
machine without CUDA it exits 2 with one line saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPES = [  # (M, K, N)
    (16, 16, 16),
    (8, 1024, 1024),
    (8, 4096, 4096),
    (64, 1024, 1024),
    (512, 512, 512),
    (2048, 2048, 2048),
    (8192, 8192, 64),
    (4096, 11008, 4096),
    (8192, 8192, 8192),
    (8, 2048, 1408),  # 8 tokens through an MoE expert's projection
]
MODES = ("fp32", "tf32", "bf16")
L2_DEFEAT_BYTES = 256 * 2**20


def predictor(device_name: str, major: int | None = None, minor: int | None = None):
    """gpuadvise's roofline for this device, or None when gpuadvise does not import."""
    try:
        from gpuadvise.analyzer.measure.efficiency import roofline
        from gpuadvise.analyzer.model.devices import spec
        from gpuadvise.analyzer.model.trace import Device
    except ImportError:
        return None
    row = spec(Device(0, device_name, major, minor))

    def predict(mkn, fp32_us: float) -> dict:
        out = {"device_row": row.describe()}
        for dtype in ("tf32", "bf16"):
            b = roofline.attainable(mkn, row, dtype)
            peak = roofline.peak_speedup(row, dtype)
            out[dtype] = {
                "roofline_us": _r(roofline.predicted_us(fp32_us, mkn, row, dtype)),
                "reached_us": _r(roofline.reached_us(fp32_us, mkn, row, dtype)),
                "peak_ratio_us": _r(fp32_us / peak) if peak else None,
                "limited_by": b.limiter if b is not None else None,
                "hardware_bound_us": _r(roofline.bound(mkn, row, dtype).us) if b is not None else None,
            }
        fp32 = roofline.attainable(mkn, row, "fp32")
        out["fp32_attainable_us"] = _r(fp32.us) if fp32 is not None else None
        return out

    return predict


def _r(x):
    return None if x is None else round(float(x), 2)


def time_shape(torch, m: int, k: int, n: int, mode: str, calls: int, repeats: int) -> float:
    """Median µs per matmul kernel of an (m×k)·(k×n) product in `mode`."""
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    flops = 2.0 * m * k * n
    # large products: fewer calls per replay keep the run short
    calls = max(1, min(calls, int(1e13 / max(flops, 1.0))))
    # enough operand sets, used in turn, that they do not all stay in L2 (50 MB on an H100): each call reads
    # its weight from memory, as a layer of a model does
    size = (m * k + k * n + m * n) * (2 if mode == "bf16" else 4)
    sets = max(1, min(calls, -(-L2_DEFEAT_BYTES // size)))
    ops = [(torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype),
            torch.empty(m, n, device="cuda", dtype=dtype)) for _ in range(sets)]

    def calls_once():
        for i in range(calls):
            a, b, c = ops[i % sets]
            torch.matmul(a, b, out=c)

    for _ in range(3):
        calls_once()
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            calls_once()  # cuBLAS sets up its workspace outside the capture
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=s):
                calls_once()
        torch.cuda.current_stream().wait_stream(s)
        run = g.replay
    except Exception:  # noqa: BLE001 - a build without graph capture: back-to-back launches instead
        run = calls_once
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    torch.backends.cuda.matmul.allow_tf32 = False
    return statistics.median(times)


def copy_bandwidth(torch, gib: float = 1.0, repeats: int = 10) -> float:
    """GB/s of a device-to-device copy (read + write counted)."""
    n = int(gib * 2**30 / 4)
    x = torch.empty(n, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n * 4 / statistics.median(times) / 1e9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15, help="replays per median (default 15)")
    p.add_argument("--calls", type=int, default=50, help="matmuls per replay for small shapes (default 50)")
    p.add_argument("--roofline-only", action="store_true", help="no GPU: print the model's predictions only, "
                   "taking each fp32 kernel at its attainable fp32 roofline")
    p.add_argument("--device", action="append", help="with --roofline-only: a device name (repeatable; default "
                   "the A100 SXM and H100 SXM rows)")
    args = p.parse_args(argv)
    if args.roofline_only:
        rows = []
        for name in args.device or ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]:
            predict = predictor(name)
            if predict is None:
                print("gemm_precision_gpu: --roofline-only needs gpuadvise importable", file=sys.stderr)
                return 2
            for m, k, n in SHAPES:
                fp32 = predict((1, m, k, n), 0.0)["fp32_attainable_us"]
                rows.append({"device": name, "shape": f"{m}x{k}x{n}", "fp32_us": fp32, **predict((1, m, k, n), fp32)})
        print(json.dumps({"mode": "roofline-only", "rows": rows}, indent=1))
        return 0
    try:
        import torch
    except ImportError:
        print("gemm_precision_gpu: torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gemm_precision_gpu: no CUDA GPU here (torch.cuda.is_available() is False); run it on a GPU machine",
              file=sys.stderr)
        return 2
    t0 = time.time()
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    predict = predictor(name, major, minor)
    rows = []
    for m, k, n in SHAPES:
        measured = {mode: _r(time_shape(torch, m, k, n, mode, args.calls, args.repeats)) for mode in MODES}
        row = {"shape": f"{m}x{k}x{n}", "gflop": round(2.0 * m * k * n / 1e9, 4), "measured_us": measured,
               "measured_speedup": {d: _r(measured["fp32"] / measured[d]) for d in ("tf32", "bf16")}}
        if predict is not None:
            row["predicted_from_fp32"] = predict((1, m, k, n), measured["fp32"])
        rows.append(row)
        print(f"{row['shape']:>16}: fp32 {measured['fp32']:>10.2f} µs  tf32 {measured['tf32']:>10.2f}  "
              f"bf16 {measured['bf16']:>10.2f}", file=sys.stderr)
    out = {"device": name, "capability": f"{major}.{minor}", "torch": torch.__version__,
           "cuda": torch.version.cuda, "copy_gbps": round(copy_bandwidth(torch), 1),
           "method": f"CUDA graph of back-to-back matmuls, CUDA events, median of {args.repeats} replays",
           "gpuadvise": predict is not None, "rows": rows, "seconds": round(time.time() - t0, 1)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

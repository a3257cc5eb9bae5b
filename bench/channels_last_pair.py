"""Measure what `channels_last` saves a ResNet-50 training step, and record a trace of each variant.

    python bench/channels_last_pair.py --out DIR [--batch 64] [--steps 30] [--amp]

For each variant (`nchw`: the default contiguous tensors; `channels_last`: model and inputs in
`torch.channels_last`) in its own fresh model: the mean step time over `--steps` steps after 10 warm-up
steps, with one `torch.cuda.synchronize()` at each end and no profiler; then 3 steps under
`torch.profiler` (CPU + CUDA activity, record_shapes) written to DIR/VARIANT.trace.json.gz. DIR/pair.json
holds both step times and the measured saving (1 − channels_last/nchw). `gpuadvise analyze
DIR/nchw.trace.json.gz` should name `channels-last` with a prediction near that saving; on
DIR/channels_last.trace.json.gz it should not fire. Needs a CUDA GPU; torchvision's resnet50 when
installed, else the same bottleneck architecture built here.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time

import torch
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> nn.Module:
    try:
        from torchvision.models import resnet50 as tv

        return tv(num_classes=classes)
    except ImportError:
        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
        return nn.Sequential(*layers)


def run(variant: str, a, device: str) -> float:
    torch.manual_seed(0)
    fmt = torch.channels_last if variant == "channels_last" else torch.contiguous_format
    model = resnet50().to(device).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, a.size, a.size, device=device).to(memory_format=fmt)
    y = torch.randint(0, 1000, (a.batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=a.amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(10):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / a.steps
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    raw = os.path.join(a.out, f"{variant}.trace.json")
    with torch.profiler.profile(activities=acts, record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(raw)) as prof:
        for _ in range(5):
            step()
            prof.step()
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)
    return ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--amp", action="store_true", help="bf16 autocast in both variants")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cudnn.benchmark = False  # cuDNN's heuristics, as a default script runs
    out = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "batch": a.batch, "size": a.size, "amp": a.amp, "steps": a.steps}
    for variant in ("nchw", "channels_last"):
        out[f"{variant}_step_ms"] = round(run(variant, a, device), 3)
    out["measured_saving_pct"] = round(100.0 * (1 - out["channels_last_step_ms"] / out["nchw_step_ms"]), 1)
    with open(os.path.join(a.out, "pair.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""ResNet-50 training on synthetic GPU data: NCHW or channels_last, fp32 or bf16 autocast."""
import argparse, torch, torchvision
p = argparse.ArgumentParser()
p.add_argument("--channels-last", action="store_true")
p.add_argument("--amp", action="store_true")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch", type=int, default=64)
a = p.parse_args()
dev = "cuda"
model = torchvision.models.resnet50().to(dev)
fmt = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(memory_format=fmt)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(a.batch, 3, 224, 224, device=dev).to(memory_format=fmt)
y = torch.randint(0, 1000, (a.batch,), device=dev)
import json, sys
ev = None
for step in range(a.steps):
    if step == 10:
        torch.cuda.synchronize(); ev = torch.cuda.Event(enable_timing=True); ev.record()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.amp):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
end = torch.cuda.Event(enable_timing=True); end.record(); torch.cuda.synchronize()
if ev is not None:
    print("TIMING", json.dumps({"script": "resnet50", "channels_last": a.channels_last, "amp": a.amp, "batch": a.batch, "step_ms": ev.elapsed_time(end) / (a.steps - 10)}), file=sys.stderr)

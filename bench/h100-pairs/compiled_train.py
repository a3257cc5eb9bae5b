"""A compiled MLP-block model; --graph-break forces a break in forward. --plain-trace F records
steps 0-5 (the first compile included) with plain torch.profiler, as a user would."""
import argparse, torch, torch.nn as nn
p = argparse.ArgumentParser()
p.add_argument("--graph-break", action="store_true")
p.add_argument("--steps", type=int, default=30)
p.add_argument("--plain-trace", default=None)
a = p.parse_args()

class Block(nn.Module):
    def __init__(self, d):
        super().__init__(); self.ln = nn.LayerNorm(d); self.fc1 = nn.Linear(d, 4 * d); self.fc2 = nn.Linear(4 * d, d)
    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))

class Net(nn.Module):
    def __init__(self, d=512, n=8, brk=False):
        super().__init__(); self.blocks = nn.ModuleList(Block(d) for _ in range(n)); self.brk = brk; self.head = nn.Linear(d, d)
    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = b(x)
            if self.brk and i == len(self.blocks) // 2:
                torch._dynamo.graph_break()
        return self.head(x)

torch.manual_seed(0)
model = Net(brk=a.graph_break).cuda()
cmodel = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randn(32, 256, 512, device="cuda"); y = torch.randn(32, 256, 512, device="cuda")

def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(cmodel(x).float(), y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()

if a.plain_trace:
    from torch.profiler import profile, ProfilerActivity, schedule
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], ) as prof:
        for _ in range(4):
            step()
    prof.export_chrome_trace(a.plain_trace)
else:
    import json, sys
    for i in range(a.steps):
        if i == 10:
            torch.cuda.synchronize(); ev = torch.cuda.Event(enable_timing=True); ev.record()
        step()
    end = torch.cuda.Event(enable_timing=True); end.record(); torch.cuda.synchronize()
    print("TIMING", json.dumps({"script": "compiled", "graph_break": a.graph_break, "step_ms": ev.elapsed_time(end) / (a.steps - 10)}), file=sys.stderr)

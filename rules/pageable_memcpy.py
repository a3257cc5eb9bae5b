"""pageable-memcpy: host↔device copies from or to pageable (not page-locked) memory.

## What it detects
`Memcpy HtoD (Pageable -> Device)` and `Memcpy DtoH (Device -> Pageable)` copies. The GPU's DMA
engine can only read page-locked memory, so CUDA first stages pageable data through a pinned buffer:
the copy runs at a fraction of PCIe bandwidth, and `cudaMemcpyAsync` returns only when the data is
staged, so the CPU waits and `non_blocking=True` has no effect.

## Why it matters
Each such copy blocks the training thread and serialises with the GPU stream, so the CPU cannot queue
the next kernels while the copy runs. Pinned memory plus `non_blocking=True` lets the copy overlap
with compute and with the CPU's next launches.

## Fix
```python
loader = DataLoader(dataset, batch_size=bs, num_workers=4, pin_memory=True)  # batches in pinned memory
for x, y in loader:
    x = x.to("cuda", non_blocking=True)  # async copy, overlaps with compute
    y = y.to("cuda", non_blocking=True)
```
For device→host results, copy into a preallocated pinned buffer
(`buf = torch.empty(shape, pin_memory=True); buf.copy_(t, non_blocking=True)`) and synchronise once,
where the value is really needed.

## Thresholds
Any pageable host↔device copy inside the profiled steps (Nsight Systems' `cuda_memcpy_async` rule
flags every one). Severity follows the predicted saving.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.metrics import attribute
from gpuadvise.analyzer.measure.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from .base import Rule


class PageableMemcpy(Rule):
    code = "GA103"
    name = "pageable-memcpy"
    topic = "pageable-memcpy"
    title = "Host↔device copies use pageable memory"
    thresholds = {"min_copies": 1}

    def check(self, a: Analysis):
        m = a.metrics
        c = m.copies
        if c.empty:
            return []
        pageable = c[((c["src"] == "Pageable") | (c["dst"] == "Pageable")) & c["direction"].isin(["HtoD", "DtoH"])]
        if m.steps:
            pageable = pageable[pageable["step"] >= 0]
        if len(pageable) < self.thresholds["min_copies"]:
            return []
        corr = set(pageable["correlation"])
        rt = a.model.runtime
        calls = rt[rt["correlation"].isin(corr)]
        ext = set(calls["external_id"]) - {-1, 0}

        def unblock(cl):
            # the copies themselves, and the syncs issued by the same op (aten::copy_ with non_blocking=False)
            return (cl["correlation"].isin(corr) | (cl["blocking"] & cl["external_id"].isin(ext))).to_numpy()

        saving, basis = a.predicted_saving(Scenario("pinned memory + non_blocking copies", unblock=unblock))
        if saving is None:
            saving, basis = 0.0, "no GPU timeline to replay"
        ops, sources = attribute(a.model, calls.head(200))
        by_dir = pageable.groupby(["direction", "src", "dst"]).agg(count=("dur", "size"), bytes=("bytes", "sum"),
                                                                  total_us=("dur", "sum")).reset_index()
        items = [{"name": f"Memcpy {r.direction} ({r.src} -> {r.dst})", "count": int(r.count),
                  "MiB": round(float(r.bytes) / 2**20, 2), "total_ms": a.ms(r.total_us),
                  "GB/s": round(float(r.bytes) / max(r.total_us, 1e-9) / 1e3, 2)} for r in by_dir.itertuples()]
        nsteps = max(len(m.steps), 1)
        message = (f"{len(pageable)} host↔device copies ({pageable['bytes'].sum() / 2**20:.1f} MiB, "
                   f"{pageable['dur'].sum() / 1e3:.2f} ms of copy time, {len(pageable) / nsteps:.1f} per step) go through "
                   "pageable host memory, so each one blocks the CPU until the data is staged.")
        op_names = sorted({o for o in ops if o})
        evidence = Evidence(
            steps=sorted({int(s.number) for s in m.steps}) if m.steps else [],
            time_ranges_ms=[(a.rel_ms(t), a.rel_ms(e)) for t, e in zip(pageable["ts"].head(6), pageable["end"].head(6))],
            items=items,
            sources=sorted({s for s in sources if s}),
            numbers={"copies": int(len(pageable)), "bytes": int(pageable["bytes"].sum()),
                     "copy_ms": a.ms(pageable["dur"].sum()), "issued_by": op_names[:5]},
        )
        advice = "Pin the host side of these copies and make them asynchronous."
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice)]

    def positive(self) -> TraceBuilder:
        return _loop(src="Pageable", copy_us=6_000)

    def negative(self) -> TraceBuilder:
        return _loop(src="Pinned", copy_us=3_000)  # pinned copies run at full PCIe speed


def _loop(src: str, copy_us: float) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            with b.op("aten::copy_"):
                b.copy("HtoD", src, "Device", nbytes=64 << 20, dur=copy_us)
            for _ in range(20):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 400)
            b.sync()
    b.finish()
    return b


RULE = PageableMemcpy()

"""pageable-memcpy: host↔device copies from or to pageable (not page-locked) memory.

## What it detects
`Memcpy HtoD (Pageable -> Device)` and `Memcpy DtoH (Device -> Pageable)` copies. The GPU's DMA
engine can only read page-locked memory, so CUDA first stages pageable data through a pinned buffer:
the copy runs at a fraction of PCIe bandwidth, and `cudaMemcpyAsync` returns only when the data is
staged, so the CPU waits and `non_blocking=True` has no effect.

## Why it matters
Each such copy blocks the training thread and serialises with the GPU stream, so the CPU cannot queue
the next kernels while the copy runs, and the staging makes the copy itself slow (on the H100 pairs,
a 50 MB pageable batch took 5.1 ms at 9.8 GB/s; pinned, 0.9 ms at 55 GB/s). Pinned memory plus
`non_blocking=True` lets the copy run at full PCIe speed while the CPU goes on launching work.

## Fix
```python
loader = DataLoader(dataset, batch_size=bs, pin_memory=True)  # batches in pinned memory
for x, y in loader:
    x = x.to("cuda", non_blocking=True)  # async copy, overlaps with compute
    y = y.to("cuda", non_blocking=True)
```
For device→host results, copy into a preallocated pinned buffer
(`buf = torch.empty(shape, pin_memory=True); buf.copy_(t, non_blocking=True)`) and synchronise once,
where the value is really needed.

## Thresholds
Any pageable host↔device copy inside the profiled steps (Nsight Systems' `cuda_memcpy_async` rule
flags every one). Severity follows the predicted saving. When the calls spend at least 1 % of step time
before their copies start in the median step (waiting for the GPU to reach them: implicit syncs, which
host-sync counts too), the message gives the thread time they hold in the median step, not only the copy time, and, when the
replay predicts under 1 % from ending the waits (host-sync's threshold, so host-sync stays quiet too),
says the GPU side paces the steps. The replay frees the CPU from each copy and
gives the copy the time a pinned one of its size takes: bytes at the bandwidth of the trace's own
large (≥ 1 MiB) pinned copies in that direction, or, without any, at what the GPU's PCIe generation
delivers (`devices.Spec.pinned_copy_gbps`: ~50 GB/s PCIe 5, ~25 PCIe 4, ~12 PCIe 3), plus 5 µs, never
more than now. With the bandwidth guessed from the generation, the range goes down to half of it.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.basics.gpuwaits import gpu_waits
from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.basics.source_lines import attribute
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import TraceBuilder

from gpuadvise.analyzer.measure.settings.switches_on import is_on

from .base import Rule


COPY_LATENCY_US = 5.0  # a copy's fixed cost on top of its bytes
MIN_REFERENCE_BYTES = 1 << 20  # smaller pinned copies are latency-bound: they do not show the bandwidth


class PageableMemcpy(Rule):
    code = "GA103"
    name = "pageable-memcpy"
    title = "Host↔device copies use pageable memory"
    thresholds = {"min_copies": 1, "min_wait_share_pct": 1.0}
    fix_facts = ("dataloader[*].pin_memory", "framework.settings.dataloader_pin_memory")

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

        gbps, where = _pinned_bandwidth(a, pageable)
        pcorr = set(pageable["correlation"])

        def pinned_time(gbps):
            def new_dur(o):
                bytes_ = o["bytes"].to_numpy(dtype=float)
                dur = o["dur"].to_numpy(dtype=float)
                fast = np.minimum(dur, np.nan_to_num(bytes_) / (gbps * 1e3) + COPY_LATENCY_US)
                return np.where(o["correlation"].isin(pcorr).to_numpy(), fast, np.nan)
            return new_dur

        saving, basis = a.predicted_saving(Scenario(f"pinned memory + non_blocking copies at {gbps:.0f} GB/s",
                                                    unblock=unblock, gpu_time=pinned_time(gbps)))
        span = None
        if saving is None:
            saving, basis = 0.0, "no GPU timeline to replay"
        else:
            basis += f"; pinned bandwidth {where}"
            if where.startswith("expected"):
                low = a.predicted_saving(Scenario("half the bandwidth", unblock=unblock, gpu_time=pinned_time(gbps / 2)))[0]
                if low is not None:
                    span = (low, saving)
                    basis += f"; {low:.0f} % if the link gives half of that"
        ops, sources = attribute(a.model, calls.head(200))
        by_dir = pageable.groupby(["direction", "src", "dst"]).agg(count=("dur", "size"), bytes=("bytes", "sum"),
                                                                  total_us=("dur", "sum")).reset_index()
        items = [{"name": f"Memcpy {r.direction} ({r.src} -> {r.dst})", "count": int(r.count),
                  "MiB": round(float(r.bytes) / 2**20, 2), "total_ms": a.ms(r.total_us),
                  "GB/s": round(float(r.bytes) / max(r.total_us, 1e-9) / 1e3, 2)} for r in by_dir.itertuples()]
        held_ps, waiting_ps = _thread_time(m, pageable, calls)  # per step, in per_step order
        held_us, waiting_us = perstep.median(held_ps), perstep.median(waiting_ps)  # the header's statistic
        step_us = max(float(m.median_step_us), 1e-9)
        per_step = perstep.median(perstep.issued(m, calls.drop_duplicates("correlation")["ts"]))
        count = f", {perstep.a_median(m)}{perstep.count_text(per_step)} per step" if m.steps else ""  # else: all of them, above
        one = len(pageable) == 1
        message = (f"{perstep.count_of(len(pageable), 'host↔device copy', 'host↔device copies')} "
                   f"({pageable['bytes'].sum() / 2**20:.1f} MiB, {pageable['dur'].sum() / 1e3:.2f} ms of copy time{count}) "
                   f"go{'es' if one else ''} through pageable host memory, so "
                   f"{'it blocks' if one else 'each one blocks'} the CPU until the data is staged.")
        if 100 * waiting_us / step_us >= self.thresholds["min_wait_share_pct"]:
            # a few µs of copying can hold the thread for milliseconds: say so, or the copy time hides it
            of = (f"{perstep.a_median(m)}{held_us / 1e3:.2f} ms of {perstep.each_step(m)} {step_us / 1e3:.1f} ms step" if m.steps else
                  f"{held_us / 1e3:.2f} ms of the {step_us / 1e3:.1f} ms traced window")
            message += (f" Their calls hold the training thread {of} ({100 * held_us / step_us:.1f}%), "
                        f"{waiting_us / 1e3:.2f} ms of it waiting for earlier GPU work before the copy could start: "
                        "implicit syncs")
            if basis.startswith("critical-path") and saving < 1.0 and _waits_on_other_ranks(a):
                # one rank of a job whose GPU waits for the others: host-sync predicts ending them on every rank
                message += (f". The replay predicts {saving:.1f}% from ending those waits on this rank alone: its GPU "
                            "waits for other ranks, and host-sync gives what ending them on every rank saves.")
            elif basis.startswith("critical-path") and saving < 1.0:
                message += (f". The replay predicts {saving:.1f}% from ending those waits: the GPU side (its work and "
                            "what it waits for) paces the steps, not this thread.")
            else:
                message += ", which host-sync counts with the other blocking calls."
        op_names = sorted({o for o in ops if o})
        evidence = Evidence(
            steps=sorted({int(s.number) for s in m.steps}) if m.steps else [],
            time_ranges_ms=[(a.rel_ms(t), a.rel_ms(e)) for t, e in zip(pageable["ts"].head(6), pageable["end"].head(6))],
            items=items,
            sources=sorted({s for s in sources if s}),
            numbers={"copies": int(len(pageable)), "bytes": int(pageable["bytes"].sum()),
                     "copy_ms": a.ms(pageable["dur"].sum()), "issued_by": op_names[:5],
                     "pageable_gbps": round(float(pageable["bytes"].sum()) / max(float(pageable["dur"].sum()), 1e-9) / 1e3, 2),
                     "pinned_gbps": round(gbps, 1), "held_ms_per_step": a.ms(held_us),
                     "waiting_ms_per_step": a.ms(waiting_us),
                     "statistic": "median step" if m.steps else "traced window"},
        )
        advice = "Pin the host side of these copies and make them asynchronous."
        fw = runfacts.framework(a.facts)
        pinned = is_on("pin_memory", a)  # the loader's own switch, from run.json or the trace: never asked for again
        loaders = runfacts.training_loaders(a.facts)
        if pinned is not None:
            advice += (f" The DataLoader pins its batches already ({pinned.source}: {pinned.what}), so these are not "
                       "its batches: pin the tensors they copy (`t.pin_memory()`, once, outside the loop).")
        elif fw is not None:  # the framework copies the batches: its own switch pins them
            advice += f" For the batches {fw.label} copies: {switches.pin_memory(fw, loaders[0] if loaders else None)}."
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis, advice=advice,
                             range_pct=span)]

    def positive(self) -> TraceBuilder:
        return _loop(src="Pageable", copy_us=6_000)

    def negative(self) -> TraceBuilder:
        return _loop(src="Pinned", copy_us=3_000)  # pinned copies run at full PCIe speed


def _thread_time(m, pageable, calls) -> tuple[np.ndarray, np.ndarray]:
    """Per step: (µs the copies' calls held the thread, µs of that before their copy started on the GPU:
    waiting for the stream, or another stream it waits on, to reach it)."""
    call = calls.drop_duplicates("correlation").set_index("correlation")
    start = pageable.groupby("correlation")["ts"].min()
    call = call[call.index.isin(start.index)]
    waited = np.clip(start.reindex(call.index).to_numpy() - call["ts"].to_numpy(), 0.0, call["dur"].to_numpy())
    return perstep.issued(m, call["ts"], call["dur"]), perstep.issued(m, call["ts"], waited)


def _pinned_bandwidth(a: Analysis, pageable) -> tuple[float, str]:
    """GB/s a pinned copy reaches here: the trace's own large pinned copies, else the PCIe generation's."""
    c = a.metrics.copies
    pinned = c[((c["src"] == "Pinned") | (c["dst"] == "Pinned")) & c["direction"].isin(set(pageable["direction"]))
               & (c["bytes"] >= MIN_REFERENCE_BYTES)]
    if len(pinned):
        gbps = float(pinned["bytes"].sum()) / max(float(pinned["dur"].sum()), 1e-9) / 1e3
        copies = perstep.count_of(len(pinned), "pinned copy", "pinned copies")
        return gbps, f"{gbps:.0f} GB/s, measured on {copies} of ≥ 1 MiB in this trace"
    gbps = a.device_spec.pinned_copy_gbps
    dev = a.device.name if a.device is not None and a.device.name else "an unknown GPU"
    return gbps, f"expected {gbps:.0f} GB/s for {dev}'s PCIe generation (no large pinned copy in the trace)"


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


def _waits_on_other_ranks(a: Analysis) -> bool:
    """One rank of a job whose GPU, when not computing, mostly waits on others (measure/basics/gpuwaits.py)."""
    if (a.model.meta.world_size or 1) < 2:
        return False
    w = gpu_waits(a.model, a.metrics)
    return w is not None and w.waits_on_others

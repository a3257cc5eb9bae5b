"""cpu-created-tensors: small tensors are built on the CPU every step and copied to the GPU.

## What it detects
Small host→device copies (≤ 1 MiB) inside the profiled steps whose copy op (`aten::to` / `aten::copy_`, the
top-level op that issued the `cudaMemcpyAsync`) directly follows the creation of a tensor on the CPU:
`torch.tensor(...)` / `as_tensor` (`aten::lift_fresh`), `torch.arange`, `ones`, `zeros`, `full`, `eye`,
`rand*`, … that launched no GPU work, possibly with CPU-only steps in between (`.bool()`, `.view()`,
`.tril()`), each less than 1 ms after the one before. Masks, position ids, scalars and index tensors made this
way are copied again in every step. Ops inside the DataLoader's `__next__` are never counted as creations:
a batch has to come from the host (that is pageable-memcpy's and dataloader-stall's business).

## Why it matters
Each such copy is a `cudaMemcpyAsync` from pageable memory: CUDA stages it through a pinned buffer and
the call returns only when the stream has reached it, so the CPU waits for all GPU work queued before the
copy, every step. The copy itself takes microseconds; the wait can take milliseconds. Creating the tensor on
the GPU is a kernel launch that does not wait for anything.

## Fix
```python
# not: torch.arange(seq_len).to(device) / torch.tensor(weights).cuda() in the loop
positions = torch.arange(seq_len, device=device)
mask = torch.ones(seq_len, seq_len, device=device, dtype=torch.bool).tril()
# constants: build them once before the loop (or register_buffer them in the module)
class_weights = torch.tensor(weights, device=device)
```

## Thresholds
Small: ≤ 1 MiB, or ≤ 100 µs of copy time where the trace records no size (ROCm). At least one such copy in
at least half of the profiled steps, and a predicted saving of at least 0.5 %
(a copy that does not make the CPU wait costs next to nothing). The saving is predicted by replaying the
steps with those copy calls no longer blocking (the tensor created on the device instead). A CPU-only
trace has no copies: the rule needs a GPU trace.
A copy counts as CPU-created when one of the (up to) 4 top-level CPU ops before its copy op on the
same thread, each ending at most 1000 µs (1 ms) before the next one starts, created a tensor on the
CPU and issued no GPU work itself.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.analyzer.measure.basics.spans import ops_inside
from gpuadvise.analyzer.measure.basics.source_lines import python_source, user_frame_from_stack
from gpuadvise.analyzer.model.calls import COPY_CALLS, DATALOADER, LAUNCH_CALLS
from gpuadvise.analyzer.model.trace import name_mask, names_in
from gpuadvise.analyzer.measure.replay.whatif import Scenario
from gpuadvise.fixtures.builder import GEMM, TraceBuilder

from .base import Rule

# Ops that create a tensor from nothing (or from Python data: torch.tensor/as_tensor end in lift_fresh,
# then detach_ in grad mode).
CREATE_OPS = {
    "aten::lift_fresh", "aten::detach_", "aten::tensor", "aten::scalar_tensor", "aten::arange", "aten::ones",
    "aten::zeros", "aten::full", "aten::eye", "aten::linspace", "aten::logspace", "aten::rand", "aten::randn",
    "aten::randint", "aten::randperm", "aten::empty", "aten::ones_like", "aten::zeros_like", "aten::full_like",
    "aten::rand_like", "aten::randn_like", "aten::randint_like", "aten::empty_like", "aten::normal", "aten::bernoulli",
}
# CPU-side steps that may sit between the creation and the copy (`.tril().bool().view(...)`).
PASS_THROUGH = {
    "aten::to", "aten::_to_copy", "aten::tril", "aten::triu", "aten::view", "aten::reshape", "aten::unsqueeze",
    "aten::expand", "aten::contiguous", "aten::clone", "aten::t", "aten::transpose", "aten::permute", "aten::lt",
    "aten::le", "aten::gt", "aten::ge", "aten::eq", "aten::ne", "aten::logical_not", "aten::mul", "aten::add",
    "aten::sub", "aten::div", "aten::masked_fill", "aten::masked_fill_", "aten::fill_", "aten::repeat", "aten::flip",
}


class CpuCreatedTensors(Rule):
    code = "GA143"
    name = "cpu-created-tensors"
    title = "Small tensors are created on the CPU and copied to the GPU every step"
    costly = True  # (rulequeue.py: taken first)
    thresholds = {"max_bytes": 1 << 20, "max_unsized_copy_us": 100.0, "window_us": 1_000.0, "max_chain": 4, "min_step_share": 0.5,
                  "min_saving_pct": 0.5}

    def check(self, a: Analysis):
        m, t = a.metrics, self.thresholds
        c = m.copies
        if c.empty:
            return []
        nbytes = c["bytes"].astype(float)
        # small: by size, or by duration where the trace records no size (ROCm): 1 MiB staged takes ≥ 100 µs
        small_size = (nbytes <= t["max_bytes"]) | (nbytes.isna() & (c["dur"] <= t["max_unsized_copy_us"]))
        small = c[(c["direction"] == "HtoD") & small_size & (c["kind"] == "memcpy")]
        if m.steps:
            small = small[small["step"] >= 0]
        if small.empty:
            return []
        found = created_on_cpu(a.model, small["correlation"].to_numpy(), t["window_us"], t["max_chain"])
        if found.empty:
            return []
        hits = small[small["correlation"].isin(found["correlation"])]
        nsteps = max(len(m.steps), 1)
        steps_hit = hits["step"].nunique() if m.steps else 1
        if steps_hit < t["min_step_share"] * nsteps:
            return []
        corr = set(hits["correlation"])
        saving, basis = a.predicted_saving(Scenario("tensors created on the GPU: the per-step copies no longer wait",
                                                    unblock=lambda calls: calls["correlation"].isin(corr).to_numpy()))
        if saving is None or saving < t["min_saving_pct"]:
            return []  # the copies never made the CPU wait: nothing to win
        found = found[found["correlation"].isin(corr)]
        sources = sorted({s for s in found["source"] if s})
        by_op = found.groupby("created_by").size().sort_values(ascending=False)
        size = f"{hits['bytes'].median() / 1024:.1f} KiB median, " if hits["bytes"].notna().any() else ""
        # per step: the median over the steps, the report's statistic (perstep)
        copies_per_step = perstep.median(perstep.by_index(m, hits["step"]))
        copy_ms = perstep.median(perstep.by_index(m, hits["step"], hits["dur"])) / 1e3
        per = "per step" if m.steps else "in the trace"
        message = (f"{perstep.a_median(m).capitalize() if m.steps else ''}{perstep.count_of(copies_per_step, 'small host→device copy', 'small host→device copies')} {per} ({size}"
                   f"{copy_ms:.3f} ms of copy time) {'copies' if copies_per_step == 1 else 'copy'} tensors that were just created on the CPU "
                   f"({', '.join(f'{n} ×{c}' for n, c in by_op.head(3).items())}); each pageable copy makes the CPU wait "
                   "for the GPU work queued before it.")
        evidence = Evidence(
            steps=sorted({int(m.steps[i].number) for i in hits["step"] if i >= 0}) if m.steps else [],
            time_ranges_ms=[(a.rel_ms(s), a.rel_ms(e)) for s, e in zip(found["chain_ts"].head(6), found["copy_end"].head(6))],
            items=[{"name": f"{n} → aten::to", "count": int(c)} for n, c in by_op.items()][:6],
            sources=sources[:5],
            numbers={"copies_per_step": round(copies_per_step, 2), "copy_ms_per_step": round(copy_ms, 3),
                     "statistic": "median step" if m.steps else "traced window",
                     "bytes_median": float(hits["bytes"].median()) if hits["bytes"].notna().any() else None,
                     "steps_with_copies": int(steps_hit), "copy_src": sorted(set(hits["src"]))},
        )
        return [self.finding(message=message, evidence=evidence, saving=saving, basis=basis,
                             advice="Create these tensors on the GPU (device=...), or once before the loop.")]

    def positive(self) -> TraceBuilder:
        return _loop(on_cpu=True)

    def negative(self) -> TraceBuilder:
        return _loop(on_cpu=False)


def created_on_cpu(model, correlations: np.ndarray, window_us: float = 1_000.0, max_chain: int = 4):
    """For the copies with these correlation ids: those whose top-level copy op follows a CPU-side tensor
    creation. A frame with `correlation`, `created_by` (the creating op), `chain_ts` (its start), `copy_end`
    and `source` (the user line, when the trace has stacks). Vectorised per thread: each thread's ops are
    sorted once; the copies look back at most `max_chain` top-level ops."""
    import pandas as pd

    cols = ["correlation", "created_by", "chain_ts", "copy_end", "source"]
    rt, cpu = model.runtime, model.cpu
    if rt.empty or cpu.empty or not len(correlations):
        return pd.DataFrame(columns=cols)
    calls = rt[rt["correlation"].isin(correlations)]
    gpu_calls = rt[names_in(rt["name"], LAUNCH_CALLS | COPY_CALLS)]
    ops = cpu[~cpu["is_annotation"].to_numpy()]
    loader = cpu[name_mask(cpu["name"], DATALOADER.match)]
    in_loader = ops_inside(model, loader).index.to_numpy() if len(loader) else np.empty(0, dtype=np.int64)
    # names as category codes: one lookup per distinct name, never a string per op
    cats = [str(c) for c in ops["name"].cat.categories]
    creates = np.array([c in CREATE_OPS for c in cats] + [False])  # code -1 (no name) → the last slot
    passes = np.array([c in PASS_THROUGH for c in cats] + [False])
    rows = []
    for tid, mine in calls.groupby("tid"):
        th = ops[ops["tid"].to_numpy() == tid]
        if th.empty:
            continue
        ts, end = th["ts"].to_numpy(), th["end"].to_numpy()
        order = np.lexsort((-end, ts))  # a parent before the children that start with it
        ts, end = ts[order], end[order]
        codes = th["name"].cat.codes.to_numpy()[order].astype(np.int64)
        codes = np.where(codes < 0, len(cats), codes)
        # the batch's own ops (a dataset's torch.tensor calls): never a per-step creation
        codes = np.where(np.isin(th.index.to_numpy()[order], in_loader), len(cats), codes)
        rows_of = th.index.to_numpy()[order]
        reach = np.maximum.accumulate(end)
        top = np.ones(len(ts), dtype=bool)
        top[1:] = ts[1:] >= reach[:-1]
        ts, end, codes, rows_of = ts[top], end[top], codes[top], rows_of[top]
        # GPU work each top-level op issued (launches or copies on this thread inside it)
        g = np.sort(gpu_calls.loc[gpu_calls["tid"].to_numpy() == tid, "ts"].to_numpy())
        issued = np.searchsorted(g, end, side="left") - np.searchsorted(g, ts, side="left")  # calls in [ts, end)
        cts = mine["ts"].to_numpy()
        j = np.searchsorted(ts, cts, side="right") - 1
        ok = (j >= 0) & (end[np.clip(j, 0, None)] >= cts)
        j, corr = j[ok], mine["correlation"].to_numpy()[ok]
        created = np.full(len(j), -1)
        alive = np.ones(len(j), dtype=bool)
        for back in range(1, max_chain + 1):
            k = j - back
            alive &= k >= 0
            kk = np.clip(k, 0, None)
            alive &= (ts[np.clip(k + 1, 0, None)] - end[kk] <= window_us) & (issued[kk] == 0)  # close, and on the CPU
            hit = alive & (created < 0) & creates[codes[kk]]
            created[hit] = kk[hit]
            alive &= (created < 0) & passes[codes[kk]]
        for i in np.flatnonzero(created >= 0):
            src = created[i]
            op = cpu.loc[rows_of[src]]
            rows.append((int(corr[i]), cats[codes[src]], float(ts[src]), float(end[j[i]]),
                         user_frame_from_stack(str(op["call_stack"]))
                         or python_source(model, float(ts[src]), float(end[src]), int(tid))))
    return pd.DataFrame(rows, columns=cols)


def _loop(on_cpu: bool) -> TraceBuilder:
    """A transformer-ish step: GEMMs queued on the GPU, then a position tensor and a mask built for the
    next layer block (on the CPU and copied, or on the GPU), then more GEMMs; the batch itself arrives
    through a DataLoader copy in both variants (a small copy that is no creation: the near miss)."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 200)
            with b.op("aten::to"):
                with b.op("aten::copy_"):
                    b.copy("HtoD", "Pinned", "Device", nbytes=64 << 10, dur=8)
            for _ in range(10):
                with b.op("aten::linear"):
                    b.kernel(GEMM, 300)
            if on_cpu:  # the CPU-created tensors, each copied (pageable: the copy waits for the queue)
                b.cpu("aten::arange", 12)
                with b.op("aten::to"):
                    with b.op("aten::_to_copy"):
                        with b.op("aten::copy_"):
                            b.copy("HtoD", "Pageable", "Device", nbytes=4096, dur=3)
                b.cpu("aten::ones", 10)
                b.cpu("aten::tril", 8)
                with b.op("aten::to"):
                    with b.op("aten::_to_copy"):
                        with b.op("aten::copy_"):
                            b.copy("HtoD", "Pageable", "Device", nbytes=16384, dur=4)
            b.idle(1_500)  # Python work for the next block: overlaps the queued GEMMs unless a copy made it wait
            if not on_cpu:
                with b.op("aten::arange"):
                    b.kernel("void at::native::elementwise_kernel<128, 2, arange>", 3)
                with b.op("aten::ones"):
                    b.kernel("void at::native::vectorized_elementwise_kernel<4, FillFunctor<bool>>", 3)
                with b.op("aten::tril"):
                    b.kernel("void at::native::triu_tril_kernel<bool, true>", 3)
            for _ in range(10):
                with b.op("aten::linear"):
                    b.kernel(GEMM, 300)
            b.sync()
    b.finish()
    return b


RULE = CpuCreatedTensors()

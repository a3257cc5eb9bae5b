"""The compiler's own work in a trace: where torch.compile compiled (and autotuned), found once per trace.

PyTorch wraps every compile phase in `dynamo_timed` (torch/_dynamo/utils.py), which records a profiler
span named "KEY (dynamo_timed)": dynamo's `_compile.compile_inner`, AOTAutograd and Inductor's
`compile_fx_inner`, `GraphLowering.run`, `async_compile.wait`, … and Inductor's autotuning, at compile
time or on a kernel's first call (`CachingAutotuner.benchmark_all_configs`, `coordinate_descent_tuning`,
the `*_template_autotuning` of max-autotune). Dynamo's event logger adds "KEY_data: …, compile_id=F/R"
annotations inside them that say which frame (F) and which of its compiles (R) the work belongs to.

Everything inside those spans is a one-time compile cost, not the training loop's: the device syncs,
the pageable copies and the kernels the autotuner launches to time its candidates, and the CPU time of
the compiler itself. metrics.py keeps the calls inside them out of the sync, copy and launch tables,
and warmup.py makes the spans a one-time cost ("compilation"), so the steps they fall in leave the step
figures (or their time is cut out when no other step remains); compile-in-window and warm-up-capture
count them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from gpuadvise.analyzer.model.trace import TraceModel, name_mask

from . import intervals as iv

DYNAMO_TIMED = " (dynamo_timed)"
COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)")
REGION = "Torch-Compiled Region: "
REGION_ID = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
AUTOTUNING = re.compile(r"autotun|benchmark_all_configs|coordinate_descent_tuning", re.I)


@dataclass
class CompileSpan:
    """One outermost compile span: its time range, the compile it belongs to ("F/R", "" when the trace
    does not say), and whether it is autotuning."""

    ts: float
    end: float
    compile_id: str
    name: str
    autotuning: bool


@dataclass
class CompileWork:
    spans: list[CompileSpan] = field(default_factory=list)
    starts: np.ndarray = field(default_factory=lambda: np.empty(0))  # their union, µs on the trace clock
    ends: np.ndarray = field(default_factory=lambda: np.empty(0))
    calls: np.ndarray = field(default_factory=lambda: np.empty(0))  # correlation ids of the runtime calls inside

    def __bool__(self) -> bool:
        return bool(self.spans)

    @property
    def us(self) -> float:
        return iv.total(self.starts, self.ends)

    def made(self, correlation) -> np.ndarray:
        """Whether each GPU op or runtime call (by correlation id) was issued from inside a compile span."""
        return np.isin(np.asarray(correlation), self.calls)

    def inside(self, ts) -> np.ndarray:
        """Whether each time lies inside a compile span."""
        ts = np.asarray(ts, dtype=float)
        if not len(self.starts) or not len(ts):
            return np.zeros(len(ts), dtype=bool)
        k = np.searchsorted(self.starts, ts, side="right") - 1
        return (k >= 0) & (ts < self.ends[np.clip(k, 0, None)])


def compile_work(model: TraceModel) -> CompileWork:
    """The trace's compile spans (module docstring); empty when the trace holds none."""
    cpu = model.cpu
    if not len(cpu):
        return CompileWork()
    timed = cpu[name_mask(cpu["name"], lambda n: n.endswith(DYNAMO_TIMED))]
    if not len(timed):
        return CompileWork()
    ts, end = timed["ts"].to_numpy(float), timed["end"].to_numpy(float)
    starts, ends = iv.union(ts, end)
    ids = _ids_inside(cpu, starts, ends)
    regions = _region_starts(cpu)
    spans = []
    names = timed["name"].astype(str).to_numpy()
    group = np.searchsorted(starts, ts, side="right") - 1  # the range each span lies in
    for i, (lo, hi) in enumerate(zip(starts, ends)):
        inside = np.flatnonzero(group == i)
        # named after its outermost (longest) span
        top = inside[np.argmax(end[inside] - ts[inside])] if len(inside) else None
        name = names[top][: -len(DYNAMO_TIMED)] if top is not None else ""
        cid = ids[i] or _owner(regions, lo, hi)
        auto = any(AUTOTUNING.search(names[j]) for j in inside)
        spans.append(CompileSpan(float(lo), float(hi), cid, name, auto))
    work = CompileWork(spans, starts, ends)
    rt = model.runtime
    if len(rt):
        corr = rt["correlation"].to_numpy()
        work.calls = np.unique(corr[work.inside(rt["ts"].to_numpy(dtype=float)) & (corr >= 0)])
    return work


def _ids_inside(cpu, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """The compile id named by the first "…compile_id=F/R" annotation inside each range ("" when none)."""
    tagged = cpu[name_mask(cpu["name"], lambda n: "compile_id=" in n)]
    out = [""] * len(starts)
    if not len(tagged):
        return out
    k = np.searchsorted(starts, tagged["ts"].to_numpy(float), side="right") - 1
    for j, name in sorted(zip(k, tagged["name"].astype(str)), key=lambda x: x[0]):
        if 0 <= j < len(out) and not out[j]:
            m = COMPILE_ID.search(name)
            if m:
                out[j] = f"{m.group(1)}/{m.group(2)}"
    return out


def _region_starts(cpu) -> list[tuple[float, float, str]]:
    r = cpu[name_mask(cpu["name"], lambda n: n.startswith(REGION))]
    return sorted((float(t), float(e), region_id(n) or "") for t, e, n in zip(r["ts"], r["end"], r["name"].astype(str)))


def _owner(regions: list[tuple[float, float, str]], lo: float, hi: float) -> str:
    """Without a compile-id annotation: the innermost compiled region the span runs in (autotuning on a
    kernel's first call), else the compiled frame that starts running right after it (its compile)."""
    around = [r for r in regions if r[0] <= lo and hi <= r[1] and r[2]]
    if around:
        return max(around, key=lambda r: r[0])[2]
    return next((cid for ts, _, cid in regions if ts >= hi), "")


def region_id(name: str) -> str | None:
    """"F/R" of a `Torch-Compiled Region: F/R` span name; None for any other name."""
    m = REGION_ID.match(name)
    return f"{m.group(1)}/{m.group(2)}" if m else None

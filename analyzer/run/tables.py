"""The tables a person reads in `gpuadvise view`, as plain data for a program that asks for them (the
MCP server's `steps`, `top_kernels`, `idle_causes` and `source_line`): one analysed trace's steps, its
kernels, what the CPU did while the GPU sat idle (over the median step or in one step), and what the
analysis found at one line of the user's code.

Every figure is the engine's own, read from the report (`TraceReport.metrics`, its findings, its memory
summary) or from the measure it already has (measure/basics/idle.py); nothing here estimates. Times are in ms
(rounded to the µs), shares in %; each row is a dict with the unit in its key's name, as in the JSON report.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.measure.basics import idle
from gpuadvise.analyzer.measure.basics.perstep import median as perstep_median
from gpuadvise.analyzer.model import frames
from gpuadvise.analyzer.model.report import TraceReport

# per_step's µs columns, by the name each row carries them under
_STEP_COLUMNS = {"time_ms": "dur_us", "cpu_ms": "cpu_dur_us", "gpu_ms": "gpu_dur_us", "gpu_busy_ms": "gpu_busy_us",
                 "compute_ms": "kernel_us", "comm_ms": "comm_us", "memcpy_ms": "memcpy_us", "memset_ms": "memset_us",
                 "dataloader_ms": "dataloader_us", "sync_ms": "sync_us", "idle_ms": "idle_us"}


def _ms(us) -> float | None:
    v = float(us)
    return round(v / 1e3, 3) if math.isfinite(v) else None


def _pct(v) -> float | None:
    v = float(v)
    return round(v, 1) if math.isfinite(v) else None


def _timed(report: TraceReport):
    """The report's metrics; a snapshot (or a trace without a timeline) has no tables to give."""
    if report.metrics is None or report.model is None:
        raise InputError(report.source, "a memory snapshot on its own: it has no steps, kernels or timeline")
    return report.metrics


def steps(report: TraceReport) -> dict:
    """One row per step the figures use (`per_step`): its time (the slower of its CPU span and its GPU
    time), GPU busy share, and the time split the view's step table shows; the steps left out of every
    figure, with why; the median step (the header's statistic)."""
    m = _timed(report)
    rows = []
    for rec in m.per_step.to_dict("records"):
        row = {"step": int(rec["step"]) if rec["step"] >= 0 else None}
        row.update((name, _ms(rec[col])) for name, col in _STEP_COLUMNS.items() if col in rec)
        row["gpu_busy_pct"] = _pct(rec["gpu_busy_pct"]) if "gpu_busy_pct" in rec else None
        rows.append(row)
    left_out = [{"step": n, "why": why} for n, why in sorted(m.left_out.items())]
    return {"median_step_ms": _ms(m.median_step_us), "steps": len(rows), "rows": rows, "left_out": left_out}


def kernels(report: TraceReport) -> list[dict]:
    """GPU kernels by name, longest total first: launches, total, mean and median duration, share of all
    kernel time, and what kind of kernel (communication, a matmul's precision path)."""
    k = _timed(report).kernels
    out = []
    for rec in k.to_dict("records"):
        kind = "communication" if rec.get("comm") else (rec.get("precision") or "matmul") if rec.get("matmul") else ""
        out.append({"name": str(rec["name"]), "count": int(rec["count"]), "total_ms": _ms(rec["total_us"]),
                    "mean_us": round(float(rec["mean_us"]), 1), "median_us": round(float(rec["median_us"]), 1),
                    "share_pct": _pct(rec["share_pct"]), "kind": kind})
    return out


def idle_causes(report: TraceReport, step: int | None = None, top: int = 12) -> dict:
    """What the CPU thread that launched the GPU's next work was doing while the GPU sat idle inside the
    steps (measure/basics/idle.py): each cause's ms and share of the idle time, in the median step (the
    report's statistic) or, with `step`, in that step."""
    m = _timed(report)
    numbers = [int(s) for s in m.per_step["step"]]
    index = None
    if step is not None:
        if step not in numbers:
            why = m.left_out.get(step)
            if why:
                raise InputError(None, f"step {step} is left out of the figures ({why})")
            shown = f"{numbers[0]}–{numbers[-1]}" if numbers and numbers[0] >= 0 else "none: the trace has no steps"
            raise InputError(None, f"no step {step} in {report.source} (its steps: {shown})")
        index = numbers.index(step)
    out = {"statistic": "median step" if step is None else f"step {step}", "step": step, "gpu_idle_ms": None,
           "causes": []}
    found = idle.idle_causes(report.model, m)
    if found is None:  # the GPU never idle inside the steps, or nothing launched on it
        return out
    per, idle_us = found
    out["gpu_idle_ms"] = _ms(perstep_median(idle_us) if index is None else idle_us[index])
    out["causes"] = [{"what": str(r["what"]), "kind": str(r["kind"]), "ms": float(r["ms_per_step"]),
                      "share_of_idle_pct": float(r["share_of_idle_pct"])}
                     for r in idle.cause_table(per, idle_us, index, top=top).to_dict("records")]
    return out


def _same_line(text: str, file: str, line: int) -> bool:
    """Whether a site the analysis wrote ("exps.py:99", "train.py(42): step", "a/b.py:7 (fn)") is `file`
    at `line`: the same line, and one path a tail of the other, component by component (a trace recorded
    elsewhere names the file by another folder)."""
    f = frames.parse(text)
    if f is None or f.line != line:
        return False
    a, b = PurePosixPath(f.file.replace("\\", "/")).parts, PurePosixPath(file.replace("\\", "/")).parts
    a, b = [p for p in a if p not in (".", "/")], [p for p in b if p not in (".", "/")]
    n = min(len(a), len(b))
    return n > 0 and a[-n:] == b[-n:]


def source_line(report: TraceReport, findings: list[dict], file: str, line: int) -> dict:
    """What the analysis says about one line of the user's code: the findings that point at it (their
    sources or their evidence items), the calls there that blocked the CPU on the GPU, and the memory
    allocated there (the snapshot's live blocks, the history's allocations). `findings` are the JSON
    report's findings of the run, the same ones the report shows."""
    def at(text) -> bool:
        return isinstance(text, str) and _same_line(text, file, line)

    hits = [f for f in findings if any(at(s) for s in f["evidence"]["sources"])
            or any(at(item.get(k)) for item in f["evidence"]["items"] for k in ("where", "source", "file"))]
    calls = []
    m = report.metrics
    if m is not None and len(m.syncs):
        s = m.syncs[~m.syncs["profiler_sync"].astype(bool)]
        s = s[[at(str(x)) for x in s["source"]]] if len(s) else s
        for (name, kind, op), g in s.groupby(["name", "kind", "op"], observed=True, sort=False):
            calls.append({"call": str(name), "waits_for": str(kind), "op": str(op), "count": int(len(g)),
                          "total_ms": _ms(g["dur"].sum()), "max_ms": _ms(g["dur"].max())})
        calls.sort(key=lambda c: -(c["total_ms"] or 0.0))
    memory = []
    mem = report.memory.to_dict() if report.memory is not None else {}
    for part, figures in (("snapshot", ("live_blocks", "live_mib")), ("history", ("allocs", "allocated_mib", "live_at_peak_mib"))):
        for site in (mem.get(part) or {}).get("top_sites") or []:
            if at(site.get("name")):
                memory.append({"from": part, "site": site["name"], **{k: site[k] for k in figures if k in site}})
    return {"file": file, "line": line, "findings": hits, "blocking_calls": calls, "memory": memory}

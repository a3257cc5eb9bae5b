"""`gpuadvise compare BEFORE AFTER`: the comparison of two analysed runs, as plain JSON-able data.

`compare(before, after)` reads two typed sides (`side.Side`: the analysis's summary, the one every
report format reads, plus each step's time, kernel and op totals and the run.json facts), so it runs on
hand-made sides as well (tests; the windows of one long run, run/longrun.py) and never touches a trace
(analysing a path into a side is load.py's `load_side`; the CI gate on a comparison is gate.py's). Every figure it takes from a side is the
value the JSON report holds (`report.json.finite`: NaN becomes null), so a comparison never quotes a
number the reports do not.

Findings are matched by rule: *resolved* (on BEFORE only), *new* (on AFTER only), *still there*
(both), and *unchecked* when the rule could not run on the other side (a memory rule without memory
data there): a finding that vanished because nothing looked for it is not a fix.
"""

from __future__ import annotations

import math

from gpuadvise.analyzer.model.findings import Finding
from gpuadvise.analyzer.report.json import finite
from gpuadvise.version import __version__
from .compiled import compile_facts  # torch.compile facts
from .side import Side

TOP_CHANGES = 10

BREAKDOWN = (  # TraceFigures.step_breakdown_ms keys, in the order they are shown
    ("dur", "step"),
    ("kernel", "GPU compute"),
    ("comm", "communication"),
    ("memcpy", "memcpy"),
    ("memset", "memset"),
    ("dataloader", "DataLoader wait"),
    ("sync", "sync wait"),
    ("idle", "GPU idle"),
)


def _figure(side: Side, name: str):
    """A figure of the trace that heads the side (the slowest rank of several), as the JSON has it."""
    t = side.head
    return finite(t.figure(name)) if t is not None else None


def _memory(side: Side):
    t = side.head
    return t.memory if t is not None else None


INPUT_NAMES = {"trace": "trace", "memory": "memory data", "snapshot": "allocator snapshot", "ranks": "second rank",
               "run": "step record"}


def _inputs(side: Side) -> set[str]:
    """Which rule inputs the side had (`Rule.requires`): a rule that needs one it lacks never ran."""
    have = set()
    for t in side.summary.traces:
        if t.timed:
            have.add("trace")
        if t.memory is not None:
            have.add("memory")
            if "snapshot" in t.memory.sources:
                have.add("snapshot")
    if side.summary.job is not None:
        have.add("ranks")
    if side.summary.long_runs:
        have.add("run")
    return have


# ----------------------------------------------------------------------------------------------------
# The comparison


def compare(before: Side, after: Side) -> dict:
    b_run, a_run = run_figures(before), run_figures(after)
    step = step_change(b_run, a_run)
    findings = match_findings(before, after)
    env = environment(before, after)
    out = {
        "tool": "gpuadvise",
        "version": __version__,
        "kind": "compare",
        "before": b_run,
        "after": a_run,
        "warnings": warnings(before, after, b_run, a_run, step),
        "step_time": step,
        "breakdown": breakdown(before, after),
        "findings": findings,
        "predictions": predictions(findings, step, env),
        "kernels": changes(before, after, "kernels"),
        "ops": changes(before, after, "ops"),
        "environment": env,
    }
    return out


def run_figures(side: Side) -> dict:
    """The headline numbers of one side: step time (median, spread), GPU busy, memory peaks."""
    t, mem = side.head, _memory(side)
    steps = list(side.steps_ms)
    has_steps = bool(_figure(side, "steps")) and _figure(side, "median_step_ms") is not None
    median = _figure(side, "median_step_ms") if has_steps else None
    out = {
        "label": side.label,
        "trace": t.source if t is not None else None,
        "rank": t.rank if t is not None else None,
        # a long run's later windows are the same process again, not more ranks
        "traces": sum(1 for x in side.summary.traces if (x.window or 1) == 1),
        "device": _figure(side, "device"),
        "platform": _figure(side, "platform"),
        "steps": _figure(side, "steps") or 0,
        "median_step_ms": median,
        "min_step_ms": min(steps) if steps and has_steps else None,
        "max_step_ms": max(steps) if steps and has_steps else None,
        "spread_pct": None,
        "unprofiled_median_step_ms": _figure(side, "unprofiled_median_step_ms"),
        "profiler_overhead_x": _figure(side, "profiler_overhead_x"),
        "gpu_busy_in_steps_pct": _figure(side, "gpu_busy_in_steps_pct"),
        "gpu_busy_pct": _figure(side, "gpu_busy_pct"),
        "peak_allocated_bytes": finite(mem.peak_allocated) if mem is not None else None,
        "peak_reserved_bytes": finite(mem.peak_reserved) if mem is not None else None,
        "findings": side.summary.figures.findings,
    }
    out.update(_mfu(side))
    if median and out["min_step_ms"] is not None:
        # max − min over the median: how much the profiled steps disagree with each other
        out["spread_pct"] = round(100 * (out["max_step_ms"] - out["min_step_ms"]) / median, 1)
    return out


def _mfu(side: Side) -> dict:
    """The heading trace's MFU (measured on its profiled median step, and over the unprofiled one when
    run.json has it), its model FLOPs per step and the headline's arithmetic."""
    f = side.head.figures.flops if side.head is not None and side.head.figures is not None else None
    counted = f is not None and f.state == "counted"
    return {"mfu_pct": f.mfu_pct if counted else None,
            "unprofiled_mfu_pct": f.unprofiled_mfu_pct if counted else None,
            "model_flops": finite(f.model_flops) if counted else None,
            "mfu_dtypes": [p.dtype for p in f.peaks] if counted else [],
            "mfu_basis": (f.basis if counted else f.note) if f is not None else None}


FIGURES = {
    "unprofiled": "unprofiled median step (run.json, no profiler)",
    "profiled": "profiled median step (trace)",
}


def step_change(b: dict, a: dict) -> dict:
    """The measured change, from the unprofiled figures when both runs have them (the profiler slows
    some loops 2×, not others), else from the profiled medians; which one is said."""
    out = {"figure": None, "figure_label": None, "before_ms": None, "after_ms": None, "saving_pct": None,
           "change_pct": None, "note": None}
    bu, au = b.get("unprofiled_median_step_ms"), a.get("unprofiled_median_step_ms")
    if _pos(bu) and _pos(au):
        out.update(figure="unprofiled", before_ms=bu, after_ms=au)
    elif _pos(b.get("median_step_ms")) and _pos(a.get("median_step_ms")):
        out.update(figure="profiled", before_ms=b["median_step_ms"], after_ms=a["median_step_ms"])
        if _pos(bu) or _pos(au):
            which = "BEFORE" if _pos(bu) else "AFTER"
            out["note"] = (f"only {which} has an unprofiled step time: both sides use the profiled medians, "
                           f"which include the profiler's overhead")
    else:
        missing = [name for name, s in (("BEFORE", b), ("AFTER", a)) if not _pos(s.get("median_step_ms"))]
        out["note"] = (f"no step time to compare: {' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no "
                       f"profiled steps (no ProfilerStep marks, or no trace)")
        return out
    out["figure_label"] = FIGURES[out["figure"]]
    ratio = out["after_ms"] / out["before_ms"]
    out["saving_pct"] = round(100 * (1 - ratio), 2)  # positive: faster, as predictions are stated
    out["change_pct"] = round(100 * (ratio - 1), 2)  # positive: slower, as a regression is stated
    return out


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def breakdown(before: Side, after: Side) -> list[dict]:
    """The median step split side by side (ms per step)."""
    b = _figure(before, "step_breakdown_ms") or {}
    a = _figure(after, "step_breakdown_ms") or {}
    rows = []
    for key, label in BREAKDOWN:
        if key not in b and key not in a:
            continue
        bv, av = b.get(key), a.get(key)
        rows.append({"part": key, "label": label, "before_ms": bv, "after_ms": av,
                     "change_ms": round(av - bv, 3) if bv is not None and av is not None else None})
    return rows


def _by_rule(findings) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:  # the report lists them biggest saving first: the first of a rule leads
        out.setdefault(f.rule, []).append(f)
    return out


def _side_of(fs: list[Finding]) -> dict:
    f = fs[0]
    return {"severity": f.severity, "est_step_saving_pct": finite(f.impact.est_step_saving_pct),
            "upper_bound": bool(f.impact.upper_bound), "count": len(fs), "message": f.message,
            "ranks": sorted({x.rank for x in fs if x.rank is not None})}


def match_findings(before: Side, after: Side) -> dict:
    from gpuadvise.rules import find_rule

    fb, fa = _by_rule(before.summary.findings), _by_rule(after.summary.findings)
    have_b, have_a = _inputs(before), _inputs(after)
    out = {"resolved": [], "new": [], "still_there": [], "unchecked": []}
    for rule in list(fb) + [r for r in fa if r not in fb]:
        b, a = fb.get(rule), fa.get(rule)
        lead = (b or a)[0]
        entry = {"rule": rule, "topic": lead.topic, "title": lead.title,
                 "before": _side_of(b) if b else None, "after": _side_of(a) if a else None}
        known = find_rule(rule)
        needs = set(getattr(known, "requires", ("trace",))) if known is not None else {"trace"}
        other = have_a if b else have_b
        if "memory" in needs and "snapshot" in (have_b if b else have_a):
            needs.add("snapshot")  # found with an allocator snapshot: its absence there is no fix
        if b and a:
            entry["numbers"] = _moved_numbers(b[0], a[0])
            out["still_there"].append(entry)
        elif not needs <= other:
            lacking = sorted(needs - other)
            entry["note"] = (f"not checked on {'AFTER' if b else 'BEFORE'}: it has no "
                             f"{' or '.join(INPUT_NAMES.get(x, x) for x in lacking)} for this rule to read")
            out["unchecked"].append(entry)
        elif b:
            out["resolved"].append(entry)
        else:
            out["new"].append(entry)
    return out


def _moved_numbers(b: Finding, a: Finding) -> list[dict]:
    """The figures both findings quote (evidence.numbers), before → after."""
    nb, na = finite(b.evidence.numbers), finite(a.evidence.numbers)
    rows = []
    for key in nb:
        vb, va = nb.get(key), na.get(key)
        if key in na and _num(vb) and _num(va):
            rows.append({"key": key, "before": vb, "after": va})
    return rows


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# A step this much slower is beyond run-to-run noise (about 5 % measured between unprofiled runs of one
# script, as the profiler's own overhead threshold, measure/replay/calibration.NOISE)
WORSE_PCT = 5.0


def predictions(findings: dict, step: dict, environment: list[dict]) -> list[dict]:
    """Every BEFORE finding's predicted saving next to the change measured: the resolved ones, then those
    still there. A fix counts as applied when a run.json fact its rule's fix changes (`Rule.fix_facts`)
    differs between the runs (`changed`), or, where the facts show no fix at all, when its finding is
    resolved; an applied fix with a step slower by more than WORSE_PCT made training slower (`worse`)."""
    from gpuadvise.rules import find_rule

    slower = step.get("saving_pct") is not None and step["saving_pct"] <= -WORSE_PCT
    rows = []
    for status, key in (("resolved", "resolved"), ("still there", "still_there")):
        for f in findings[key]:
            rule = find_rule(f["rule"])
            changed = [r for r in environment if rule is not None and rule.applied_in(r["key"])]
            rows.append((f, status, changed))
    shown = any(changed for _, _, changed in rows)  # the facts show which fixes were made
    out = []
    for f, status, changed in rows:
        applied = bool(changed) or (status == "resolved" and not shown)
        out.append({"rule": f["rule"], "topic": f["topic"], "title": f["title"], "status": status,
                    "predicted_pct": f["before"]["est_step_saving_pct"], "upper_bound": f["before"]["upper_bound"],
                    "changed": changed, "applied": applied, "worse": applied and slower,
                    "measured_saving_pct": step.get("saving_pct"), "figure": step.get("figure")})
    return out


def changes(before: Side, after: Side, table: str) -> list[dict]:
    """Kernels (or ops) whose time per step changed most, biggest change first."""
    def per_step(side: Side):
        n = max(int(_figure(side, "steps") or 0), 1)  # without steps: the whole window
        return {row.name: (row.total_ms / n, row.count / n) for row in getattr(side, table)}

    b, a = per_step(before), per_step(after)
    rows = []
    for name in set(b) | set(a):
        bt, bc = b.get(name, (0.0, 0.0))
        at, ac = a.get(name, (0.0, 0.0))
        delta = at - bt
        if abs(delta) < 5e-4:
            continue
        rows.append({"name": name, "before_ms_per_step": round(bt, 3), "after_ms_per_step": round(at, 3),
                     "change_ms_per_step": round(delta, 3), "before_count_per_step": round(bc, 1),
                     "after_count_per_step": round(ac, 1),
                     "status": "new" if name not in b else "gone" if name not in a else "changed"})
    rows.sort(key=lambda r: (-abs(r["change_ms_per_step"]), r["name"]))
    return rows[:TOP_CHANGES]


# ----------------------------------------------------------------------------------------------------
# Environment and warnings

_SKIP_KEYS = {"created_at", "called_at", "id"}  # where/which object: differs between any two runs


def env_facts(side: Side) -> dict[str, object]:
    """The facts worth comparing, flattened: `settings.cudnn_benchmark`, `dataloader[0].num_workers`, …"""
    out: dict[str, object] = {}
    for key in ("device", "compute_capability", "platform"):
        if _figure(side, key) is not None:
            out[f"trace.{key}"] = _figure(side, key)
    mem = _memory(side)
    alloc = finite(mem.allocator_settings) if mem is not None else {}
    for k, v in alloc.items():
        out[f"allocator.{k}"] = v
    facts = side.facts
    if not facts:
        return out
    env = facts.get("environment") or {}
    for k, v in env.items():
        if k == "device" and isinstance(v, dict):
            for dk, dv in v.items():
                out[f"environment.device.{dk}"] = dv
        elif not isinstance(v, (dict, list)):
            out[f"environment.{k}"] = v
    for k, v in (facts.get("settings") or {}).items():
        out[f"settings.{k}"] = v
    for section, name in (("dataloaders", "dataloader"), ("optimizers", "optimizer"), ("autocast", "autocast"),
                          ("compile", "compile"), ("wrappers", "wrapper")):
        for i, entry in enumerate(facts.get(section) or []):
            if isinstance(entry, dict):
                for k, v in entry.items():
                    if k not in _SKIP_KEYS:
                        out[f"{name}[{i}].{k}"] = v
    fw = facts.get("framework") if isinstance(facts.get("framework"), dict) else {}
    for k in ("name", "version"):  # the training framework and its own settings (TrainingArguments, …)
        if fw.get(k) is not None:
            out[f"framework.{k}"] = fw[k]
    for k, v in (fw.get("settings") if isinstance(fw.get("settings"), dict) else {}).items():
        out[f"framework.settings.{k}"] = v
    out.update(compile_facts(facts))  # what torch.compile did (compare/compiled.py)
    capture = facts.get("capture") or {}
    for part in ("options", "window"):
        for k, v in (capture.get(part) or {}).items():
            out[f"profiler.{k}"] = v
    if facts.get("script") is not None:
        out["script"] = facts.get("script")
    if isinstance(facts.get("argv"), list):
        out["argv"] = " ".join(map(str, facts["argv"][1:]))
    return out


def environment(before: Side, after: Side) -> list[dict]:
    """The facts that differ. A run.json fact is compared only when both runs have a run.json."""
    eb, ea = env_facts(before), env_facts(after)
    both_facts = bool(before.facts) and bool(after.facts)
    rows = []
    both_alloc = any(k.startswith("allocator.") for k in eb) and any(k.startswith("allocator.") for k in ea)
    for key in list(eb) + [k for k in ea if k not in eb]:
        if key.startswith("allocator.") and not both_alloc:
            continue  # one side had no allocator snapshot: its settings are unknown there, not different
        if not both_facts and not key.startswith(("trace.", "allocator.")):
            continue
        vb, va = eb.get(key), ea.get(key)
        if vb != va:
            rows.append({"key": key, "before": vb, "after": va})
    return rows


def warnings(before: Side, after: Side, b: dict, a: dict, step: dict) -> list[str]:
    """What makes the comparison doubtful, said first: other devices, another script, other profiler
    settings, missing step times."""
    out = []
    eb, ea = env_facts(before), env_facts(after)
    dev_b = eb.get("environment.device.name") or b.get("device")
    dev_a = ea.get("environment.device.name") or a.get("device")
    if dev_b and dev_a and dev_b != dev_a:
        out.append(f"different devices: BEFORE ran on {dev_b}, AFTER on {dev_a}")
    elif (dev_b is None) != (dev_a is None):
        out.append(f"the device is recorded on one side only (BEFORE: {dev_b or 'not recorded'}, "
                   f"AFTER: {dev_a or 'not recorded'})")
    n_b, n_a = eb.get("environment.device.count"), ea.get("environment.device.count")
    if n_b is not None and n_a is not None and n_b != n_a:
        out.append(f"different GPU counts: {n_b} on BEFORE, {n_a} on AFTER")
    if b.get("traces") != a.get("traces"):
        out.append(f"different numbers of traces (ranks): {b.get('traces')} on BEFORE, {a.get('traces')} on AFTER")
    s_b, s_a = before.facts.get("script"), after.facts.get("script")
    if s_b and s_a and s_b != s_a:
        out.append(f"different scripts were run: {s_b} on BEFORE, {s_a} on AFTER")
    prof = sorted(k for k in set(eb) | set(ea) if k.startswith("profiler.") and eb.get(k) != ea.get(k))
    if prof and before.facts and after.facts:
        out.append("the profiler was set up differently (" + ", ".join(k.split(".", 1)[1] for k in prof)
                   + "): its overhead differs, so profiled step times are not like for like")
    if step.get("note"):
        out.append(step["note"])
    if step.get("figure") == "profiled" and b.get("min_step_ms") is not None and a.get("min_step_ms") is not None \
            and b["min_step_ms"] <= a["max_step_ms"] and a["min_step_ms"] <= b["max_step_ms"]:
        out.append(f"the profiled steps of the two runs overlap (BEFORE {b['min_step_ms']:.2f}–{b['max_step_ms']:.2f} ms, "
                   f"AFTER {a['min_step_ms']:.2f}–{a['max_step_ms']:.2f} ms): the change may be run-to-run noise; "
                   f"profile more steps or compare unprofiled step times")
    for name, side in (("BEFORE", before), ("AFTER", after)):
        bad = [n for t in side.summary.traces for n in t.notes if "cut off" in n or "damaged" in n]
        if bad:
            out.append(f"{name}'s trace is incomplete: {bad[0]}")
    sb, sa = _snapshot(before), _snapshot(after)
    if sb != sa:
        out.append(f"only {'BEFORE' if sb else 'AFTER'} has an allocator snapshot: memory findings are not compared like for like")
    return out


def _snapshot(side: Side) -> bool:
    return any(t.memory is not None and "snapshot" in t.memory.sources for t in side.summary.traces)

"""`gpuadvise compare BEFORE AFTER`: the comparison of two analysed runs, as plain JSON-able data.

A *side* is one run: `render_json.document` of its analysis (the stable report interface) plus the
few things that document does not carry and a comparison needs: each step's time (for the spread),
kernel and op totals (for what changed most), and the run's `run.json` facts (for what differs).
`compare(before, after)` works on two sides only, so it runs on saved or hand-made sides as well
(tests, the TUI, the windows of one long run: run/longrun.py) and never touches a trace. Analysing a
path into a side is sides.py's `load_side`; the CI gate on a comparison is gate.py's.

Findings are matched by rule: *resolved* (on BEFORE only), *new* (on AFTER only), *still there*
(both), and *unchecked* when the rule could not run on the other side (a memory rule without memory
data there): a finding that vanished because nothing looked for it is not a fix.
"""

from __future__ import annotations

import math

from gpuadvise.version import __version__
from .compiled import compile_facts  # torch.compile facts

KEEP_TABLE_ROWS = 300  # kernels / ops per side kept for the diff (by total time)
TOP_CHANGES = 10

BREAKDOWN = (  # summary.step_breakdown_ms keys, in the order they are shown
    ("dur", "step"),
    ("kernel", "GPU compute"),
    ("comm", "communication"),
    ("memcpy", "memcpy"),
    ("memset", "memset"),
    ("dataloader", "DataLoader wait"),
    ("sync", "sync wait"),
    ("idle", "GPU idle"),
)


# ----------------------------------------------------------------------------------------------------
# Sides


def side_from_reports(reports, label: str, facts: dict | None = None) -> dict:
    """A side from ready reports (`run.analyze`); `facts` maps a trace path to its run.json facts
    (default: the facts the reports were read with)."""
    if facts is None:
        facts = getattr(reports, "facts", None)
    from gpuadvise.analyzer.report.json import document

    doc = document(reports)
    top = doc.get("summary") or {}
    main = 0
    for i, r in enumerate(reports):
        if r.source == top.get("trace") and r.rank == top.get("rank"):
            main = i
            break
    side = {"label": str(label), "report": doc, "main": main, "steps_ms": [], "kernels": [], "ops": [], "facts": {}}
    if not reports:
        return side
    r = reports[main]
    m = r.metrics
    if m is not None:
        if m.steps and len(m.per_step):
            side["steps_ms"] = [round(float(v) / 1e3, 3) for v in m.per_step["dur_us"]]
        side["kernels"] = _table(m.kernels)
        side["ops"] = _table(m.ops)
    side["facts"] = dict((facts or {}).get(r.source) or {})
    return side  # plain data already: the document has no numpy scalars, the tables are built of Python numbers


def _table(frame) -> list[dict]:
    if frame is None or frame.empty:
        return []
    rows = frame.head(KEEP_TABLE_ROWS)
    return [{"name": str(n), "count": int(c), "total_ms": round(float(t) / 1e3, 4)}
            for n, c, t in zip(rows["name"], rows["count"], rows["total_us"])]


def trace_summary(side: dict) -> dict:
    """The summary of the trace that heads the side (the slowest rank of several)."""
    traces = side["report"].get("traces") or []
    i = side.get("main", 0)
    return traces[i] if 0 <= i < len(traces) else {}


def _get(side: dict, key: str):
    """A summary figure: from the heading trace's summary, else the report's top summary."""
    v = trace_summary(side).get(key)
    return v if v is not None else (side["report"].get("summary") or {}).get(key)


INPUT_NAMES = {"trace": "trace", "memory": "memory data", "snapshot": "allocator snapshot", "ranks": "second rank",
               "run": "step record"}


def _inputs(side: dict) -> set[str]:
    """Which rule inputs the side had (`Rule.requires`): a rule that needs one it lacks never ran."""
    have = set()
    for t in side["report"].get("traces") or []:
        if t.get("kind") == "trace" and "steps" in t:
            have.add("trace")
        if t.get("memory") is not None:
            have.add("memory")
            if "snapshot" in (t["memory"].get("sources") or []):
                have.add("snapshot")
    if side["report"].get("job") is not None:
        have.add("ranks")
    if side["report"].get("runs"):
        have.add("run")
    return have


# ----------------------------------------------------------------------------------------------------
# The comparison


def compare(before: dict, after: dict) -> dict:
    b_run, a_run = run_figures(before), run_figures(after)
    step = step_change(b_run, a_run)
    findings = match_findings(before, after)
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
        "predictions": predictions(findings["resolved"], step),
        "kernels": changes(before, after, "kernels"),
        "ops": changes(before, after, "ops"),
        "environment": environment(before, after),
    }
    return out


def run_figures(side: dict) -> dict:
    """The headline numbers of one side: step time (median, spread), GPU busy, memory peaks."""
    t = trace_summary(side)
    steps = side.get("steps_ms") or []
    has_steps = bool(t.get("steps")) and t.get("median_step_ms") is not None
    median = t.get("median_step_ms") if has_steps else None
    mem = t.get("memory") or {}
    out = {
        "label": side.get("label"),
        "trace": t.get("trace"),
        "rank": t.get("rank"),
        # a long run's later windows are the same process again, not more ranks
        "traces": len([x for x in side["report"].get("traces") or [] if x.get("window", 1) == 1]),
        "device": t.get("device"),
        "platform": t.get("platform"),
        "steps": t.get("steps") or 0,
        "median_step_ms": median,
        "min_step_ms": min(steps) if steps and has_steps else None,
        "max_step_ms": max(steps) if steps and has_steps else None,
        "spread_pct": None,
        "unprofiled_median_step_ms": _get(side, "unprofiled_median_step_ms"),
        "profiler_overhead_x": _get(side, "profiler_overhead_x"),
        "gpu_busy_in_steps_pct": t.get("gpu_busy_in_steps_pct"),
        "gpu_busy_pct": t.get("gpu_busy_pct"),
        "peak_allocated_bytes": mem.get("peak_allocated_bytes"),
        "peak_reserved_bytes": mem.get("peak_reserved_bytes"),
        "findings": len(side["report"].get("findings") or []),
    }
    if median and out["min_step_ms"] is not None:
        # max − min over the median: how much the profiled steps disagree with each other
        out["spread_pct"] = round(100 * (out["max_step_ms"] - out["min_step_ms"]) / median, 1)
    return out


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


def breakdown(before: dict, after: dict) -> list[dict]:
    """The median step split side by side (ms per step)."""
    b = trace_summary(before).get("step_breakdown_ms") or {}
    a = trace_summary(after).get("step_breakdown_ms") or {}
    rows = []
    for key, label in BREAKDOWN:
        if key not in b and key not in a:
            continue
        bv, av = b.get(key), a.get(key)
        rows.append({"part": key, "label": label, "before_ms": bv, "after_ms": av,
                     "change_ms": round(av - bv, 3) if bv is not None and av is not None else None})
    return rows


def _by_rule(findings: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in findings:  # the report lists them biggest saving first: the first of a rule leads
        out.setdefault(f.get("rule"), []).append(f)
    return out


def _side_of(fs: list[dict]) -> dict:
    f = fs[0]
    imp = f.get("impact") or {}
    return {"severity": f.get("severity"), "est_step_saving_pct": imp.get("est_step_saving_pct"),
            "upper_bound": bool(imp.get("upper_bound")), "count": len(fs), "message": f.get("message"),
            "ranks": sorted({x.get("rank") for x in fs if x.get("rank") is not None})}


def match_findings(before: dict, after: dict) -> dict:
    from gpuadvise.rules import find_rule

    fb, fa = _by_rule(before["report"].get("findings") or []), _by_rule(after["report"].get("findings") or [])
    have_b, have_a = _inputs(before), _inputs(after)
    out = {"resolved": [], "new": [], "still_there": [], "unchecked": []}
    for rule in list(fb) + [r for r in fa if r not in fb]:
        b, a = fb.get(rule), fa.get(rule)
        lead = (b or a)[0]
        entry = {"rule": rule, "topic": lead.get("topic"), "title": lead.get("title"),
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


def _moved_numbers(b: dict, a: dict) -> list[dict]:
    """The figures both findings quote (evidence.numbers), before → after."""
    nb = (b.get("evidence") or {}).get("numbers") or {}
    na = (a.get("evidence") or {}).get("numbers") or {}
    rows = []
    for key in nb:
        vb, va = nb.get(key), na.get(key)
        if key in na and _num(vb) and _num(va):
            rows.append({"key": key, "before": vb, "after": va})
    return rows


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def predictions(resolved: list[dict], step: dict) -> list[dict]:
    """Each resolved finding's predicted saving (on BEFORE) next to the change measured."""
    return [{"rule": f["rule"], "topic": f["topic"], "title": f["title"],
             "predicted_pct": f["before"]["est_step_saving_pct"], "upper_bound": f["before"]["upper_bound"],
             "measured_saving_pct": step.get("saving_pct"), "figure": step.get("figure")}
            for f in resolved]


def changes(before: dict, after: dict, table: str) -> list[dict]:
    """Kernels (or ops) whose time per step changed most, biggest change first."""
    def per_step(side):
        n = max(int(trace_summary(side).get("steps") or 0), 1)  # without steps: the whole window
        return {row["name"]: (row["total_ms"] / n, row["count"] / n) for row in side.get(table) or []}

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


def env_facts(side: dict) -> dict[str, object]:
    """The facts worth comparing, flattened: `settings.cudnn_benchmark`, `dataloader[0].num_workers`, …"""
    t = trace_summary(side)
    out: dict[str, object] = {}
    for key in ("device", "compute_capability", "platform"):
        if t.get(key) is not None:
            out[f"trace.{key}"] = t.get(key)
    alloc = (t.get("memory") or {}).get("allocator_settings") or {}
    for k, v in alloc.items():
        out[f"allocator.{k}"] = v
    facts = side.get("facts") or {}
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


def environment(before: dict, after: dict) -> list[dict]:
    """The facts that differ. A run.json fact is compared only when both runs have a run.json."""
    eb, ea = env_facts(before), env_facts(after)
    both_facts = bool(before.get("facts")) and bool(after.get("facts"))
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


def warnings(before: dict, after: dict, b: dict, a: dict, step: dict) -> list[str]:
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
    s_b, s_a = (before.get("facts") or {}).get("script"), (after.get("facts") or {}).get("script")
    if s_b and s_a and s_b != s_a:
        out.append(f"different scripts were run: {s_b} on BEFORE, {s_a} on AFTER")
    prof = sorted(k for k in set(eb) | set(ea) if k.startswith("profiler.") and eb.get(k) != ea.get(k))
    if prof and before.get("facts") and after.get("facts"):
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
        bad = [n for t in side["report"].get("traces") or [] for n in t.get("notes") or []
               if "cut off" in n or "damaged" in n]
        if bad:
            out.append(f"{name}'s trace is incomplete: {bad[0]}")
    sb, sa = _snapshot(before), _snapshot(after)
    if sb != sa:
        out.append(f"only {'BEFORE' if sb else 'AFTER'} has an allocator snapshot: memory findings are not compared like for like")
    return out


def _snapshot(side: dict) -> bool:
    return any("snapshot" in ((t.get("memory") or {}).get("sources") or []) for t in side["report"].get("traces") or [])

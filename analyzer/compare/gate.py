"""The CI gate on a comparison (`gpuadvise compare --fail-on-regression PCT --fail-on …`): whether AFTER
got slower than allowed, or brings new findings the gate names."""

from __future__ import annotations


def apply_gate(cmp: dict, fail_on=None, regression_pct: float | None = None) -> dict:
    """Adds `gate` to the comparison: whether the step got slower by more than `regression_pct`, and
    the new findings `fail_on` matches (those on AFTER only, including ones BEFORE could not check).
    `failed` is what the exit code follows."""
    from gpuadvise.analyzer.errors import InputError

    g = {"fail_on": getattr(fail_on, "text", None) or None, "fail_on_regression_pct": regression_pct,
         "regressed": None, "failing_findings": [], "failed": False, "reasons": []}
    if regression_pct is not None:
        change = cmp["step_time"].get("change_pct")
        if change is None:
            raise InputError(None, f"--fail-on-regression: {cmp['step_time'].get('note') or 'no step time to compare'}")
        g["regressed"] = change > regression_pct
        if g["regressed"]:
            g["reasons"].append(f"the step got {change:.1f} % slower ({cmp['step_time']['figure']} median "
                                f"{cmp['step_time']['before_ms']:.2f} → {cmp['step_time']['after_ms']:.2f} ms), "
                                f"more than the {regression_pct:g} % allowed")
    if fail_on:
        candidates = cmp["findings"]["new"] + [f for f in cmp["findings"]["unchecked"] if f["before"] is None]
        hits = [f for f in candidates
                if fail_on.matches({"severity": f["after"]["severity"], "topic": f["topic"], "rule": f["rule"]})]
        g["failing_findings"] = [{"rule": f["rule"], "topic": f["topic"], "severity": f["after"]["severity"]} for f in hits]
        if hits:
            from gpuadvise.analyzer.run.gate import describe

            g["reasons"].append(f"new finding{'s' if len(hits) > 1 else ''} matching --fail-on {fail_on.text}: "
                                + describe(g["failing_findings"]))
    g["failed"] = bool(g["reasons"])
    cmp["gate"] = g
    return cmp

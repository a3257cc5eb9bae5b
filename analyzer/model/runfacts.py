"""Typed reads of the run.json facts `gpuadvise profile` records (`Analysis.facts`).

run.json is user-editable JSON: every reader here checks types and returns None / {} for anything
missing or malformed, so a rule never fails over a hand-edited file. A plain trace has no facts at all.
"""

from __future__ import annotations


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def settings(facts: dict) -> dict:
    """Backend flags (TF32, cudnn.benchmark, determinism, anomaly detection), as the profiled window ended."""
    return _dict(facts.get("settings"))


def flag(facts: dict, name: str) -> bool | None:
    v = settings(facts).get(name)
    return v if isinstance(v, bool) else None


def machine(facts: dict) -> dict:
    """Everything `gpuadvise doctor` checks, as recorded in the profiled process."""
    return _dict(_dict(facts.get("environment")).get("machine"))


def env_vars(facts: dict) -> dict[str, str]:
    """The watched environment variables that were set in the profiled process."""
    return {k: v for k, v in _dict(machine(facts).get("env")).items() if isinstance(k, str) and isinstance(v, str)}


def cuda_available(facts: dict) -> bool | None:
    v = _dict(facts.get("environment")).get("cuda_available")
    return v if isinstance(v, bool) else None


def device_name(facts: dict) -> str | None:
    name = _dict(_dict(facts.get("environment")).get("device")).get("name")
    return name if isinstance(name, str) else None


def param_devices(facts: dict) -> dict[str, int]:
    """Parameters per device type, summed over the optimizers that stepped ({"cpu": 12, "cuda": 0, ...})."""
    out: dict[str, int] = {}
    for opt in facts.get("optimizers") or []:
        if not isinstance(opt, dict):
            continue
        for kind, n in _dict(opt.get("param_devices")).items():
            if isinstance(kind, str) and isinstance(n, int) and not isinstance(n, bool):
                out[kind] = out.get(kind, 0) + n
    return out


def autocast_dtypes(facts: dict) -> list[str]:
    """The dtypes of the autocast contexts the script entered ("torch.bfloat16", ...)."""
    return [str(e.get("dtype")) for e in facts.get("autocast") or [] if isinstance(e, dict) and e.get("dtype")]


def compiled(facts: dict) -> dict:
    """run.json's `compiled` (what torch.compile did while the script ran); {} when it never compiled."""
    return _dict(facts.get("compiled"))


def step_times_ms(facts: dict) -> dict[int, float]:
    """Every timed step (run.json `steps`: number → ms), in and out of the profiled window."""
    steps = _dict(facts.get("steps"))
    numbers, ms = steps.get("number"), steps.get("ms")
    if not isinstance(numbers, list) or not isinstance(ms, list):
        return {}
    return {n: float(v) for n, v in zip(numbers, ms)
            if isinstance(n, int) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}

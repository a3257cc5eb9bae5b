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


def describe_device(facts: dict | None, model=None, has_gpu: bool | None = None) -> str:
    """The device in one phrase, from the best source (run.json, then the trace), so every format and the
    TUI print the same words."""
    facts = facts or {}
    name = device_name(facts)
    dev = model.device if model is not None else None
    if name is None and dev is not None and dev.name:
        name = dev.name
    if name:
        parts = [name]
        if dev is not None and dev.name == name and dev.compute_major is not None:
            parts.append(f"sm {dev.compute_major}.{dev.compute_minor}")
        if dev is not None and dev.name == name and dev.total_memory:
            parts.append(f"{dev.total_memory / 2**30:.1f} GiB")
        platform = getattr(getattr(model, "meta", None), "platform", "unknown")
        if platform and platform != "unknown":
            parts.append(platform.upper())
        return ", ".join(parts)
    if cuda_available(facts) is False:
        return "CPU only (run.json: no GPU was available)"
    if has_gpu:
        return "a GPU not named in the trace (no deviceProperties)"
    if model is not None and model.meta.devices:
        return "GPU listed in the trace, but no GPU activity recorded"
    return "CPU only (no GPU activity in the trace, no run.json)" if model is not None else "not recorded"


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

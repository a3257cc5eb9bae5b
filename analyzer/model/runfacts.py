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


# -- issue 23: where the DataLoader's time goes (run.json `loader`, written by capture/loaderprobe.py) --------

def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


def usable_cpus(facts: dict) -> int | None:
    """CPU cores the profiled process could use (its affinity, capped by a cgroup quota)."""
    cpu = _dict(machine(facts).get("cpu"))
    usable, limit = _num(cpu.get("usable")), _num(cpu.get("cgroup_limit"))
    if usable is None:
        return None
    return int(min(usable, limit)) if limit else int(usable)


def loader_profile(facts: dict) -> dict | None:
    """run.json's `loader`, numbers checked: None without a measured batch build time."""
    lp = _dict(facts.get("loader"))
    build = _num(lp.get("build_ms_per_batch"))
    if not build:
        return None
    out = {k: _num(lp.get(k)) for k in ("build_ms_per_batch", "fetch_ms_per_batch", "fetch_ms_per_sample",
                                         "collate_ms_per_batch", "wait_ms_per_batch", "between_batches_ms",
                                         "batches_built", "samples")}
    workers = lp.get("num_workers")
    out["num_workers"] = workers if isinstance(workers, int) and not isinstance(workers, bool) and workers >= 0 else None
    out["fetch"] = lp.get("fetch") if isinstance(lp.get("fetch"), str) else "__getitem__"
    out["functions"] = [
        {"function": f["function"], "file": f["file"], "line": int(f["line"]), "share_pct": float(f["share_pct"]),
         "ms_per_batch": _num(f.get("ms_per_batch"))}
        for f in lp.get("functions") or []
        if isinstance(f, dict) and isinstance(f.get("function"), str) and isinstance(f.get("file"), str)
        and _num(f.get("line")) is not None and _num(f.get("share_pct")) is not None]
    return out

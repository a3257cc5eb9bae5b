"""Typed reads of the run.json facts `gpuadvise profile` records (`Analysis.facts`).

Rules read run.json only through these functions, never `a.facts[...]` directly: the file is
user-editable JSON, so every reader here checks types and returns None / {} / [] for anything
missing or malformed, and a rule never fails over a hand-edited file. A plain trace has no facts at
all. docs/rule-api.md lists every accessor.
"""

from __future__ import annotations

from dataclasses import dataclass


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def settings(facts: dict) -> dict:
    """Backend flags (TF32, cudnn.benchmark, determinism, anomaly detection), as the profiled window ended."""
    return _dict(_dict(facts).get("settings"))


def settings_read_at(facts: dict) -> str | None:
    """When the settings were read ("window end" or "exit"): what the traced steps ran with, or later."""
    return _str(settings(facts).get("read_at"))


def flag(facts: dict, name: str) -> bool | None:
    """One backend flag from `settings` ("cudnn_benchmark", "matmul_allow_tf32", "anomaly_detection",
    "deterministic_algorithms", "cudnn_deterministic", ...); None when not recorded."""
    v = settings(facts).get(name)
    return v if isinstance(v, bool) else None


def machine(facts: dict) -> dict:
    """Everything `gpuadvise doctor` checks, as recorded in the profiled process."""
    return _dict(_dict(_dict(facts).get("environment")).get("machine"))


def env_vars(facts: dict) -> dict[str, str]:
    """The watched environment variables that were set in the profiled process."""
    return {k: v for k, v in _dict(machine(facts).get("env")).items() if isinstance(k, str) and isinstance(v, str)}


def cuda_available(facts: dict) -> bool | None:
    v = _dict(_dict(facts).get("environment")).get("cuda_available")
    return v if isinstance(v, bool) else None


def device_name(facts: dict) -> str | None:
    name = _dict(_dict(_dict(facts).get("environment")).get("device")).get("name")
    return name if isinstance(name, str) else None


def param_devices(facts: dict) -> dict[str, int]:
    """Parameters per device type, summed over the optimizers that stepped ({"cpu": 12, "cuda": 0, ...})."""
    out: dict[str, int] = {}
    for opt in optimizers(facts):
        for kind, n in opt.param_devices.items():
            out[kind] = out.get(kind, 0) + n
    return out


def autocast_dtypes(facts: dict) -> list[str]:
    """The dtypes of the autocast contexts the script entered ("torch.bfloat16", ...)."""
    return [str(e["dtype"]) for e in _entries(facts, "autocast") if e.get("dtype")]


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _bool(v) -> bool | None:
    return v if isinstance(v, bool) else None


def _entries(facts: dict, key: str) -> list[dict]:
    v = _dict(facts).get(key)
    return [e for e in v if isinstance(e, dict)] if isinstance(v, list) else []


@dataclass(frozen=True)
class DataLoaderFact:
    """One `torch.utils.data.DataLoader` the script built, with the settings it was built with."""

    created_at: str  # "file.py:LINE" of the user code that built it, "?" when unknown
    num_workers: int | None
    pin_memory: bool | None
    batch_size: int | None
    prefetch_factor: int | None
    persistent_workers: bool | None


@dataclass(frozen=True)
class WrapperFact:
    """One model wrapper the script built: kind is "DataParallel" or "DistributedDataParallel"."""

    kind: str
    created_at: str


@dataclass(frozen=True)
class OptimizerFact:
    """One optimizer that stepped: its class name, whether it was built with foreach/fused (None: the
    default), how many parameters it holds and on which device types."""

    cls: str
    foreach: bool | None
    fused: bool | None
    params: int | None
    param_devices: dict[str, int]

    def as_dict(self) -> dict:
        """The fact as run.json spells it, for evidence."""
        return {"class": self.cls, "foreach": self.foreach, "fused": self.fused, "params": self.params,
                "param_devices": dict(self.param_devices)}


def dataloaders(facts: dict) -> list[DataLoaderFact]:
    """Every DataLoader the script built, in creation order."""
    return [DataLoaderFact(created_at=_str(e.get("created_at")) or "?", num_workers=_int(e.get("num_workers")),
                           pin_memory=_bool(e.get("pin_memory")), batch_size=_int(e.get("batch_size")),
                           prefetch_factor=_int(e.get("prefetch_factor")),
                           persistent_workers=_bool(e.get("persistent_workers")))
            for e in _entries(facts, "dataloaders")]


def wrappers(facts: dict, kind: str | None = None) -> list[WrapperFact]:
    """The DataParallel / DistributedDataParallel wrappers the script built (only `kind` when given)."""
    out = [WrapperFact(kind=_str(e.get("kind")) or "?", created_at=_str(e.get("created_at")) or "?")
           for e in _entries(facts, "wrappers")]
    return [w for w in out if kind is None or w.kind == kind]


def optimizers(facts: dict, cls: str | None = None) -> list[OptimizerFact]:
    """The optimizers that stepped (only those of class name `cls` when given, e.g. "AdamW")."""
    out = []
    for e in _entries(facts, "optimizers"):
        devices = {k: n for k, n in _dict(e.get("param_devices")).items() if isinstance(k, str) and _int(n) is not None}
        out.append(OptimizerFact(cls=_str(e.get("class")) or "?", foreach=_bool(e.get("foreach")),
                                 fused=_bool(e.get("fused")), params=_int(e.get("params")), param_devices=devices))
    return [o for o in out if cls is None or o.cls == cls]

"""The GPU's own telemetry over a run, as `gpuadvise profile` sampled it with NVML about once a second
(`telemetry.jsonl` beside the step record; the format is in gpuadvise/harness/steps/telemetry.py), read by
read/telemetry.py. Each sample carries the step the training thread had reached, so a sample belongs to
the steps around it. NaN: the GPU did not report that reading."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# throttle reasons in words (as the capture writes them), by what they say about the machine
THERMAL = ("software thermal slowdown", "hardware thermal slowdown")
POWER = ("software power cap", "hardware power brake slowdown")


@dataclass
class Telemetry:
    source: str
    device: dict  # name, index, max_sm_clock_mhz, power_limit_w, memory_total_bytes (those reported)
    t: np.ndarray  # s since sampling began
    step: np.ndarray  # int, the step boundaries the training thread had passed
    util_pct: np.ndarray
    sm_clock_mhz: np.ndarray
    mem_used_bytes: np.ndarray
    power_w: np.ndarray
    temp_c: np.ndarray
    reasons: list[list[str]] = field(default_factory=list)  # per sample, the throttle reasons in words
    damaged_lines: int = 0

    @property
    def samples(self) -> int:
        return int(len(self.t))

    @property
    def max_sm_clock_mhz(self) -> float | None:
        v = self.device.get("max_sm_clock_mhz")
        return float(v) if isinstance(v, (int, float)) and v > 0 else None

    def between(self, first: int, last: int | None = None) -> np.ndarray:
        """A mask of the samples taken from step `first` to step `last` (None: to the end)."""
        mask = self.step >= first
        return mask & (self.step <= last) if last is not None else mask

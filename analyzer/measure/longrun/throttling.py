"""What the GPU's own telemetry (model/telemetry.py) says about a slowdown: did the SM clock fall, and why
(thermal or power throttling, as NVML reports its reasons)?

`throttling_evidence(telemetry, before, during)` compares the SM clock samples taken during two step
ranges (before a drift and during it; a slow rank's against the others': `clock_gap`). The clock counts
as fallen only when the fall is beyond chance: a one-sided Mann-Whitney U test on the samples (normal
approximation with a tie correction, p < `P_MAX`) and a median fall of at least `MIN_FALL_PCT`; with
fewer than `MIN_SAMPLES` samples a side, it says nothing. The throttle reasons are those NVML reported in
at least a quarter of the slow side's samples and in fewer than half as many of the other side's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuadvise.analyzer.model.telemetry import POWER, THERMAL, Telemetry

MIN_SAMPLES = 3
MIN_FALL_PCT = 5.0
P_MAX = 0.01
REASON_SHARE = 0.25


@dataclass
class Throttling:
    """The clock fell from `before_mhz` to `during_mhz` (medians of the samples), beyond chance (`p`)."""

    before_mhz: float
    during_mhz: float
    fell_pct: float
    p: float
    samples: tuple[int, int]
    max_mhz: float | None = None
    reasons: list[str] = field(default_factory=list)  # NVML's reasons on the slow side, most frequent first
    before_temp_c: float | None = None
    during_temp_c: float | None = None
    during_power_w: float | None = None
    power_limit_w: float | None = None

    @property
    def cause(self) -> str:
        """"thermal", "power" or "clocks" (fell with no thermal or power reason reported)."""
        if any(r in THERMAL for r in self.reasons):
            return "thermal"
        if any(r in POWER for r in self.reasons):
            return "power"
        return "clocks"

    @property
    def slowdown_pct(self) -> float:
        """How much slower GPU-bound work runs at the lower clock: before / during − 1 (a ceiling: memory-
        bound kernels and the CPU's share of the step slow less)."""
        return 100.0 * (self.before_mhz / self.during_mhz - 1.0) if self.during_mhz > 0 else 0.0

    def share_of(self, drift_pct: float) -> float:
        """The most of a drift of `drift_pct` % the clock's fall can explain, in % (at most 100)."""
        return 100.0 if drift_pct <= 0 else min(100.0, 100.0 * self.slowdown_pct / drift_pct)

    def sentence(self, drift_pct: float | None = None) -> str:
        """What the telemetry shows, in one sentence; given the drift it is measured against, whether the
        clock's fall explains it (at least half of it) or only part of it."""
        said = {"thermal": "thermal throttling", "power": "power throttling", "clocks": "the GPU's lower clock"}[self.cause]
        out = (f"The GPU's SM clock fell from a median {self.before_mhz:.0f} MHz to {self.during_mhz:.0f} MHz "
               f"(−{self.fell_pct:.0f} %, NVML samples {self.samples[0]} vs {self.samples[1]})" + self._why(" ", "was"))
        if drift_pct is None or self.explains(drift_pct):
            return out + f": {said}, not the code, slowed the steps."
        return (out + f": {said} makes GPU-bound work up to {self.slowdown_pct:.0f} % slower, at most "
                f"{self.share_of(drift_pct):.0f} % of this drift.")

    def explains(self, drift_pct: float) -> bool:
        """The clock's fall can account for at least half of the drift."""
        return self.share_of(drift_pct) >= 50.0

    def rank_sentence(self, rank) -> str:
        """A slow rank's GPU against the other ranks' (clock_gap), in one sentence."""
        out = (f"Rank {rank}'s GPU ran at a median SM clock of {self.during_mhz:.0f} MHz against {self.before_mhz:.0f} MHz "
               f"on the other ranks (−{self.fell_pct:.0f} %, NVML)" + self._why(", ", "the others"))
        return out + f": GPU-bound work runs up to {self.slowdown_pct:.0f} % slower there."

    def _why(self, sep: str, before: str) -> str:
        """NVML's reasons, and the temperature (thermal) or the power against its limit (power)."""
        out = f"{sep}with NVML reporting {', '.join(self.reasons)}" if self.reasons else ""
        if self.cause == "thermal" and self.during_temp_c is not None and self.before_temp_c is not None:
            out += f" at {self.during_temp_c:.0f} °C ({before} {self.before_temp_c:.0f} °C)"
        if self.cause == "power" and self.during_power_w is not None and self.power_limit_w:
            out += f" at {self.during_power_w:.0f} W of a {self.power_limit_w:.0f} W limit"
        return out

    def advice(self) -> str:
        """What to do about it: the machine, not the training script."""
        check = "Run `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER` while it is slow: it lists the active throttle reasons."
        if self.cause == "thermal":
            return ("The GPU slows itself down to stay within its temperature limit: improve its cooling (airflow, fan "
                    "curve, the server's inlet temperature, a neighbour card's exhaust). " + check)
        if self.cause == "power":
            return ("The GPU slows itself down to stay within its power limit: raise the limit if the board allows it "
                    "(`nvidia-smi -pl WATTS`, as root), or check that the power supply and its cabling deliver it. " + check)
        return ("The clocks fell with no thermal or power reason reported: check the application clocks "
                "(`nvidia-smi -q -d CLOCK`) and whether another process shares the GPU. " + check)

    def numbers(self) -> dict:
        """The figures for a finding's evidence."""
        return {"sm_clock_before_mhz": round(self.before_mhz), "sm_clock_during_mhz": round(self.during_mhz),
                "sm_clock_fell_pct": round(self.fell_pct, 1), "throttle_reasons": list(self.reasons),
                "clock_samples": list(self.samples)}


def throttling_evidence(telemetry: Telemetry | None, before: tuple[int, int | None],
                        during: tuple[int, int | None]) -> Throttling | None:
    """The clock's fall between the samples of step range `before` and of `during` ((first, last) step, last
    None: to the end), when it is beyond chance; else None (no telemetry, too few samples, no fall)."""
    if telemetry is None or telemetry.samples == 0:
        return None
    a = telemetry.between(*before) & np.isfinite(telemetry.sm_clock_mhz)
    b = telemetry.between(*during) & np.isfinite(telemetry.sm_clock_mhz)
    return _compare(telemetry, a, telemetry, b)


def clock_gap(slow: Telemetry | None, others: list[Telemetry], steps: tuple[int, int | None] = (0, None)) -> Throttling | None:
    """A slow rank's GPU against the other ranks' over the same steps: its clock lower beyond chance."""
    others = [o for o in others if o is not None and o.samples]
    if slow is None or not slow.samples or not others:
        return None
    pooled = Telemetry(source="other ranks", device=others[0].device, t=np.concatenate([o.t for o in others]),
                       step=np.concatenate([o.step for o in others]), util_pct=np.concatenate([o.util_pct for o in others]),
                       sm_clock_mhz=np.concatenate([o.sm_clock_mhz for o in others]),
                       mem_used_bytes=np.concatenate([o.mem_used_bytes for o in others]),
                       power_w=np.concatenate([o.power_w for o in others]), temp_c=np.concatenate([o.temp_c for o in others]),
                       reasons=[r for o in others for r in o.reasons])
    a = pooled.between(*steps) & np.isfinite(pooled.sm_clock_mhz)
    b = slow.between(*steps) & np.isfinite(slow.sm_clock_mhz)
    return _compare(pooled, a, slow, b)


def _compare(ta: Telemetry, a: np.ndarray, tb: Telemetry, b: np.ndarray) -> Throttling | None:
    x, y = ta.sm_clock_mhz[a], tb.sm_clock_mhz[b]
    if len(x) < MIN_SAMPLES or len(y) < MIN_SAMPLES:
        return None
    before, during = float(np.median(x)), float(np.median(y))
    if before <= 0:
        return None
    fell = 100.0 * (1.0 - during / before)
    p = _mann_whitney_greater(x, y)
    if fell < MIN_FALL_PCT or p >= P_MAX:
        return None
    return Throttling(before_mhz=before, during_mhz=during, fell_pct=fell, p=p, samples=(len(x), len(y)),
                      max_mhz=tb.max_sm_clock_mhz, reasons=_new_reasons(ta, a, tb, b),
                      before_temp_c=_median(ta.temp_c[a]), during_temp_c=_median(tb.temp_c[b]),
                      during_power_w=_median(tb.power_w[b]), power_limit_w=_limit(tb.device))


def _new_reasons(ta: Telemetry, a: np.ndarray, tb: Telemetry, b: np.ndarray) -> list[str]:
    """NVML's throttle reasons in at least REASON_SHARE of the slow side's samples, and in under half that
    share of the other side's, most frequent first."""
    def shares(t: Telemetry, mask: np.ndarray) -> dict[str, float]:
        idx = np.flatnonzero(mask)
        counts: dict[str, int] = {}
        for i in idx:
            for r in (t.reasons[i] if i < len(t.reasons) else []):
                counts[r] = counts.get(r, 0) + 1
        return {r: c / max(len(idx), 1) for r, c in counts.items()}

    slow, base = shares(tb, b), shares(ta, a)
    kept = [r for r, s in slow.items() if s >= REASON_SHARE and base.get(r, 0.0) < 0.5 * s]
    return sorted(kept, key=lambda r: -slow[r])


def _mann_whitney_greater(x: np.ndarray, y: np.ndarray) -> float:
    """One-sided p-value that x's values are larger than y's (Mann-Whitney U, normal approximation with
    a tie correction and a continuity correction)."""
    n1, n2 = len(x), len(y)
    both = np.concatenate([x, y])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    i = 0
    while i < len(both):  # average ranks over ties
        j = i
        while j + 1 < len(both) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - float(np.sum(counts**3 - counts)) / (n * (n - 1)))
    if var <= 0:
        return 1.0  # every sample the same: no evidence of a difference
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _median(v: np.ndarray) -> float | None:
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else None


def _limit(device: dict) -> float | None:
    v = device.get("power_limit_w")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None

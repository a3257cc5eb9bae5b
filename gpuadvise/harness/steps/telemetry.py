"""The GPU's own telemetry for the whole run: NVML (the `nvidia-ml-py` binding, `import pynvml`; the
optional extra `gpuadvise[nvml]`) sampled about once a second in a daemon thread into the run folder's
`telemetry.jsonl` (`telemetry.rank3.jsonl` under torchrun), beside the step record (record.py).

The training thread never samples: the session starts the thread when the script runs on an NVIDIA GPU
and stops it at the end; each sample reads the step the training thread has reached from an int the
session keeps anyway (`current_step`). No pynvml, no NVIDIA driver, or a query the GPU does not support
is silent: no file, or that field left out.

The file is JSON lines. The first is a header; each other line one sample:

- header: `{"format": "gpuadvise telemetry", "version": 1, "interval_s": 1.0, "device": {"index": 0,
  "name": "NVIDIA H100 80GB HBM3", "chosen_by": "LOCAL_RANK", "max_sm_clock_mhz": 1980,
  "power_limit_w": 700.0, "memory_total_bytes": 85520809984}}`: `chosen_by` says how the process's GPU
  was found (CUDA_VISIBLE_DEVICES and LOCAL_RANK, as torchrun sets them; else the first GPU);
- sample: `{"t": 12.0, "step": 431, "util_pct": 97, "mem_util_pct": 41, "sm_clock_mhz": 1755,
  "mem_used_bytes": 60129542144, "power_w": 688.2, "temp_c": 81, "reasons": ["software power cap"]}`:
  seconds since the thread started, the step boundaries the training thread had passed, and the readings;
  `reasons` are the clock-throttle reasons NVML reports, in words (`THROTTLE_REASONS`; "gpu idle" and
  none are left out).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

FORMAT = "gpuadvise telemetry"
VERSION = 1
INTERVAL_S = 1.0

# NVML's clocks-throttle (clocks-event) reason bits, in words: nvml.h, nvmlClocksThrottleReason*
THROTTLE_REASONS = {
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}


def reasons_in_words(mask: int) -> list[str]:
    """The throttle reasons of an NVML bitmask, in words, without "gpu idle" (not a slowdown)."""
    return [words for bit, words in THROTTLE_REASONS.items() if mask & bit and bit != 0x1]


class Telemetry:
    """The sampling thread. `start()` returns None where there is nothing to sample (no pynvml, no NVIDIA
    GPU, NVML failing to start); `stop()` ends the thread and closes the file."""

    def __init__(self, nvml, handle, path, current_step, device: dict, interval_s: float = INTERVAL_S):
        self.nvml = nvml
        self.handle = handle
        self.path = str(path)
        self.current_step = current_step
        self.device = device
        self.interval_s = interval_s
        self.samples = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._fh = None
        self._thread = threading.Thread(target=self._run, name="gpuadvise-telemetry", daemon=True)

    @classmethod
    def start(cls, path, current_step, interval_s: float = INTERVAL_S, env=None) -> "Telemetry | None":
        try:
            import pynvml as nvml
        except Exception:
            return None
        try:
            nvml.nvmlInit()
        except Exception:
            return None
        try:
            handle, device = _this_process_gpu(nvml, os.environ if env is None else env)
        except Exception:
            _shutdown(nvml)
            return None
        t = cls(nvml, handle, path, current_step, device, interval_s)
        t._thread.start()
        return t

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # -- the thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.open()
            while True:
                self.record()
                if self._stop.wait(self.interval_s):
                    break
        except Exception as exc:  # a failure ends the telemetry, never the training
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.close()
            _shutdown(self.nvml)

    def open(self) -> None:
        """The file, with its header line."""
        self._fh = open(self.path, "w", encoding="utf-8")
        self._fh.write(json.dumps({"format": FORMAT, "version": VERSION, "interval_s": self.interval_s,
                                   "device": self.device}) + "\n")
        self._fh.flush()

    def record(self) -> None:
        """One sample, written and flushed (a kill loses at most the one being taken)."""
        self._fh.write(json.dumps(self.sample(), separators=(",", ":")) + "\n")
        self._fh.flush()
        self.samples += 1

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()

    def sample(self) -> dict:
        nvml, h = self.nvml, self.handle
        out: dict = {"t": round(time.monotonic() - self._t0, 3), "step": int(self.current_step())}
        util = _query(nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out["util_pct"], out["mem_util_pct"] = int(util.gpu), int(util.memory)
        _put(out, "sm_clock_mhz", _query(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM))
        mem = _query(nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out["mem_used_bytes"] = int(mem.used)
        power = _query(nvml.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out["power_w"] = round(power / 1000.0, 1)
        _put(out, "temp_c", _query(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU))
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = _query(reasons, h) if reasons is not None else None
        if mask:
            words = reasons_in_words(int(mask))
            if words:
                out["reasons"] = words
        return out


def _this_process_gpu(nvml, env) -> tuple[object, dict]:
    """The NVML handle of the GPU this process trains on: CUDA_VISIBLE_DEVICES' entry for LOCAL_RANK (as
    torchrun sets them; an index or a GPU UUID), else LOCAL_RANK itself, else the first GPU."""
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    local = env.get("LOCAL_RANK", "")
    pick = int(local) if local.isdigit() else 0
    chosen_by = "LOCAL_RANK" if local.isdigit() else "first GPU"
    if visible:
        entry = visible[pick] if pick < len(visible) else visible[0]
        chosen_by = "CUDA_VISIBLE_DEVICES" + (" and LOCAL_RANK" if local.isdigit() else "")
        if entry.isdigit():
            index = int(entry)
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        else:
            handle = nvml.nvmlDeviceGetHandleByUUID(entry)
            index = _query(nvml.nvmlDeviceGetIndex, handle)
    else:
        index = pick
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    device: dict = {"index": index, "chosen_by": chosen_by}
    name = _query(nvml.nvmlDeviceGetName, handle)
    if name is not None:
        device["name"] = name.decode() if isinstance(name, bytes) else str(name)
    _put(device, "max_sm_clock_mhz", _query(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM))
    limit = _query(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    if limit is not None:
        device["power_limit_w"] = round(limit / 1000.0, 1)
    mem = _query(nvml.nvmlDeviceGetMemoryInfo, handle)
    if mem is not None:
        device["memory_total_bytes"] = int(mem.total)
    return handle, device


def _query(fn, *args):
    """One NVML reading; None where the GPU does not support it (NVMLError) or the binding lacks it."""
    try:
        return fn(*args)
    except Exception:
        return None


def _put(out: dict, key: str, v) -> None:
    if v is not None:
        out[key] = int(v)


def _shutdown(nvml) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:
        pass

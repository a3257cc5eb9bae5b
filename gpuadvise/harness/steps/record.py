"""The whole run's step times and memory, always: a bounded record appended to a sidecar file of the run
folder (`steps.jsonl`, `steps.rank3.jsonl` under torchrun) while the script runs, so a crash, a kill or an
`os._exit` keeps everything up to the last flush (at most `FLUSH_S` old).

The file is JSON lines. The first is a header; the others are blocks of steps, in step order:

- header: `{"format": "gpuadvise step record", "version": 1, "exact_steps": 10000, "memory_every": 5,
  "phases": {letter: phase}}`;
- exact block (steps below `exact_steps`): `{"first": n, "phase": "wwwsuuaaan…", "cpu": [ms, …],
  "gpu": [ms|null, …]}`: consecutive steps from n, one letter and one time each; `cpu` is the wall time
  (`time.perf_counter_ns()`), `gpu` the CUDA-event time where the script ran on a GPU (absent when no
  step of the block has one);
- bucket (steps from `exact_steps` on): `{"bucket": [first, last], "n": k, "other": j, "cpu": [median,
  min, max], "gpu": [median, min, max], "max_step": s}`: the `k` unprofiled steps of a run of steps
  summarised (`other`: steps of the range the profiler touched, left out), `max_step` the slowest of
  them. A bucket is `10 ** (digits(step) − 3)` steps wide (100 steps from step 10 000, 1 000 from
  100 000, …), so a run of N steps writes about 900 lines per tenfold N: bounded by its length's log;
- `"mem": [[step, rss_bytes, allocated_bytes|null, reserved_bytes|null], …]` on any block: the process's
  resident memory every `memory_every` steps, and on a GPU the caching allocator's allocated and
  reserved bytes (at most every `ALLOCATOR_EVERY_S`: `memory_stats()` costs ~50 µs). In the bucket
  range, one sample per bucket;
- `"workers": [[step, n], …]` on a line of its own: each DataLoader iterator that started `n` worker
  processes, and the step it started in (each epoch's iterator starts its workers anew unless the loader
  keeps them with `persistent_workers=True`).

Phases (`phase` letters): w wait, s shapes (the probe step), u warm-up, a active (recorded), m memory
(CUDA memory history), n not profiled (after a window), o off (profiling failed). A step's time is final
when it reaches this record (on a GPU, once its CUDA events resolved), so blocks arrive in step order.

A failure here switches the record off (`error`) and never reaches the user's loop.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time

FORMAT = "gpuadvise step record"
VERSION = 1
EXACT_STEPS = 10_000
BLOCK_STEPS = 1_000  # an exact block is written at the latest when it holds this many steps
FLUSH_S = 1.0
MEMORY_EVERY = 5
ALLOCATOR_EVERY_S = 0.1
PHASES = {"wait": "w", "shapes": "s", "warmup": "u", "active": "a", "memory": "m", "after": "n", "off": "o"}
UNPROFILED = ("w", "n", "o")


def bucket_width(step: int) -> int:
    return 10 ** max(0, len(str(max(step, 0))) - 3)


class StepRecord:
    """Appends finished steps (`add`) and memory samples (`memory`) to the sidecar file at `path`."""

    def __init__(self, path, exact_steps: int = EXACT_STEPS, flush_s: float = FLUSH_S):
        self.path = str(path)
        self.exact_steps = exact_steps
        self.flush_s = flush_s
        self.error: str | None = None
        self.count = 0
        self._lines: list[str] = []
        self._block: dict | None = None  # the exact block being filled
        self._bucket: dict | None = None  # the bucket being filled
        self._mem: list[list] = []
        self._workers: list[list] = []
        self._last_flush = time.monotonic()
        self._last_allocator = -1e9
        self._fh = None
        self._statm = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    # -- input ---------------------------------------------------------------------------------------
    def add(self, number: int, phase: str, cpu_ms: float, gpu_ms: float | None) -> None:
        """One step's final time (ms by the wall clock, and by the GPU's CUDA events when there were any)."""
        if self.error:
            return
        try:
            self.count += 1
            letter = PHASES.get(phase, "o")
            if number < self.exact_steps:
                self._exact(number, letter, cpu_ms, gpu_ms)
            else:
                self._bucketed(number, letter, cpu_ms, gpu_ms)
        except Exception as exc:
            self._disable(exc)

    def wants_memory(self, number: int) -> bool:
        return not self.error and number % max(MEMORY_EVERY, bucket_width(number) if number >= self.exact_steps else 1) == 0

    def memory(self, number: int, torch=None) -> None:
        """A memory sample at step boundary `number`: resident memory, and the CUDA allocator's bytes."""
        if self.error:
            return
        try:
            allocated = reserved = None
            now = time.monotonic()
            if torch is not None and now - self._last_allocator >= ALLOCATOR_EVERY_S and _cuda_ready(torch):
                self._last_allocator = now
                allocated, reserved = int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())
            self.sample(number, self._rss(), allocated, reserved)
        except Exception as exc:
            self._disable(exc)

    def sample(self, number: int, rss: int | None, allocated: int | None, reserved: int | None) -> None:
        """Record a memory sample taken at step boundary `number` (bytes; None: not measured)."""
        self._mem.append([number, rss, allocated, reserved])

    def workers_started(self, number: int, workers: int) -> None:
        """A DataLoader iterator started `workers` worker processes during step `number`."""
        if not self.error and len(self._workers) < 10_000:
            self._workers.append([number, workers])

    def watch_worker_starts(self, torch, step_now) -> None:
        """Record each multi-process DataLoader iterator as it starts its workers (`step_now()`: the step
        running). Installed once; a failure leaves the loader as it was."""
        try:
            import torch.utils.data.dataloader as dl

            cls = dl._MultiProcessingDataLoaderIter
            original = cls.__init__
            if getattr(original, "_gpuadvise_workers", False):
                return
            record = self

            @functools.wraps(original)
            def __init__(it, *args, **kwargs):
                original(it, *args, **kwargs)
                try:
                    record.workers_started(int(step_now()), int(getattr(it, "_num_workers", 0) or 0))
                except Exception:
                    pass

            __init__._gpuadvise_workers = True
            cls.__init__ = __init__
        except Exception:
            pass

    def tick(self) -> None:
        """At a step boundary: write what is pending once `flush_s` has passed (one clock read otherwise)."""
        if self.error or time.monotonic() - self._last_flush < self.flush_s:
            return
        self.flush()

    def close(self) -> None:
        """At the end of the run: the partial block or bucket too."""
        if self.error:
            return
        self._end_bucket()
        self.flush()
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None

    def flush(self) -> None:
        if self.error:
            return
        try:
            self._end_block()
            if self._mem:  # samples of the bucket range ride on their own line until a bucket ends
                self._lines.append(json.dumps({"mem": self._mem}, separators=(",", ":")))
                self._mem = []
            if self._workers:
                self._lines.append(json.dumps({"workers": self._workers}, separators=(",", ":")))
                self._workers = []
            if self._lines:
                if self._fh is None:
                    self._open()
                self._fh.write("\n".join(self._lines) + "\n")
                self._fh.flush()
                self._lines = []
            self._last_flush = time.monotonic()
        except Exception as exc:
            self._disable(exc)

    # -- internals -----------------------------------------------------------------------------------
    def _open(self) -> None:
        fresh = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        self._fh = open(self.path, "a", encoding="utf-8")
        if fresh:
            header = {"format": FORMAT, "version": VERSION, "exact_steps": self.exact_steps,
                      "memory_every": MEMORY_EVERY, "phases": {v: k for k, v in PHASES.items()}}
            self._fh.write(json.dumps(header) + "\n")

    def _exact(self, number: int, letter: str, cpu_ms: float, gpu_ms: float | None) -> None:
        b = self._block
        if b is not None and (number != b["first"] + len(b["cpu"]) or len(b["cpu"]) >= BLOCK_STEPS):
            self._end_block()
            b = None
        if b is None:
            b = self._block = {"first": number, "phase": [], "cpu": [], "gpu": []}
        b["phase"].append(letter)
        b["cpu"].append(round(cpu_ms, 3))
        b["gpu"].append(None if gpu_ms is None else round(gpu_ms, 3))

    def _end_block(self) -> None:
        b, self._block = self._block, None
        if b is None or not b["cpu"]:
            return
        line = {"first": b["first"], "phase": "".join(b["phase"]), "cpu": b["cpu"]}
        if any(v is not None for v in b["gpu"]):
            line["gpu"] = b["gpu"]
        if self._mem:
            line["mem"], self._mem = self._mem, []
        self._lines.append(json.dumps(line, separators=(",", ":")))

    def _bucketed(self, number: int, letter: str, cpu_ms: float, gpu_ms: float | None) -> None:
        self._end_block()
        width = bucket_width(number)
        key = (width, number // width)
        if self._bucket is not None and self._bucket["key"] != key:
            self._end_bucket()
        if self._bucket is None:
            self._bucket = {"key": key, "first": number, "last": number, "cpu": [], "gpu": [], "steps": [], "other": 0}
        b = self._bucket
        b["last"] = number
        if letter in UNPROFILED:
            b["cpu"].append(cpu_ms)
            b["gpu"].append(gpu_ms)
            b["steps"].append(number)
        else:
            b["other"] += 1

    def _end_bucket(self) -> None:
        b, self._bucket = self._bucket, None
        if b is None:
            return
        line: dict = {"bucket": [b["first"], b["last"]], "n": len(b["cpu"]), "other": b["other"]}
        if b["cpu"]:
            line["cpu"] = _stats(b["cpu"])
            gpu = [v for v in b["gpu"] if v is not None]
            if gpu:
                line["gpu"] = _stats(gpu)
            main = [g if g is not None else c for c, g in zip(b["cpu"], b["gpu"])] if gpu else b["cpu"]
            line["max_step"] = b["steps"][max(range(len(main)), key=main.__getitem__)]
        if self._mem:
            line["mem"], self._mem = self._mem, []
        self._lines.append(json.dumps(line, separators=(",", ":")))

    def _rss(self) -> int | None:
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            fields = os.pread(self._statm, 128, 0).split()
            return int(fields[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None  # not Linux: no resident-memory figure

    def _disable(self, exc: BaseException) -> None:
        self.error = f"{type(exc).__name__}: {exc}"


def _stats(values: list[float]) -> list[float]:
    return [round(statistics.median(values), 3), round(min(values), 3), round(max(values), 3)]


def _cuda_ready(torch) -> bool:
    """CUDA is in use by the script (never initialised by us for a CPU script)."""
    try:
        return torch.cuda.is_initialized()
    except Exception:
        return False

"""Where the DataLoader's time goes, measured while the profiler's window records.

torch.profiler sees neither plain-Python loading work nor worker processes, so each process that
builds batches (the training process with `num_workers=0`, every worker otherwise) times its own
batches and samples its own stack with pyinstrument, only inside the fetch that builds a batch and
only while the window records:

- the fetcher (`torch.utils.data._utils.fetch`) is wrapped: per batch, the build time, the time in
  `collate_fn` (the rest is `__getitem__` / `__getitems__` / the iterable's `next`), the samples;
- workers get the wrapper through the DataLoader's `worker_init_fn`, chained: the user's own function
  still runs, first (`WorkerInit`, picklable, so spawned workers get it too); it is put in place only
  while the iterator starts its workers, so the user's DataLoader object keeps its own;
- workers learn that the window records from a flag file in a temporary folder (they are separate
  processes, forked or spawned) and each writes what it measured to a small JSON file beside it; a
  run killed inside the window leaves that folder, and the next run removes it (`sweep_dead_runs`);
- the training process times its wait for each batch (`__next__`) and the time between batches
  (what one step spends on each batch when it does not wait).

`attach` registers it on the session's window hooks: on at the first recorded step, off when the
window ends, when `summary()` merges it all into run.json's `capture.loader` (docs/profiling.md, "Where the
DataLoader's time goes") and the per-process files are removed.
"""

from __future__ import annotations

import functools
import json
import os
import time

from gpuadvise.analyzer.model import frames

FOLDER_PREFIX = "gpuadvise-loader-"  # + pid: a temporary folder, never the run folder (a killed run leaves nothing there)
FLAG = "recording"
INTERVAL_S = 0.001  # pyinstrument's sampling interval
TOP_FUNCTIONS = 12

_RECORDER: Recorder | None = None


class Recorder:
    """What one process measured of the batches it built inside the window."""

    def __init__(self, folder: str, role: str, flag_file: bool):
        self.folder, self.role = folder, role
        self.pid = os.getpid()
        self.flag_file = flag_file  # workers read the flag file; the training process is told directly
        self.on = False
        self.batches = 0
        self.samples = 0
        self.build_ns = 0
        self.build_cpu_ns = 0  # the building thread's CPU time: the part of the build a worker needs a core for
        self.collate_ns = 0
        self.sampled_s = 0.0
        self.fetch_kind: str | None = None
        self.functions: dict[tuple[str, str, int], float] = {}  # (function, file, line) → seconds inside it
        self._pending: list = []  # sampled sessions not yet added to `functions`
        self.window_id = None  # a worker: the flag file it last saw (a new one: a new window)

    def recording(self) -> bool:
        if os.getpid() != self.pid:  # a process forked without our worker_init_fn: not ours to record
            return False
        if self.flag_file:
            try:
                st = os.stat(os.path.join(self.folder, FLAG))
            except OSError:
                return False
            window = (st.st_ino, st.st_mtime_ns)  # each window makes the flag anew
            if window != self.window_id:  # a persistent worker's counts restart with each window
                self.window_id = window
                self.reset()
            return True
        return self.on

    def reset(self) -> None:
        self.batches = self.samples = self.build_ns = self.build_cpu_ns = self.collate_ns = 0
        self.sampled_s = 0.0
        self.functions = {}
        self._pending = []

    def fetch(self, original, fetcher, index):
        from pyinstrument import Profiler

        collate = fetcher.collate_fn
        spent = [0]

        def timed_collate(data):
            t = time.perf_counter_ns()
            try:
                return collate(data)
            finally:
                spent[0] += time.perf_counter_ns() - t

        fetcher.collate_fn = timed_collate
        profiler = Profiler(interval=INTERVAL_S, async_mode="disabled")
        profiler.start()
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        try:
            batch = original(fetcher, index)
        finally:
            built, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
            session = profiler.stop()
            fetcher.collate_fn = collate
        self.batches += 1
        self.build_ns += built
        self.build_cpu_ns += min(cpu, built)
        self.collate_ns += spent[0]
        self.samples += _samples(fetcher, index)
        self.fetch_kind = self.fetch_kind or _fetch_kind(fetcher)
        if self.flag_file:  # a worker: the training process may read its file at any time
            self._add(session)
            self.write()
        else:  # the training process: the tree is built later, outside the recorded steps
            self._pending.append(session)
        return batch

    def _add(self, session) -> None:
        root = session.root_frame()
        if root is None:
            return
        self.sampled_s += root.time
        stack = [(root, frozenset())]
        while stack:  # inclusive time per function, a recursive call counted once
            frame, above = stack.pop()
            key = None
            if not frame.is_synthetic and frame.file_path and _user_code(frame.file_path):
                key = (frame.function, frame.file_path, int(frame.line_no or 0))
                if key not in above:
                    self.functions[key] = self.functions.get(key, 0.0) + frame.time
            inner = above | {key} if key is not None else above
            stack.extend((child, inner) for child in frame.children)

    def to_dict(self) -> dict:
        pending, self._pending = self._pending, []
        for session in pending:
            self._add(session)
        return {"role": self.role, "pid": self.pid, "batches": self.batches, "samples": self.samples,
                "build_ms": self.build_ns / 1e6, "build_cpu_ms": self.build_cpu_ns / 1e6,
                "collate_ms": self.collate_ns / 1e6, "sampled_ms": self.sampled_s * 1e3,
                "fetch_kind": self.fetch_kind,
                "functions": [[f, path, line, s * 1e3] for (f, path, line), s in self.functions.items()]}

    def write(self) -> None:
        path = os.path.join(self.folder, f"{self.role}-{self.pid}.json")
        tmp = path + ".tmp"
        try:  # a batch that began before the window closed may end after its folder is gone
            with open(tmp, "w") as fh:
                json.dump(self.to_dict(), fh)
            os.replace(tmp, path)
        except OSError:
            pass


class WorkerInit:
    """The worker_init_fn gpuadvise chains in front of the user's: theirs runs first, unchanged."""

    def __init__(self, user_fn, folder: str):
        self.user_fn, self.folder = user_fn, folder

    def __call__(self, worker_id: int) -> None:
        if self.user_fn is not None:
            self.user_fn(worker_id)
        try:
            _patch_fetchers()
            global _RECORDER
            _RECORDER = Recorder(self.folder, "worker", flag_file=True)
        except Exception:  # measuring must never break the user's loading
            pass


class Probe:
    """The training process's side: switches recording on and off, times the waits, merges the files."""

    def __init__(self, out: str):
        import tempfile
        import uuid

        # the flag and one file per process; outside `out`, so a run killed mid-window (SIGKILL,
        # os._exit) leaves no stray files in the run folder. Made when the window opens.
        self.folder = os.path.join(tempfile.gettempdir(), f"{FOLDER_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}")
        sweep_dead_runs(tempfile.gettempdir())
        self.main = Recorder(self.folder, "main", flag_file=False)
        self.waits_ns: list[int] = []
        self.gaps_ns: list[int] = []
        self._returned: int | None = None
        self.workers: set[int] = set()  # num_workers of the loaders iterated inside the window
        self.recorded: list[list] = []  # [start, end] wall-clock seconds (time.time()) of each recording

    def install(self, torch) -> None:
        global _RECORDER
        from torch.utils.data import dataloader as dl

        _RECORDER = self.main
        _patch_fetchers()
        probe = self
        original_init = dl._MultiProcessingDataLoaderIter.__init__

        @functools.wraps(original_init)
        def __init__(it, loader, *a, **k):
            # the iterator reads loader.worker_init_fn as it starts the workers: ours, chained, for that
            # moment only (the user's loader keeps its own; loaders built before gpuadvise started count too)
            user_fn = loader.worker_init_fn
            chained = not isinstance(user_fn, WorkerInit)
            if chained:
                object.__setattr__(loader, "worker_init_fn", WorkerInit(user_fn, probe.folder))
            try:
                original_init(it, loader, *a, **k)
            finally:
                if chained:
                    object.__setattr__(loader, "worker_init_fn", user_fn)

        dl._MultiProcessingDataLoaderIter.__init__ = __init__
        original_next = dl._BaseDataLoaderIter.__next__

        @functools.wraps(original_next)
        def __next__(it):
            if not probe.main.on:
                return original_next(it)
            t = time.perf_counter_ns()
            if probe._returned is not None:
                probe.gaps_ns.append(t - probe._returned)
            try:
                return original_next(it)
            finally:
                done = time.perf_counter_ns()
                probe.waits_ns.append(done - t)
                probe.workers.add(int(getattr(it, "_num_workers", 0)))
                probe._returned = done

        dl._BaseDataLoaderIter.__next__ = __next__

    def reset(self) -> None:
        """Forget what earlier windows measured (each window's summary is its own)."""
        self.main.reset()
        self.waits_ns, self.gaps_ns, self.recorded = [], [], []
        self.workers = set()
        self._returned = None

    def window(self, on: bool) -> None:
        """Recording on (the window's recorded steps) or off; idempotent."""
        if on == self.main.on:
            return
        self.main.on = on
        self._returned = None
        if on:
            self.recorded.append([time.time(), None])
        elif self.recorded:
            self.recorded[-1][1] = time.time()
        flag = os.path.join(self.folder, FLAG)
        try:
            if on:  # the folder exists only while the window records (and until the summary)
                os.makedirs(self.folder, exist_ok=True)
                open(flag, "w").close()
            elif os.path.exists(flag):
                os.unlink(flag)
        except OSError:
            pass

    def summary(self) -> dict | None:
        """run.json's `capture.loader`: None when no batch was waited for or built inside the window."""
        parts = [self.main.to_dict()] if self.main.batches else []
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.startswith("worker-") and n.endswith(".json"))
        except OSError:
            names = []
        for name in names:
            try:
                with open(os.path.join(self.folder, name)) as fh:
                    parts.append(json.load(fh))
            except (OSError, ValueError):
                continue
        if not parts and not self.waits_ns:
            return None
        out = merge(parts, self.waits_ns, self.gaps_ns, sorted(self.workers))
        out["recorded"] = [list(r) for r in self.recorded]
        return out

    def cleanup(self) -> None:
        """Remove the per-process files once run.json holds their merge."""
        import shutil

        self.window(False)
        for _ in range(5):  # a worker finishing a batch may write into it while it is being removed
            shutil.rmtree(self.folder, ignore_errors=True)
            if not os.path.exists(self.folder):
                return
            time.sleep(0.02)


def sweep_dead_runs(tmp: str) -> list[str]:
    """Remove the folders of runs that ended without cleaning up (SIGTERM's default action, SIGKILL,
    os._exit inside the window): the pid in the name no longer runs. Returns the folders removed."""
    import shutil

    removed = []
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(FOLDER_PREFIX)]
    except OSError:
        return removed
    for name in names:
        pid = name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        path = os.path.join(tmp, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): not ours to judge
        return True
    return True


def attach(session, torch) -> Probe | None:
    """Install the probe for a profiling session: recording follows the session's window hooks."""
    if not session.config.get("loader_probe", True):
        return None
    if not available():
        from gpuadvise.analyzer.install import install_command

        session.status["loader"] = f"not sampled: pyinstrument is not installed ({install_command('profile')})"
        return None
    try:
        probe = Probe(str(session.out))
        probe.install(torch)
    except Exception as exc:  # measuring must never break the user's script
        session.status["loader"] = f"not sampled: {type(exc).__name__}: {exc}"
        return None

    def on_start(s, k):
        probe.reset()  # a later window's summary is its own
        probe.window(True)

    def on_stop(s, k, captured):
        probe.window(False)
        s.status["loader"] = probe.summary()
        probe.cleanup()

    session.hooks.on_start.append(on_start)
    session.hooks.on_stop.append(on_stop)
    return probe


def merge(parts: list[dict], waits_ns: list[int], gaps_ns: list[int], workers: list[int]) -> dict:
    batches = sum(p["batches"] for p in parts)
    build = sum(p["build_ms"] for p in parts)
    build_cpu = sum(p.get("build_cpu_ms", p["build_ms"]) for p in parts)
    collate = sum(p["collate_ms"] for p in parts)
    samples = sum(p["samples"] for p in parts)
    sampled = sum(p["sampled_ms"] for p in parts)
    funcs: dict[tuple, float] = {}
    for p in parts:
        for f, path, line, ms in p["functions"]:
            funcs[(f, path, line)] = funcs.get((f, path, line), 0.0) + ms
    top = sorted(funcs.items(), key=lambda kv: -kv[1])[:TOP_FUNCTIONS]
    kinds = sorted({p["fetch_kind"] for p in parts if p.get("fetch_kind")})
    out = {
        "sampler": f"pyinstrument {_version()}", "interval_ms": INTERVAL_S * 1e3,
        "num_workers": workers[-1] if workers else None,
        "processes": {"main": sum(1 for p in parts if p["role"] == "main"),
                      "workers": sum(1 for p in parts if p["role"] == "worker")},
        "batches_built": batches, "samples": samples, "fetch": kinds[0] if len(kinds) == 1 else kinds or None,
        # means over the batches built inside the window: the shares below are of the same totals
        "build_ms_per_batch": _r(build / batches) if batches else None,
        # the building thread's CPU time of it (the rest sleeps on a disk, the network, a lock): a worker needs
        # a core for this part only
        "build_cpu_ms_per_batch": _r(build_cpu / batches) if batches else None,
        "fetch_ms_per_batch": _r((build - collate) / batches) if batches else None,
        "fetch_ms_per_sample": _r((build - collate) / samples) if samples else None,
        "collate_ms_per_batch": _r(collate / batches) if batches else None,
        "batches_waited": len(waits_ns),
        "wait_ms_per_batch": _r(sum(waits_ns) / len(waits_ns) / 1e6) if waits_ns else None,
        "between_batches_ms": _r(sum(gaps_ns) / len(gaps_ns) / 1e6) if gaps_ns else None,
        "sampled_ms": _r(sampled),
        "functions": [{"function": f, "file": frames.short_path(path), "line": line, "share_pct": round(100 * ms / sampled, 1),
                       "ms_per_batch": _r(ms / batches)}
                      for (f, path, line), ms in top if sampled > 0 and batches],
    }
    return out


def _patch_fetchers() -> None:
    from torch.utils.data._utils import fetch

    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        if getattr(cls.fetch, "_gpuadvise", False):
            continue
        cls.fetch = _timed(cls.fetch)


def _timed(original):
    @functools.wraps(original)
    def fetch(fetcher, index):
        rec = _RECORDER
        try:
            on = rec is not None and rec.recording()
        except Exception:
            on = False
        if not on:
            return original(fetcher, index)
        return rec.fetch(original, fetcher, index)

    fetch._gpuadvise = True
    return fetch


def _samples(fetcher, index) -> int:
    if getattr(fetcher, "auto_collation", False):
        try:
            return len(index)
        except TypeError:
            return 1
    return 1


def _fetch_kind(fetcher) -> str:
    from torch.utils.data._utils import fetch

    if isinstance(fetcher, fetch._IterableDatasetFetcher):
        return "__iter__"
    if getattr(fetcher, "auto_collation", False) and getattr(fetcher.dataset, "__getitems__", None):
        return "__getitems__"
    return "__getitem__"


def _user_code(path: str) -> bool:
    """The user's own files: not the standard library, not installed packages, not gpuadvise."""
    return not frames.is_library(path)


def _version() -> str:
    try:
        import pyinstrument

        return pyinstrument.__version__
    except Exception:
        return "?"


def _r(v: float) -> float:
    return round(v, 3)


def available() -> bool:
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        return False
    return True

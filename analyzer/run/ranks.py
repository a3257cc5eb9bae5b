"""The map step of a multi-rank analysis: each rank's trace analysed on its own, in parallel.

Locally the ranks go to a `ProcessPoolExecutor` whose workers start from a fork server (or are spawned
where there is none), so a worker never inherits a copy of a parent that runs threads. A worker
analyses one rank at a time and hands the freed memory back to the system after each (`malloc_trim`):
its footprint is that of the largest trace it gets, and the number of workers is bounded by the memory
available. (Workers are not replaced after every task with `max_tasks_per_child`: on Python 3.11 a
replacement spawned while the pool is being stopped can hang the stop.)

With a Dask scheduler the same function runs on the cluster's workers (`client.map`, results taken as
they complete). The workers open the trace paths themselves: every worker must see the same files at
the same paths (a shared filesystem) and have the same gpuadvise installed.

Every worker sends back a compact report (findings, notes, summary, the per-step and kernel tables the
renderers draw) and the rank's `RankStats` for the reduce; the parsed events stay in the worker.
Results come back in the order of the sources, whatever order the ranks finish in.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.read.sources import Source

MEMORY_FACTOR = 3  # a worker needs about 3× the decoded JSON while it parses and analyses
GZIP_FACTOR = 8  # a .gz trace inflates to about 8× its size on disk
PARALLEL_MIN_BYTES = int(os.environ.get("GPUADVISE_RANKS_PARALLEL_MIN_BYTES", 64 << 20))  # decoded, all ranks


@dataclass
class Failure:
    """A rank whose analysis failed in its worker: bad input (`input`), or our bug / a dead worker."""

    source: str
    message: str
    input: bool = False
    rank: int | None = None  # from the file name, when it says


# ----------------------------------------------------------------------------------------------------
# The map function (runs in the worker)


def map_one(src: Source, shown: str | None = None, codes: tuple | None = None, cache: bool | None = None):
    """Analyse one source; `shown` is the path as the user wrote it (the worker may get an absolute
    one), `codes` the rules to run (None: the whole catalog). Returns the compact reports (one per rank
    the file holds), or a Failure: nothing raised here has to cross a process boundary."""
    from .single import analyze_source
    from gpuadvise.analyzer.measure.job.job import rank_stats

    shown = shown or str(src.path)
    try:
        rules = _rules(codes)
        reports = analyze_source(src, rules=rules, cache=cache)  # several for a file that holds several ranks
        for report in reports:
            if report.source != shown:
                report.source = shown
                for f in report.findings:
                    f.trace = shown
            report.rank_stats = rank_stats(report, src.facts)
        reports = [report.compact() for report in reports]
        del rules
        _release_memory()
        return reports
    except InputError as exc:
        return Failure(shown, exc.problem, input=True, rank=src.rank)
    except MemoryError:
        return Failure(shown, "out of memory in its worker process (try fewer workers: -j)", rank=src.rank)
    except Exception as exc:  # noqa: BLE001 - our bug, reported as a note on this rank
        return Failure(shown, f"{type(exc).__name__}: {exc}", rank=src.rank)


def _release_memory() -> None:
    """Give the parsed trace's memory back to the system before the worker takes its next rank."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _rules(codes):
    if codes is None:
        return None
    from gpuadvise.rules import find_rule

    return [find_rule(c) for c in codes]


def rule_codes(rules) -> tuple | None:
    """The rules as catalog codes (what crosses to a worker); raises ValueError for a rule not in the
    catalog, which then runs in-process instead."""
    if rules is None:
        return None
    from gpuadvise.rules import find_rule

    codes = tuple(r.code for r in rules)
    if any(find_rule(c) is not r for c, r in zip(codes, rules)):
        raise ValueError("rules outside the catalog cannot be sent to workers")
    return codes


# ----------------------------------------------------------------------------------------------------
# How many local workers


def local_workers(sources: list[Source], jobs: int | None, scheduler=None) -> int:
    """How many local worker processes analyse `sources`: `jobs` (default: `default_jobs`), at most one per
    source; 1 (this process) for fewer than two traces or when a Dask scheduler takes the ranks."""
    traces = sum(1 for s in sources if s.kind == "trace")
    if traces < 2 or scheduler is not None:
        return 1
    return min(jobs if jobs is not None else default_jobs(sources), len(sources))


def start_early(sources: list[Source], jobs: int | None, scheduler=None) -> None:
    """Start the fork server now when `sources` will go to local workers: it imports the analysis and the
    rules (its preload) while this process is still importing its own, instead of after. The pool that
    `map_local` makes later forks its workers from it."""
    if local_workers(sources, jobs, scheduler) < 2:
        return
    ctx = _context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def default_jobs(sources: list[Source]) -> int:
    """min(traces, CPUs, what memory allows: available RAM / (3 × the largest trace decoded)); 1 when
    the traces are small together (starting worker processes costs 1-2 s, more than they would save)."""
    traces = [s for s in sources if s.kind == "trace"]
    n = min(len(traces), os.cpu_count() or 1)
    if sum(_decoded_size(s.path) for s in traces) < PARALLEL_MIN_BYTES:
        return 1
    largest = max((_decoded_size(s.path) for s in traces), default=0)
    avail = available_memory()
    if avail and largest:
        n = min(n, max(1, avail // (MEMORY_FACTOR * largest)))
    return max(1, int(n))


def _decoded_size(path: Path) -> int:
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    return size * GZIP_FACTOR if path.name.endswith(".gz") else size


def available_memory() -> int | None:
    """Bytes of memory available to new work (MemAvailable on Linux), None when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# ----------------------------------------------------------------------------------------------------
# Local process pool


def _context():
    import multiprocessing as mp

    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    if method == "forkserver":
        from gpuadvise.rules import rule_modules

        # every rule module too, so that no worker imports them again
        ctx.set_forkserver_preload(["gpuadvise.analyzer.run.ranks", "gpuadvise.analyzer.run.single", "gpuadvise.rules",
                                    *rule_modules()])
    return ctx


def _init_worker(env: dict, decode_alone: bool) -> None:
    """Each worker: Ctrl-C is the parent's to handle; the parent's GPUADVISE_* settings (the fork server
    started earlier may hold older ones); one decoding process per trace when ranks fill the CPUs. What
    the worker has imported is frozen out of the cyclic collector (`gc.freeze`): its collections, after
    each rank and those the analysis triggers, then walk only the rank's own objects (a full one took
    about 20 ms per rank, walking every module's objects again), and the pages it shares with the fork
    server stay shared."""
    import gc

    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for key in [k for k in os.environ if k.startswith("GPUADVISE_")]:
        os.environ.pop(key, None)
    os.environ.update(env)
    if decode_alone and "GPUADVISE_LOAD_WORKERS" not in env:
        os.environ["GPUADVISE_LOAD_WORKERS"] = "1"  # the ranks already keep the CPUs busy


def map_local(sources: list[Source], codes, workers: int, progress=None, cache: bool | None = None) -> list:
    """Each source in a worker process; results in source order. `progress(done, total, nbytes)`."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    env = {k: v for k, v in os.environ.items() if k.startswith("GPUADVISE_")}
    decode_alone = 2 * workers > (os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_context(), initializer=_init_worker,
                               initargs=(env, decode_alone))
    results: list = [None] * len(sources)
    tracker = _Tracker(sources, progress)
    try:
        with _sigint_held():  # a Ctrl-C while workers start is taken once they are all known
            futures = {pool.submit(map_one, src, str(src.path), codes, cache): i for i, src in enumerate(sources)}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                results[i] = fut.result()
            except BrokenProcessPool:
                results[i] = Failure(str(sources[i].path), "its worker process died (out of memory? try fewer workers: -j)",
                                     rank=sources[i].rank)
            except Exception as exc:  # noqa: BLE001 - e.g. a result that could not be sent back
                results[i] = Failure(str(sources[i].path), f"{type(exc).__name__}: {exc}", rank=sources[i].rank)
            _raise_first_input_error(results)
            tracker.done(i)
    except BaseException:  # bad input on one rank, Ctrl-C: stop the other ranks now
        # Every worker goes (one that dies holding the task queue's lock would block the others); the
        # pool sees them gone and fails the futures left. (Cancelling futures here instead races the
        # pool's own clean-up on Python 3.11.)
        _stop_workers(list((getattr(pool, "_processes", None) or {}).values()))
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
    return flatten(results)


@contextmanager
def _sigint_held():
    """Hold back Ctrl-C while the pool starts its workers, and take it once they are all known: a worker
    half-started when the parent leaves prints a traceback of its own. (A handler, not a signal mask:
    numpy's BLAS threads would take a masked SIGINT for the main thread.)"""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _bad_input(result) -> bool:
    return isinstance(result, Failure) and result.input


def _raise_first_input_error(results: list) -> None:
    """Bad input on one rank stops the whole run with one clean error line, as it does for one trace:
    the first bad source in source order (the one `-j 1` would name), once every earlier one is done."""
    for r in results:
        if r is None:
            return  # an earlier source is still running: it may be the one to name
        if _bad_input(r):
            raise InputError(r.source, r.message)


def _stop_workers(procs) -> None:
    for proc in procs:
        try:
            proc.terminate()
        except Exception:  # noqa: BLE001 - already gone
            pass
    for proc in procs:
        proc.join(timeout=5)


# ----------------------------------------------------------------------------------------------------
# Dask


def map_dask(sources: list[Source], codes, scheduler, progress=None, cache: bool | None = None) -> list:
    """The same map on a dask.distributed cluster: `scheduler` is a Client or a scheduler address."""
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        from gpuadvise.analyzer.install import install_command

        raise InputError(None, f"--scheduler needs Dask: {install_command('dask')} "
                               "(or pip install 'dask[distributed]')") from None
    own = not isinstance(scheduler, Client)
    if own:
        _check_address(str(scheduler))
        try:
            client = Client(str(scheduler), set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(None, f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    else:
        client = scheduler
    tracker = _Tracker(sources, progress)
    results: list = [None] * len(sources)
    try:
        # workers read the paths themselves: send absolute ones, report the ones the user wrote
        absolute = [replace(s, path=s.path.resolve(), snapshot=s.snapshot.resolve() if s.snapshot else None)
                    for s in sources]
        futures = client.map(map_one, absolute, [str(s.path) for s in sources], codes=codes, cache=cache, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures, loop=client.loop):  # this client's loop: it need not be the default one
            i = index[fut.key]
            if fut.cancelled():
                continue
            try:
                results[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker that died (KilledWorker), a lost connection
                results[i] = Failure(str(sources[i].path), f"its Dask task failed: {type(exc).__name__}: {exc}",
                                     rank=sources[i].rank)
            if _bad_input(results[i]):
                client.cancel(futures[i + 1:])
            try:
                _raise_first_input_error(results)
            except InputError:
                client.cancel(futures)
                raise
            tracker.done(i)
    finally:
        if own:
            client.close()
    return flatten(results)


def flatten(results: list) -> list:
    """The sources' results as one list: a source's reports (several for a file of several ranks) in
    its place, a Failure as it is."""
    out: list = []
    for r in results:
        if isinstance(r, list):
            out.extend(r)
        else:
            out.append(r)
    return out


def _check_address(address: str) -> None:
    """A scheduler address Dask can dial (tcp://host:port, or host:port), before a Client is made of it."""
    from distributed.comm import parse_address
    from distributed.comm.addressing import parse_host_port
    from distributed.comm.registry import backends

    try:
        scheme, location = parse_address(address)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(location)  # the port is required
    except (ValueError, TypeError) as exc:
        raise InputError(None, f"not a Dask scheduler address: {address!r} ({exc})") from None
    if scheme not in backends or not location:
        raise InputError(None, f"not a Dask scheduler address: {address!r} (expected tcp://host:port)")


class _Tracker:
    """Calls `progress(done, total, nbytes_done)` as ranks finish (bytes on disk, for a MB/s figure)."""

    def __init__(self, sources, progress):
        self.sizes = []
        for s in sources:
            try:
                self.sizes.append(s.path.stat().st_size)
            except OSError:
                self.sizes.append(0)
        self.progress, self.count, self.nbytes = progress, 0, 0

    def done(self, i: int) -> None:
        self.count += 1
        self.nbytes += self.sizes[i]
        if self.progress:
            self.progress(self.count, len(self.sizes), self.nbytes)

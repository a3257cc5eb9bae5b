"""The rules of one big trace on two cores: this process and a forked child take rules from one queue.

Rules are CPU-bound Python and numpy under the GIL, so a second core needs a second process. A child
forked after the measures every rule shares are built (the metrics, the replay and its calibration)
sees them without a copy. The queue is a pipe holding one byte per rule, its index, written and closed
before the fork: each process reads one byte to claim the next rule (a pipe read is atomic), so an
expensive rule on one side lets the other take the rules after it, and an empty pipe says the rules are
all taken. The child sends back what its rules gave, by index; the results are put back in the rules'
order, so what comes out is what one process running them one after the other gives.

A rule's result must not depend on which rules ran before it in the same process (rules share only
pure caches on the Analysis: the same inputs give the same answer whichever process fills them).

Anything that goes wrong on the child's side (it died, its result could not be pickled) costs only
time: the rules it took are run here. The child never writes to the terminal (read/forked.py): what a
rule would print or warn there is dropped.
"""

from __future__ import annotations

import os

from gpuadvise.analyzer.read import forked
from gpuadvise.analyzer.read.parallel import load_workers

MIN_EVENTS = int(os.environ.get("GPUADVISE_PARALLEL_RULES_MIN_EVENTS", 300_000))
_MAX_ITEMS = 255  # one byte per claim


def worth_splitting(events: int) -> bool:
    """Whether a trace of `events` events has its rules shared with a forked child: two processes may run
    per trace (`GPUADVISE_LOAD_WORKERS`, 1 in a job's workers when its ranks fill the CPUs), this process
    may fork (read/forked.can_fork) and the trace is big enough that the fork pays for itself."""
    return events >= MIN_EVENTS and load_workers() >= 2 and forked.can_fork()


def run_each(tasks: list, split: bool, first: list[int] | None = None) -> list:
    """`[task() for task in tasks]`, in the tasks' order; with `split`, a forked child takes tasks from the
    same queue, the tasks at the indices `first` before the others (the costly ones: taken last, one of
    them would keep one process busy while the other has nothing left). Every task must return something
    picklable."""
    if not split or not 2 <= len(tasks) <= _MAX_ITEMS or not forked.can_fork():
        return [task() for task in tasks]
    head = list(dict.fromkeys(first or []))
    queue = head + [i for i in range(len(tasks)) if i not in set(head)]
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, bytes(queue))  # far below a pipe's capacity: never blocks
    finally:
        os.close(write_fd)

    def claim() -> int | None:
        got = os.read(read_fd, 1)
        return got[0] if got else None

    def theirs() -> dict:
        import gc
        import sys
        import warnings

        gc.freeze()  # the parent's objects stay out of the child's collections: their pages stay shared
        # the child never writes to the terminal (`view` owns it; Textual's stand-in for sys.stderr would
        # wait for an event loop the child does not have): what a rule would print is dropped
        warnings.simplefilter("ignore")
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child leaves with os._exit
        done = {}
        while (i := claim()) is not None:
            done[i] = tasks[i]()
        return done

    child = forked.Forked(theirs)
    results: list = [None] * len(tasks)
    mine: set[int] = set()
    try:
        while (i := claim()) is not None:
            results[i] = tasks[i]()
            mine.add(i)
    except BaseException:
        child.stop()
        os.close(read_fd)
        raise
    os.close(read_fd)
    ok, done = child.result()
    done = done if ok and isinstance(done, dict) else {}
    for i, task in enumerate(tasks):
        if i not in mine:
            results[i] = done[i] if i in done else task()  # the child's, or done here when the child failed
    return results

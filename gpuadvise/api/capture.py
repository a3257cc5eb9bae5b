"""`with gpuadvise.capture("runs/exp1") as cap:` — `gpuadvise profile` around a block of code in the
current process (a notebook cell, a script the user does not want to wrap), writing the same run folder.

Steps are found the same way as under `gpuadvise profile` (optimizer steps, DataLoader batches, the
fallbacks), or marked with `cap.step()`. The hooks the session puts on torch are taken off again when
the block ends, so code after it runs as if gpuadvise had never been there.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .report import Report

_RUNNING: list = []  # the capture in progress (one at a time: torch's profiler is process-wide)


class Capture:
    """A profiling session over a block of code; `report()` analyses what it wrote."""

    def __init__(self, out: str | os.PathLike[str], *, wait: int = 10, warmup: int = 2, active: int = 3,
                 force: bool = False, record_shapes: bool = False, with_stack: bool = False,
                 memory_history: bool = True, loader_probe: bool = True, on_signal: bool = False,
                 when_slower: float | None = None, every: int | None = None, max_windows: int = 10):
        self.path = Path(out)
        self.force = force
        # the long-run options are `gpuadvise profile`'s (docs/long-runs.md)
        self._options = {"wait": wait, "warmup": warmup, "active": active, "record_shapes": record_shapes,
                         "with_stack": with_stack, "loader_probe": loader_probe, "memory_history": memory_history,
                         "on_signal": on_signal, "when_slower": when_slower, "every": every, "max_windows": max_windows}
        self._session = None
        self._saved: list = []
        self._started = 0.0
        self.command = ["gpuadvise.capture", str(self.path)]  # run.json `command` (the callbacks name themselves)

    def __enter__(self) -> Capture:
        from gpuadvise.analyzer.errors import InputError
        from gpuadvise.harness.runfolder import layout
        from gpuadvise.harness.session.session import Session, set_active

        if _RUNNING:
            raise RuntimeError("gpuadvise.capture: another capture is running in this process (one at a time)")
        r = layout.rank()
        mine = [self.path / layout.trace_name(r), self.path / layout.run_json_name(r)]
        if any(p.exists() for p in mine):
            if not self.force:
                raise InputError(self.path, "run folder already holds a capture; pass force=True to replace it")
            for p in mine + [self.path / layout.snapshot_name(r)] + layout.later_traces(self.path, r):
                p.unlink(missing_ok=True)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(self.path, f"cannot create the run folder: {exc.strerror or exc}") from None
        self._started = time.time()
        o = self._options
        config = {"out": str(self.path.resolve()), "stop_after_capture": False, "shapes_probe": True,
                  "profile_memory": False, "memory_steps": 2, "max_entries": 100_000, **o,
                  "run": {"command": list(self.command), "script": sys.argv[0] if sys.argv else None,
                          "cwd": os.getcwd(),
                          "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self._started))}}
        self._saved = _save_torch_hooks()
        _reset_facts()
        self._session = Session(config)
        set_active(self._session)
        _RUNNING.append(self)
        self._session.start()
        return self

    def step(self) -> None:
        """Mark the end of one iteration (then the only step signal, as `gpuadvise.step()`)."""
        if self._session is not None:
            self._session.manual_step()

    def __exit__(self, exc_type, exc, tb) -> None:
        from gpuadvise.harness.runfolder import layout
        from gpuadvise.harness.cli import _finish_run_json
        from gpuadvise.harness.session.session import set_active

        session, self._session = self._session, None
        code = 0 if exc_type is None else 130 if issubclass(exc_type, KeyboardInterrupt) else 1
        try:
            if session is not None:
                session.finish(exit_code=code)
        finally:
            set_active(None)
            _restore_torch_hooks(self._saved)
            _detach_frameworks()
            _RUNNING.clear()
            _finish_run_json(self.path, layout.rank(), code, self._started)

    def report(self) -> Report:
        """The findings for what this capture wrote (`gpuadvise.analyze(path)`)."""
        from .report import analyze

        return analyze(self.path)


def capture(out: str | os.PathLike[str], **options) -> Capture:
    """`with gpuadvise.capture("runs/exp1") as cap:` — see `Capture` for the options."""
    return Capture(out, **options)


def _hook_points():
    """Every (owner, attribute) the session patches; saved before and put back after."""
    import torch
    from torch.utils.data import dataloader as dl
    from torch.utils.data._utils import fetch

    points = [(dl._BaseDataLoaderIter, "__next__"), (dl.DataLoader, "__init__"), (dl.DataLoader, "__iter__"),
              (dl._MultiProcessingDataLoaderIter, "__init__"), (torch.autograd, "backward"),
              (torch, "compile"), (torch.nn.DataParallel, "__init__"), (torch.autocast, "__init__"), (torch.autocast, "__enter__"),
              (fetch._MapDatasetFetcher, "fetch"), (fetch._IterableDatasetFetcher, "fetch"),
              (torch.optim.Optimizer, "__init__")]
    try:
        from torch.nn.parallel import DistributedDataParallel

        points += [(DistributedDataParallel, name) for name in ("__init__", "register_comm_hook", "no_sync")]
    except ImportError:  # pragma: no cover - distributed not built
        pass
    graph = getattr(torch.cuda, "CUDAGraph", None)
    if graph is not None:
        points.append((graph, "replay"))
    return points


def _save_torch_hooks() -> list:
    from torch.optim import optimizer

    saved = [(owner, name, owner.__dict__.get(name, _MISSING)) for owner, name in _hook_points()]
    saved.append((optimizer, "_global_optimizer_post_hooks", set(optimizer._global_optimizer_post_hooks)))
    return saved


def _restore_torch_hooks(saved: list) -> None:
    from torch.optim import optimizer

    for owner, name, value in saved:
        if owner is optimizer:  # the step hook the session registered: drop it, keep the user's
            for key in set(optimizer._global_optimizer_post_hooks) - value:
                del optimizer._global_optimizer_post_hooks[key]
        elif value is _MISSING:
            try:
                delattr(owner, name)
            except AttributeError:
                pass
        else:
            setattr(owner, name, value)


def _reset_facts() -> None:
    from gpuadvise.harness.facts import compiled
    from gpuadvise.harness.facts import distributed as distfacts
    from gpuadvise.harness.facts import general
    from gpuadvise.harness.frameworks import importwatch, loop

    for v in general._FACTS.values():
        v.clear()
    general._WINDOW.clear()
    distfacts.reset()
    compiled.reset()  # an earlier block's torch.compile calls are not this one's
    loop.reset()
    importwatch.ERRORS.clear()


def _detach_frameworks() -> None:
    """Take the session's patches off the framework classes and stop watching imports."""
    from gpuadvise.harness.frameworks import importwatch, loop

    importwatch.uninstall()
    loop.unpatch_all()


_MISSING = object()

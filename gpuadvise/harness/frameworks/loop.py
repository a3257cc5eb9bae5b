"""The training framework that runs the user's loop (transformers' Trainer, Lightning's Trainer,
Accelerate): what it knows, its steps, and what it does between them.

hf_trainer.py, lightning_trainer.py and accelerate_steps.py attach to a framework when the script imports
it (importwatch.py; nothing is imported before) and report here:
- `started(...)`: the framework runs the loop from now on. Its own step is the step (steps/sources.py:
  the framework source outranks optimizer hooks and DataLoader batches, so gradient-accumulation
  micro-batches and an optimizer that Accelerate wraps or a grad scaler skips count right), and run.json's
  `framework` records its name, version, its settings as it reports them and the user's line that started
  it (`trainer.train()`);
- `step(name)`: one of its steps ended;
- `Phase(kind)`: evaluation or a checkpoint is running between two steps: a CPU annotation in the trace
  ("gpuadvise: evaluation", analyzer/model/calls.py PHASE_PREFIX) and an entry in run.json's
  `framework.phases`, so the analysis can leave that step out of the training-step figures.

Nothing here may raise into the user's training: every entry point swallows its own failures.
"""

from __future__ import annotations

import functools
import sys
import time

from gpuadvise.analyzer.model.calls import PHASE_PREFIX

from ..active import active
from ..facts import general

# A framework running inside another one's loop leaves the steps to it: transformers' Trainer drives its
# optimizer through Accelerate, whose steps then must not count twice.
PRIORITY = {"accelerate": 1, "transformers": 2, "lightning": 2}
MAX_PHASES = 200

_FRAMEWORK: dict = {}  # run.json `framework`
_PHASES: list = []
_PATCHES: list = []  # (owner, attribute, what it was): undone by unpatch_all()
_ATTACHED: set = set()
_MISSING = object()


def summary() -> dict | None:
    """run.json's `framework`, or None when the script used none."""
    if not _FRAMEWORK:
        return None
    return dict(_FRAMEWORK, phases=list(_PHASES))


def reset() -> None:
    _FRAMEWORK.clear()
    _PHASES.clear()


def started(name: str, version: str | None, entry: str, settings: dict, frame=None,
            first_batch_starts: bool = False) -> None:
    """The framework `name` runs the loop from here: its steps become the steps, and its facts are recorded
    (`frame`: where to start looking for the user's line, default the caller's). `first_batch_starts`: the
    framework has no start-of-training event of its own (Accelerate), so the first DataLoader batch
    starts the first step, as in a hand-written loop."""
    try:
        current = _FRAMEWORK.get("name")
        if current and PRIORITY.get(current, 0) > PRIORITY.get(name, 0):
            return  # inside a higher framework's loop (Accelerate under the Trainer)
        session = active()
        if session is not None:
            session.sources.claim(name, first_batch_starts)
        where = general.user_call(frame or sys._getframe(1))
        _FRAMEWORK.update({"name": name, "version": version, "entry": entry, "called_at": where["called_at"],
                           "call": where["call"], "settings": _plain(settings)})
    except Exception:
        pass


def record(key: str, values: dict) -> None:
    """Facts the framework reports beside its settings (Accelerate's state under the Trainer, the loaders
    Lightning attached at the start of training)."""
    try:
        if values:
            _FRAMEWORK.setdefault(key, {}).update(_plain(values))
    except Exception:
        pass


def loader_built(loader, package: str, frame) -> None:
    """The training DataLoader a framework built before our session started (a callback's session starts
    with training, after the Trainer made its loader): recorded as if seen being built, at the user's line
    that started the framework. Nothing when DataLoaders were recorded already."""
    try:
        if loader is None or general.facts()["dataloaders"] or not hasattr(loader, "num_workers"):
            return
        where = general.user_call(frame)
        general.add_dataloader(loader, {"created_at": where["called_at"], "in_function": where["in_function"],
                                          "built_by": package, "call": where["call"]})
    except Exception:
        pass


def step(name: str) -> None:
    """One of framework `name`'s steps ended (ignored unless it runs the loop)."""
    session = active()
    if session is not None:
        session.sources.framework_step(name)


class Phase:
    """`with Phase("evaluation"):` (or `begin()` / `end()` from a framework's start and end hooks): marks
    the work as that phase in the trace and in run.json. Does nothing without a running session."""

    def __init__(self, kind: str):
        self.kind = kind
        self._mark = None
        self._step = None
        self._t0 = 0.0

    def begin(self) -> None:
        session = active()
        if session is None or self._step is not None:
            return
        try:
            from torch.profiler import record_function

            self._step, self._t0 = session.steps, time.perf_counter()
            self._mark = record_function(PHASE_PREFIX + self.kind)
            self._mark.__enter__()
        except Exception:
            self._mark = None

    def end(self) -> None:
        if self._step is None:
            return
        step, self._step = self._step, None
        try:
            if self._mark is not None:
                self._mark.__exit__(None, None, None)
            session = active()
            if len(_PHASES) < MAX_PHASES and session is not None:
                _PHASES.append({"kind": self.kind, "step": step, "window": session.step_phase(step),
                                "ms": round((time.perf_counter() - self._t0) * 1e3, 3)})
        except Exception:
            pass
        finally:
            self._mark = None

    def __enter__(self):
        self.begin()
        return self

    def __exit__(self, *exc):
        self.end()
        return False


def in_phase(kind: str, method):
    """`method` wrapped so that each call runs as `Phase(kind)`."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with Phase(kind):
            return method(*args, **kwargs)

    wrapper.__gpuadvise_phase__ = kind
    return wrapper


# -- patches on framework classes, undone when an in-process capture ends --------------------------------

def attach_once(key: str) -> bool:
    """True the first time `key` is attached (until unpatch_all)."""
    if key in _ATTACHED:
        return False
    _ATTACHED.add(key)
    return True


def patch(owner_cls, name: str, new) -> None:
    _PATCHES.append((owner_cls, name, owner_cls.__dict__.get(name, _MISSING)))
    setattr(owner_cls, name, new)


def unpatch_all() -> None:
    while _PATCHES:
        owner_cls, name, old = _PATCHES.pop()
        try:
            if old is _MISSING:
                delattr(owner_cls, name)
            else:
                setattr(owner_cls, name, old)
        except Exception:
            pass
    _ATTACHED.clear()


def _plain(values: dict) -> dict:
    """Settings as JSON can hold them: enums by value, anything else odd by its str()."""
    out = {}
    for k, v in values.items():
        v = getattr(v, "value", v)  # transformers' and accelerate's settings are str enums
        out[str(k)] = v if v is None or isinstance(v, (bool, int, float, str)) else (
            [x if isinstance(x, (bool, int, float, str)) else str(x) for x in v] if isinstance(v, (list, tuple)) else str(v))
    return out

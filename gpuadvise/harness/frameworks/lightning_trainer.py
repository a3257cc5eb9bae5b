"""Lightning's `Trainer` (`lightning.pytorch`, or the older `pytorch_lightning`) under a profiling
session: its optimizer steps are the steps, its own settings go into run.json, and its validation and
checkpoints are marked as such.

Attached when the script imports the Trainer's module (importwatch.py): every `Trainer.fit()` from then on
runs with a step callback (unless the user added gpuadvise's own, which is one), and
`Trainer.save_checkpoint` runs as `Phase("checkpoint")`. Under `gpuadvise profile`, the processes Lightning starts for the other
devices (`strategy="ddp"`, `devices=N`: it re-runs the script once per device) run under
`gpuadvise profile` too, into the same folder (files named by rank).

The steps: `on_fit_start` hands the loop to Lightning (the sanity check's validation batches are then no
steps), `on_train_start` starts the first step, and `on_train_batch_end` ends one each time
`trainer.global_step` (Lightning's count of optimizer steps) has moved: with `accumulate_grad_batches=4`,
every fourth batch.
"""

from __future__ import annotations

import functools
import importlib
import sys

from ..active import active
from . import loop

_CLASSES: dict = {}  # the step callback class, per Lightning package ("lightning.pytorch", "pytorch_lightning")


class StepCallbackMixin:
    """The callback's behaviour; `step_callback_class` mixes it into the package's own `Callback`."""

    _package = "lightning.pytorch"
    _last_global_step: int | None = None
    _validation: loop.Phase | None = None

    def on_fit_start(self, trainer, pl_module):
        top = sys.modules.get(self._package.split(".")[0])
        loop.started("lightning", getattr(top, "__version__", None), "Trainer.fit()", trainer_settings(trainer),
                           frame=sys._getframe(1))

    def on_train_start(self, trainer, pl_module):
        loop.record("settings", {"train_dataloader_num_workers": loader_workers(trainer)})
        self._last_global_step = trainer.global_step
        loop.step("lightning")  # the first step starts here, as a hand-written loop's first batch would

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self._last_global_step:  # an optimizer step ran (not an accumulation batch)
            self._last_global_step = trainer.global_step
            loop.step("lightning")

    def on_validation_start(self, trainer, pl_module):
        self._validation = loop.Phase("evaluation")
        self._validation.begin()

    def on_validation_end(self, trainer, pl_module):
        if self._validation is not None:
            self._validation.end()
            self._validation = None


def step_callback_class(package: str = "lightning.pytorch"):
    """The step callback class for a Lightning package, made on first use (it subclasses that package's
    `Callback`, which the Trainer checks)."""
    if package not in _CLASSES:
        base = importlib.import_module(package + ".callbacks").Callback
        _CLASSES[package] = type("StepCallback", (StepCallbackMixin, base), {"_package": package})
    return _CLASSES[package]


def trainer_settings(trainer) -> dict:
    """The Trainer's own settings that decide how fast a step is, as it reports them."""
    out = {}
    for key, read in (("precision", lambda t: t.precision), ("accumulate_grad_batches", lambda t: t.accumulate_grad_batches),
                      ("strategy", lambda t: type(t.strategy).__name__), ("accelerator", lambda t: type(t.accelerator).__name__),
                      ("num_devices", lambda t: t.num_devices), ("num_nodes", lambda t: t.num_nodes),
                      ("max_steps", lambda t: t.max_steps), ("val_check_interval", lambda t: t.val_check_interval),
                      ("check_val_every_n_epoch", lambda t: t.check_val_every_n_epoch),
                      ("gradient_clip_val", lambda t: t.gradient_clip_val),
                      ("enable_checkpointing", lambda t: bool(t.checkpoint_callbacks))):
        try:
            out[key] = read(trainer)
        except Exception:
            continue
    return out


def loader_workers(trainer) -> list:
    """`num_workers` of each training DataLoader Lightning attached."""
    found = []

    def walk(x):
        if hasattr(x, "num_workers"):
            found.append(x.num_workers)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    try:
        walk(trainer.train_dataloader)
    except Exception:
        pass
    return found


def attach(module) -> None:
    """Patch the Trainer class of the package the script imported (once per session and package)."""
    package = module.__name__[: -len(".trainer.trainer")]
    if not loop.attach_once(package):
        return
    trainer = module.Trainer
    cls = step_callback_class(package)
    original_fit = trainer.fit

    @functools.wraps(original_fit)
    def fit(self, *args, **kwargs):
        # at fit(), not at construction: a Trainer built before the session started is marked too
        try:
            if not any(isinstance(cb, StepCallbackMixin) for cb in self.callbacks):
                self.callbacks.append(cls())
        except Exception:
            pass
        return original_fit(self, *args, **kwargs)

    loop.patch(trainer, "fit", fit)
    _profile_every_rank(package)
    method = trainer.__dict__.get("save_checkpoint")
    if method is not None and not hasattr(method, "__gpuadvise_phase__"):
        loop.patch(trainer, "save_checkpoint", loop.in_phase("checkpoint", method))


def _profile_every_rank(package: str) -> None:
    """The command Lightning starts each extra rank with, put under `gpuadvise profile` with this run's
    options (only under `gpuadvise profile`: a callback profiles each rank itself, where it runs)."""
    try:
        launcher = importlib.import_module(package + ".strategies.launchers.subprocess_script")
        original = launcher._basic_subprocess_cmd
    except (ImportError, AttributeError):  # another Lightning layout: the extra ranks run unprofiled
        return

    @functools.wraps(original)
    def command():
        cmd = list(original())
        session = active()
        argv = session.config.get("rank_argv") if session is not None else None
        if not argv:
            return cmd
        # [python, script.py, args…] or [python, -m, module, args…]: profile reads both after its options
        return [cmd[0], "-m", "gpuadvise", "profile", *argv, *cmd[1:]]

    loop.patch(launcher, "_basic_subprocess_cmd", command)

"""Attach to a training framework (or FSDP, DeepSpeed) when the user's script imports it, and never import
one ourselves.

A finder first on `sys.meta_path` waits for the module that defines each framework's loop
(`transformers.trainer`, `lightning.pytorch.trainer.trainer`, `pytorch_lightning.trainer.trainer`,
`accelerate.accelerator`); once the script's import has run it, the framework's module here
(hf_trainer.py, lightning_trainer.py, accelerate_steps.py) attaches to it. A framework imported before
the session started (an in-process `gpuadvise.capture`, the callbacks) is attached at once.
"""

from __future__ import annotations

import importlib.abc
import sys


def _transformers(module) -> None:
    from . import hf_trainer

    hf_trainer.attach(module)


def _lightning(module) -> None:
    from . import lightning_trainer

    lightning_trainer.attach(module)


def _accelerate(module) -> None:
    from . import accelerate_steps

    accelerate_steps.attach(module)


def _fsdp(module) -> None:
    from ..facts import distributed as distfacts

    distfacts.patch_fsdp(module)


def _device_mesh(module) -> None:
    from ..facts import distributed as distfacts

    distfacts.patch_device_mesh(module)


def _deepspeed(module) -> None:
    from ..facts import distributed as distfacts

    distfacts.patch_deepspeed(module)


WATCHED = {
    "transformers.trainer": _transformers,
    "lightning.pytorch.trainer.trainer": _lightning,
    "pytorch_lightning.trainer.trainer": _lightning,
    "accelerate.accelerator": _accelerate,
    # FSDP's and DeepSpeed's settings (facts/distributed.py): importing FSDP ourselves would cost every script a second
    "torch.distributed.fsdp": _fsdp,
    # the device mesh a script builds (facts/distributed.py): its shape, dimensions and ranks
    "torch.distributed.device_mesh": _device_mesh,
    "deepspeed": _deepspeed,
}
ERRORS: list[str] = []  # attach failures (run.json `capture.framework_errors`); the script runs on


def install() -> None:
    for name, hook in WATCHED.items():
        module = sys.modules.get(name)
        if module is not None:
            _attach(hook, module)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def _attach(hook, module) -> None:
    try:
        hook(module)
    except Exception as exc:  # the framework runs unprofiled by us, never broken by us
        ERRORS.append(f"{module.__name__}: {type(exc).__name__}: {exc}")


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it for a watched module's spec and runs the attach
    hook once the module has executed (through that module's own loader, so the import is otherwise
    exactly what it would have been)."""

    def find_spec(self, fullname, path, target=None):
        hook = WATCHED.get(fullname)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def run_then_attach(module):
            try:
                del loader.exec_module  # this instance attribute: the loader is the module's own again
            except AttributeError:
                pass
            exec_module(module)
            _attach(hook, module)

        try:
            loader.exec_module = run_then_attach
        except Exception:  # a loader that takes no attributes: the framework is simply not attached
            pass
        return spec

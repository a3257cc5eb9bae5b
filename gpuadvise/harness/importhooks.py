"""Run a function right after a module is imported, without importing it ourselves.

Recording a library's settings needs a patch on it; importing it to patch it would cost every script
that never uses it (torch.distributed.fsdp takes about a second, DeepSpeed far more), and import a
framework the user's script does not. `when_imported(name, fn)` calls `fn(module)` at once when `name`
is already imported, else the moment the user's code imports it (a finder first in `sys.meta_path`
wraps that module's loader). `fn` runs after the module's own code and before the import statement
returns, so `from name import x` already sees a patched `x`. A failing `fn` is swallowed: recording
never breaks an import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_WAITING: dict[str, list] = {}


def when_imported(name: str, fn) -> None:
    module = sys.modules.get(name)
    if module is not None:
        _call(fn, module)
        return
    _WAITING.setdefault(name, []).append(fn)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _call(fn, module) -> None:
    try:
        fn(module)
    except Exception:  # recording must never break the user's import
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _WAITING:
            return None
        sys.meta_path.remove(self)  # let the real finders find it (and not find ourselves)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, _WAITING.pop(name))
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, callbacks: list):
        self.loader = loader
        self.callbacks = callbacks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = self.loader  # the module keeps its real loader (reload, resources)
        self.loader.exec_module(module)
        for fn in self.callbacks:
            _call(fn, module)


def clear() -> None:
    """Forget every hook still waiting for its module, and the finder (a capture block that ended)."""
    _WAITING.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]

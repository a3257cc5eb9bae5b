"""Light instrumentation of the settings the rules care about, recorded while the script runs.

Each patch wraps a constructor or function, records a few attributes and where the user called it
(file:line of the first frame in the user's own code: analyzer/model/frames.py), and calls the original. Every recording is
wrapped so that a failure here can never reach the user's code.

An object an installed framework built for the user (the DataLoader a `transformers.Trainer` makes inside
`trainer.train()`) is placed at the user's line that called the framework, and says which package built it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import weakref

from gpuadvise.analyzer.model import frames

_FACTS: dict = {"dataloaders": [], "optimizers": [], "autocast": [], "compile": [], "wrappers": []}
_INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages)/")
# whether the profiled window's recorded steps are running now (the session says: `install(in_window=)`)
_IN_WINDOW: list = [lambda: False]


def facts() -> dict:
    return _FACTS


def caller() -> str:
    """file:line of the innermost frame that belongs to the user's code (model/frames.py judges: not
    torch, not a framework, not the standard library, not gpuadvise); "?" when none does."""
    return frames.live(1).site or "?"


def _is_user(frame) -> bool:
    return not frames.is_library(frame.f_code.co_filename)


def built(obj, start) -> dict:
    """Where the user's code made `obj` (its constructor is running, called from frame `start`):
    `created_at` (file:line) and `in_function`; when an installed package built it for them, also
    `built_by` (that package: the one the user's line called into; torch, the standard library and
    gpuadvise's own wrappers are no framework), `created_via` (that call, "`train` in transformers") and
    `call` (the user's line, as written).
    Frames that hold `obj` itself are its constructors and their wrappers (a subclass's `__init__`, a
    framework wrapping `DataLoader.__init__` to record its arguments): they build nothing on their own."""
    package, via, f = None, None, start
    while f is not None and not _is_user(f):
        if not any(v is obj for v in f.f_locals.values()):
            # a framework frame that asked for the object: the outermost one is what the user's line called
            name = _framework_of(f.f_code.co_filename)
            if name:
                package, via = name, f"`{f.f_code.co_name}` in {name}"
        f = f.f_back
    if f is None:
        return {"created_at": "?"}
    where = user_call(f)
    out = {"created_at": where["called_at"], "in_function": where["in_function"]}
    if package:
        out.update(created_via=via, built_by=package, call=where["call"])
    return out


def user_call(frame) -> dict:
    """The user's frame at or above `frame`: `called_at` (file:line), `call` (that line as written, for a
    message like "built by transformers (train.py:41 `trainer.train()`)") and `in_function`."""
    import linecache

    f = frame
    while f is not None and not _is_user(f):
        f = f.f_back
    if f is None:
        return {"called_at": "?", "call": "", "in_function": ""}
    return {"called_at": frames.Frame(f.f_code.co_filename, f.f_lineno).site,
            "call": linecache.getline(f.f_code.co_filename, f.f_lineno).strip()[:120], "in_function": f.f_code.co_name}


def _framework_of(path: str) -> str | None:
    """The installed package a library frame belongs to ("transformers" for …/site-packages/transformers/
    trainer.py); None for torch (a DataLoader subclass is torch's own), gpuadvise, the standard library."""
    if not _INSTALLED.search(path.replace("\\", "/")):
        return None
    name = frames.package(path)
    return None if name in ("torch", "gpuadvise") else name


def _safe(fn):
    @functools.wraps(fn)
    def inner(*a, **k):
        try:
            return fn(*a, **k)
        except Exception:  # recording must never break training
            return None

    return inner


def install(torch, in_window=None) -> None:
    """Patch torch entry points to record facts. Called once, before the user's script runs. `in_window`:
    () -> bool, whether the recorded steps are running: what was built is then told from what ran in them
    (an autocast entered, a DataLoader's batches, an optimizer's steps)."""
    if in_window is not None:
        _IN_WINDOW[0] = in_window
    _wrap_init(torch.utils.data.DataLoader, _record_dataloader)
    _wrap_iter(torch.utils.data.DataLoader)
    _wrap_init(torch.nn.DataParallel, lambda obj, a, k, where: _FACTS["wrappers"].append({"kind": "DataParallel", **where}))
    try:
        from torch.nn.parallel import DistributedDataParallel

        _wrap_init(DistributedDataParallel,
                   lambda obj, a, k, where: _FACTS["wrappers"].append({"kind": "DistributedDataParallel", **where}))
    except ImportError:  # pragma: no cover - distributed not built
        pass
    _wrap_init(torch.autocast, _record_autocast)
    _wrap_enter(torch.autocast)
    original_compile = torch.compile

    @functools.wraps(original_compile)
    def compile_(*a, **k):
        _safe(lambda: _FACTS["compile"].append({"called_at": caller(), "mode": k.get("mode")}))()
        return original_compile(*a, **k)

    torch.compile = compile_


def _wrap_init(cls, record) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *a, **k):
        original(self, *a, **k)
        where = _safe(_created)() or {"created_at": "?"}
        _safe(record)(self, a, k, where)

    cls.__init__ = __init__


def _created() -> dict:
    """`created_at`: the user's file:line that built the object; `created_via`: the library call in between
    when a framework built it for them ("`get_train_dataloader` in transformers")."""
    chosen = frames.live(3)  # from the code that called the constructor: past _safe and the __init__ wrapper
    out = {"created_at": chosen.site or "?"}
    if chosen.user is not None and chosen.library is not None and frames.package(chosen.library.file) != "gpuadvise":
        out["created_via"] = chosen.library_call
    return out


def _record_dataloader(loader, a, k, where) -> None:
    add_dataloader(loader, _safe(built)(loader, sys._getframe(3)) or where)  # 3: past our two wrappers


_LOADERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DataLoader → its entry


def add_dataloader(loader, origin: dict) -> None:
    """Record a DataLoader's settings; `origin` says where it was made (`built()`). `batches` and
    `batches_in_window` count the batches taken from it (`batch_taken`): the one the steps iterate."""
    entry = {
        **origin,
        "num_workers": loader.num_workers,
        "pin_memory": bool(loader.pin_memory),
        "batch_size": loader.batch_size,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": bool(loader.persistent_workers),
        "batches": 0,
        "batches_in_window": 0,
    }
    _FACTS["dataloaders"].append(entry)
    _LOADERS[loader] = entry


def _wrap_iter(cls) -> None:
    """Each iterator a DataLoader hands out carries its loader's entry, for `batch_taken`."""
    original = cls.__iter__

    @functools.wraps(original)
    def __iter__(self):
        it = original(self)
        _safe(_tag_iterator)(self, it)
        return it

    cls.__iter__ = __iter__


def _tag_iterator(loader, it) -> None:
    entry = _LOADERS.get(loader)
    if entry is not None:
        it._gpuadvise_loader = entry


def batch_taken(it) -> None:
    """A batch is asked of DataLoader iterator `it` (steps/sources.py's hook, after the step boundary it
    may start): counted on its loader's entry, and apart while the recorded steps run."""
    entry = getattr(it, "_gpuadvise_loader", None)
    if entry is not None:
        entry["batches"] += 1
        if _IN_WINDOW[0]():
            entry["batches_in_window"] += 1


def _record_autocast(ctx, a, k, where) -> None:
    """An autocast context as built: where, for which device and dtype, and whether it is `enabled` (its own
    flag, after torch's checks: `enabled=args.amp` with the flag off builds one that does nothing).
    `entered` and `entered_in_window` count its `with` entries (`_entered`)."""
    entry = {"created_at": where["created_at"], "device_type": getattr(ctx, "device", None),
             "dtype": str(getattr(ctx, "fast_dtype", "")), "enabled": bool(getattr(ctx, "_enabled", True))}
    known = next((e for e in _FACTS["autocast"] if all(e.get(key) == v for key, v in entry.items())), None)
    if known is None and len(_FACTS["autocast"]) < 20:
        known = dict(entry, entered=0, entered_in_window=0)
        _FACTS["autocast"].append(known)
    if known is not None:
        ctx._gpuadvise_fact = known


def _wrap_enter(cls) -> None:
    original = cls.__enter__

    @functools.wraps(original)
    def __enter__(self):
        _safe(_entered)(self)
        return original(self)

    cls.__enter__ = __enter__


def _entered(ctx) -> None:
    entry = getattr(ctx, "_gpuadvise_fact", None)
    if entry is not None:
        entry["entered"] += 1
        if _IN_WINDOW[0]():
            entry["entered_in_window"] += 1


def record_optimizer(opt) -> None:
    """Called from the optimizer-step hook: which optimizers step, and with foreach/fused or not."""
    name = type(opt).__name__
    for known in _FACTS["optimizers"]:
        if known["class"] == name and known["id"] == id(opt):
            _stepped(known)
            return
    defaults = getattr(opt, "defaults", {}) or {}
    groups = getattr(opt, "param_groups", [])
    devices: dict = {}  # parameters per device type: a model left on the CPU next to a GPU shows here
    for g in groups:
        for p in g.get("params", []):
            kind = getattr(getattr(p, "device", None), "type", "?")
            devices[kind] = devices.get(kind, 0) + 1
    entry = {"class": name, "id": id(opt), "foreach": defaults.get("foreach"), "fused": defaults.get("fused"),
             "params": sum(len(g.get("params", [])) for g in groups), "param_devices": devices,
             "steps": 0, "steps_in_window": 0}
    _FACTS["optimizers"].append(entry)
    _stepped(entry)


def _stepped(entry: dict) -> None:
    """One more step of an optimizer, counted apart while the recorded steps run: the ones that stepped there."""
    entry["steps"] += 1
    if _IN_WINDOW[0]():
        entry["steps_in_window"] += 1


# Settings and environment as they were when the profiled window ended: a script may turn anomaly
# detection or determinism on after import and off again before exit, and the later run.json writes
# (at exit) must not overwrite what the traced steps ran with.
_WINDOW: dict = {}
_STATIC: dict = {}  # the machine facts that cannot change while the script runs, read once (~1 ms)


def start_of_window(torch) -> None:
    """Called as the recorded steps begin: the backend flags then, to tell a flag the script changed while
    they ran (run.json `settings.changed_in_window`) from one they ran with throughout."""
    try:
        from gpuadvise.doctor import probe

        _WINDOW["settings_at_start"] = probe.backend_flags(torch)
    except Exception:  # recording must never break training
        pass


def end_of_window(torch) -> None:
    """Called when the profiled window completes: freeze the settings and environment the steps ran with;
    a flag that changed since the window started is listed under `changed_in_window` ([at start, at end])."""
    try:
        settings = _settings(torch, "window end")
        start = _WINDOW.get("settings_at_start") or {}
        changed = {k: [start[k], v] for k, v in settings.items() if k in start and start[k] != v}
        if changed:
            settings["changed_in_window"] = changed
        _WINDOW["settings"] = settings
        _WINDOW["environment"] = env = _environment(torch)
        half = sorted({str(e["dtype"]).replace("torch.", "") for e in _FACTS["autocast"]
                       if e.get("device_type") == "cpu" and e.get("enabled", True) and e.get("entered_in_window", 1)
                       and str(e.get("dtype")) in ("torch.bfloat16", "torch.float16")})
        if half and not env.get("cuda_available"):  # the CPU's own speed in the types its steps ran in
            env["machine"]["cpu"] = dict(env["machine"].get("cpu") or {}, matmul=cpu_matmul(torch, half))
    except Exception:  # recording must never break training
        pass


MATMUL_N = 128  # a 128×128 by 128×128 matmul: 4 MFLOP, a fraction of a millisecond in float32 on one core


def cpu_matmul(torch, dtypes: list[str]) -> dict:
    """One MATMUL_N-square matmul timed in float32 and in each 16-bit type the script autocast to on the CPU
    (the best of five, after an untimed one: the fastest is the one other processes did not slow), on the threads the script's ops run on: how much slower the
    CPU computes in that type than in float32 (cpu-half-precision's prediction). Constant inputs, so the
    script's random numbers are untouched, and autocast off around it (no timing inside the script's
    autocast on a torch without `_DisableAutocast`)."""
    import time

    out = {"n": MATMUL_N, "ms": {}}
    # autocast off without a torch.autocast object (which the script's own record would count)
    off = getattr(torch._C, "_DisableAutocast", None)
    if off is None and torch.is_autocast_enabled("cpu"):
        return out
    with torch.no_grad(), (off() if off is not None else contextlib.nullcontext()):
        for name in ["float32", *dtypes]:
            dtype = getattr(torch, name)
            x = torch.full((MATMUL_N, MATMUL_N), 0.5, dtype=dtype)
            y = torch.full((MATMUL_N, MATMUL_N), 0.25, dtype=dtype)
            torch.mm(x, y)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                torch.mm(x, y)
                best = min(best, time.perf_counter() - t0)
            out["ms"][name] = round(best * 1e3, 4)
    return out


def backend_flags(torch) -> dict:
    """run.json's `settings`: TF32, cudnn.benchmark, determinism, anomaly detection (doctor reads the same)."""
    if "settings" in _WINDOW:
        return dict(_WINDOW["settings"])
    return _settings(torch, "before the window ended")


def environment(torch) -> dict:
    """run.json's `environment`: versions and device, and under `machine` everything `gpuadvise doctor` checks."""
    if "environment" in _WINDOW:
        return dict(_WINDOW["environment"])
    try:
        return _environment(torch)
    except Exception as exc:
        return {"torch": getattr(torch, "__version__", None), "python": sys.version.split()[0],
                "cuda_available": False, "device_error": repr(exc)}


def _settings(torch, when: str) -> dict:
    from gpuadvise.doctor import probe

    return dict(probe.backend_flags(torch), read_at=when)


def _environment(torch) -> dict:
    from gpuadvise.doctor import probe

    if "environment" not in _STATIC:
        _STATIC["environment"] = probe.environment(torch)
    env = dict(_STATIC["environment"])
    # what a script can change while it runs is read fresh each time
    env["machine"] = dict(env["machine"], env=probe.env_facts(), settings=probe.backend_flags(torch))
    device = probe.current_device(torch, env["machine"]["gpus"])
    if device:
        env["device"] = device
    return env

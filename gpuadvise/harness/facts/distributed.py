"""Distributed settings as facts: how the job was launched and how DDP, FSDP and DeepSpeed were set up,
recorded while the script runs and written to run.json's `distributed` (docs/jobs.md).

- `world_size`, `rank`, `local_rank`, `local_world_size`, `node`, `backend`: the launcher's environment
  and `torch.distributed` once the process group exists (read at the window's end and at each write);
- `process_groups`: each process group this rank is in (the default one, `new_group`'s, a device mesh's):
  `name`, `desc`, `ranks` (global), `backend`; `meshes`: each `init_device_mesh` call: `created_at`,
  `device_type`, `shape`, `dim_names`, `mesh` (the ranks' layout, nested lists);
- `ddp`: each DistributedDataParallel the user's code built (file:line) with `find_unused_parameters`,
  `static_graph`, `bucket_cap_mb`, `gradient_as_bucket_view`, `broadcast_buffers`, `comm_hooks`,
  `no_sync_calls` and `no_sync_entered` (the `with` entries of what it returned: a call without `with`
  does nothing); from DDP's own logging data (`_get_ddp_logging_data`): `unused_parameter_bytes`,
  `buckets_rebuilt`, `buckets` (how many, as rebuilt after the first step), `parameter_bytes`, and its
  sampled `avg_backward_compute_ms`, `avg_backward_comm_ms`,
  `avg_backward_overlap_ms`; and `params_without_grad` (after each optimizer step, the most parameters
  with no gradient: what `find_unused_parameters=True` looks for);
- `accumulation`: per optimizer step, how many backward passes ran and how many of them all-reduced the
  gradients (not inside `no_sync()`): `backward_per_step` and `synced_backward_per_step` (medians),
  `steps`;
- `fsdp`: each FullyShardedDataParallel (FSDP1) the user built: `sharding_strategy`, `cpu_offload`,
  `mixed_precision`, `backward_prefetch`, `forward_prefetch`, `limit_all_gathers`, `use_orig_params`;
  and each `fully_shard` call (FSDP2): `module`, `reshard_after_forward`, `mesh_dims`, `param_dtype`,
  `reduce_dtype`, `offload`; `prefetch` counts the `set_modules_to_forward/backward_prefetch` calls;
- `deepspeed`: `zero_stage` and where `deepspeed.initialize` was called.

FSDP and DeepSpeed are patched only when the user's code imports them (frameworks/importwatch.py). Every recording
is wrapped: a failure here never reaches the user's code.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import weakref
from collections import deque

from . import general

_DDP: list[tuple] = []  # (weakref to the module, its facts dict)
_FSDP: list[dict] = []
_FULLY_SHARD: list[dict] = []
_PREFETCH = {"forward": 0, "backward": 0}
_DEEPSPEED: list[dict] = []
_MESHES: list[dict] = []
_STEP = {"backward": 0, "synced": 0}
_PER_STEP: deque = deque(maxlen=500)  # (backward passes, synced ones) per optimizer step
_PROCESS: dict = {}
MAX_ENTRIES = 50


def install(torch) -> None:
    """Patch DDP and the autograd entry point now; FSDP and DeepSpeed when the script imports them."""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:  # pragma: no cover - torch built without distributed
        return
    _wrap_init(DDP, _record_ddp)
    _wrap_method(DDP, "register_comm_hook", _record_comm_hook)
    _wrap_no_sync(DDP)
    original_backward = torch.autograd.backward

    @functools.wraps(original_backward)
    def backward(*a, **k):
        _safe(_count_backward)()
        return original_backward(*a, **k)

    torch.autograd.backward = backward
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda opt, args, kwargs: _safe(_after_optimizer_step)())
    # FSDP and DeepSpeed: patch_fsdp / patch_deepspeed, once the script imports them (frameworks/importwatch.py)


def summary(torch) -> dict | None:
    """run.json's `distributed`; None for a process that is not part of a job and built no wrapper."""
    _safe(_read_process)(torch)
    out: dict = dict(_PROCESS)
    ddps = [_safe(_ddp_now)(ref, f) or f for ref, f in _DDP]
    if ddps:
        out["ddp"] = ddps[:MAX_ENTRIES]
    if _PER_STEP and ddps:
        steps = list(_PER_STEP)
        out["accumulation"] = {"backward_per_step": statistics.median(b for b, _ in steps),
                               "synced_backward_per_step": statistics.median(s for _, s in steps), "steps": len(steps)}
    fsdp = {}
    if _FSDP:
        fsdp["wrappers"] = _FSDP[:MAX_ENTRIES]
    if _FULLY_SHARD:
        fsdp["fully_shard"] = _FULLY_SHARD[:MAX_ENTRIES]
        fsdp["fully_shard_calls"] = len(_FULLY_SHARD)
    if any(_PREFETCH.values()):
        fsdp["prefetch"] = dict(_PREFETCH)
    if fsdp:
        out["fsdp"] = fsdp
    if _DEEPSPEED:
        out["deepspeed"] = _DEEPSPEED[-1]
    if _MESHES:
        out["meshes"] = _MESHES[:MAX_ENTRIES]
    return out or None


def reset() -> None:
    """Forget everything recorded (a new capture block in the same process)."""
    for store in (_DDP, _FSDP, _FULLY_SHARD, _DEEPSPEED, _PER_STEP, _MESHES):
        store.clear()
    _PROCESS.clear()
    _STEP.update(backward=0, synced=0)
    _PREFETCH.update(forward=0, backward=0)


def end_of_window(torch) -> None:
    """The process group as the window ended (a script may destroy it before it exits)."""
    _safe(_read_process)(torch)


# ----------------------------------------------------------------------------------------------------
# The process and its group


def _read_process(torch) -> None:
    env = os.environ
    for key, var in (("world_size", "WORLD_SIZE"), ("rank", "RANK"), ("local_rank", "LOCAL_RANK"),
                     ("local_world_size", "LOCAL_WORLD_SIZE"), ("node", "GROUP_RANK")):
        if env.get(var, "").strip().isdigit():
            _PROCESS[key] = int(env[var])
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        _PROCESS["world_size"] = dist.get_world_size()
        _PROCESS["rank"] = dist.get_rank()
        _PROCESS["backend"] = str(dist.get_backend())
        groups = _safe(_process_groups)(dist)
        if groups:
            _PROCESS["process_groups"] = groups


def _process_groups(dist) -> list[dict]:
    """Every process group this rank is in, from torch.distributed's own registry of them."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    ranks_of = getattr(world, "pg_group_ranks", None) or {}
    names = getattr(world, "pg_names", None) or {}
    backends = getattr(world, "pg_map", None) or {}
    out = []
    for pg, ranks in list(ranks_of.items())[:MAX_ENTRIES]:
        name = names.get(pg) or getattr(pg, "group_name", None)
        if name is None:
            continue
        backend = backends.get(pg, (None,))[0]
        out.append({"name": str(name), "desc": str(getattr(pg, "group_desc", "") or ""),
                    "ranks": sorted(int(r) for r in ranks), "backend": str(backend) if backend is not None else ""})
    return out


# ----------------------------------------------------------------------------------------------------
# DDP


def _record_ddp(ddp, a, k, where) -> None:
    cap = getattr(ddp, "bucket_bytes_cap", None)
    fact = {**where, "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "static_graph": bool(getattr(ddp, "static_graph", False)),
            "bucket_cap_mb": round(cap / 2**20, 3) if isinstance(cap, (int, float)) else None,
            "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
            "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", True)), "comm_hooks": [], "no_sync_calls": 0,
            "no_sync_entered": 0, "params_without_grad": None, "params": sum(1 for p in ddp.parameters() if p.requires_grad)}
    if len(_DDP) < MAX_ENTRIES:
        _DDP.append((weakref.ref(ddp), fact))


def _facts_of(ddp) -> dict | None:
    for ref, fact in _DDP:
        if ref() is ddp:
            return fact
    return None


def _note(ddp, key: str) -> None:
    fact = _facts_of(ddp)
    if fact is not None:
        fact[key] += 1


def _wrap_no_sync(cls) -> None:
    """Count `no_sync()` calls, and the entries of the context each returns: `ddp.no_sync()` without `with`
    builds the context and skips no all-reduce."""
    original = getattr(cls, "no_sync", None)
    if original is None or getattr(original, "_gpuadvise", False):
        return

    @functools.wraps(original)
    def no_sync(self, *a, **k):
        _safe(_note)(self, "no_sync_calls")
        return _CountedEntry(original(self, *a, **k), lambda: _safe(_note)(self, "no_sync_entered"))

    no_sync._gpuadvise = True
    cls.no_sync = no_sync


class _CountedEntry:
    """The context manager `no_sync()` returned, its entries counted; otherwise that context itself."""

    def __init__(self, context, on_enter):
        self._context, self._on_enter = context, on_enter

    def __enter__(self):
        self._on_enter()
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._context, name)


def _record_comm_hook(ddp, a, k) -> None:
    fact = _facts_of(ddp)
    hook = k.get("hook", a[2] if len(a) > 2 else None)  # a: (ddp, state, hook)
    if fact is not None and hook is not None:
        name = getattr(hook, "__qualname__", None) or getattr(getattr(hook, "func", None), "__qualname__", None)
        fact["comm_hooks"].append(name or type(hook).__name__)


def _ddp_now(ref, fact: dict) -> dict:
    """The facts with DDP's own logging data as it is now (static_graph may be set after construction)."""
    ddp = ref()
    if ddp is None:
        return fact
    fact["static_graph"] = bool(getattr(ddp, "static_graph", fact["static_graph"]))
    data = ddp._get_ddp_logging_data()
    ns = 1e-6
    for key, name, scale in (("unused_parameter_size", "unused_parameter_bytes", 1), ("has_rebuilt_buckets", "buckets_rebuilt", None),
                             ("avg_backward_compute_time", "avg_backward_compute_ms", ns),
                             ("avg_backward_comm_time", "avg_backward_comm_ms", ns),
                             ("avg_backward_compute_comm_overlap_time", "avg_backward_overlap_ms", ns)):
        value = data.get(key)
        if isinstance(value, (int, float)):
            fact[name] = bool(value) if scale is None else round(value * scale, 3)
    # how DDP bucketed the gradients: the buckets as rebuilt after the first step (else as built), the bytes
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    if isinstance(sizes, str) and sizes.strip():
        fact["buckets"] = len([x for x in sizes.split(",") if x.strip()])
    if isinstance(data.get("total_parameter_size_bytes"), int):
        fact["parameter_bytes"] = data["total_parameter_size_bytes"]
    return fact


def _count_backward() -> None:
    live = [ref() for ref, _ in _DDP]
    live = [d for d in live if d is not None]
    if not live:
        return
    _STEP["backward"] += 1
    if any(getattr(d, "require_backward_grad_sync", True) for d in live):
        _STEP["synced"] += 1


def _after_optimizer_step() -> None:
    if _STEP["backward"]:
        _PER_STEP.append((_STEP["backward"], _STEP["synced"]))
    _STEP["backward"] = _STEP["synced"] = 0
    for ref, fact in _DDP:
        ddp = ref()
        if ddp is None:
            continue
        missing = sum(1 for p in ddp.parameters() if p.requires_grad and p.grad is None)
        fact["params_without_grad"] = max(missing, fact["params_without_grad"] or 0)


# ----------------------------------------------------------------------------------------------------
# FSDP (FSDP1 wrappers and FSDP2 fully_shard)


def patch_fsdp(fsdp) -> None:
    cls = getattr(fsdp, "FullyShardedDataParallel", None)
    if cls is not None:
        _wrap_init(cls, _record_fsdp1)
    def recording(original):
        def fully_shard(module, *a, **k):
            name = type(module).__name__  # before fully_shard swaps in its FSDP subclass
            out = original(module, *a, **k)
            _safe(_record_fully_shard)(name, k, general.caller())
            return out
        return fully_shard

    _wrap_function(fsdp, "fully_shard", recording, also_in="torch.distributed._composable.fsdp")
    module_cls = getattr(fsdp, "FSDPModule", None)
    if module_cls is not None:
        for direction in ("forward", "backward"):
            _wrap_method(module_cls, f"set_modules_to_{direction}_prefetch",
                         lambda m, a, k, d=direction: _PREFETCH.__setitem__(d, _PREFETCH[d] + 1))


def _name(value):
    """An enum or policy as run.json shows it."""
    if value is None:
        return None
    return getattr(value, "name", None) or type(value).__name__


def _dtype(value) -> str | None:
    """A mixed-precision policy's dtype as run.json writes it ("torch.bfloat16"); null when the policy leaves it
    unset (FSDP then computes or reduces in the parameters' own dtype)."""
    return None if value is None else str(value)


def _record_fsdp1(wrapper, a, k, where) -> None:
    mp = getattr(wrapper, "mixed_precision", None)
    offload = getattr(wrapper, "cpu_offload", None)
    # an auto-wrap policy builds inner wrappers inside the user's one, from the same line, before it: the
    # user's (outermost) wrapper is the last one from that line
    _FSDP[:] = [f for f in _FSDP if f["created_at"] != where["created_at"]]
    _FSDP.append({
        **where, "sharding_strategy": _name(getattr(wrapper, "sharding_strategy", None)),
        "cpu_offload": bool(getattr(offload, "offload_params", False)),
        "mixed_precision": {"param_dtype": _dtype(getattr(mp, "param_dtype", None)),
                            "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None))} if mp is not None else None,
        "backward_prefetch": _name(getattr(wrapper, "backward_prefetch", k.get("backward_prefetch"))),
        "forward_prefetch": bool(getattr(wrapper, "forward_prefetch", k.get("forward_prefetch", False))),
        "limit_all_gathers": bool(getattr(wrapper, "limit_all_gathers", k.get("limit_all_gathers", True))),
        "use_orig_params": bool(getattr(wrapper, "_use_orig_params", k.get("use_orig_params", False))),
    })


def _record_fully_shard(module: str, k: dict, where: str) -> None:
    mp = k.get("mp_policy")
    mesh = k.get("mesh")
    _FULLY_SHARD.append({
        "created_at": where, "module": module,
        "reshard_after_forward": k.get("reshard_after_forward"),
        "mesh_dims": getattr(mesh, "ndim", None) if mesh is not None else 1,
        "param_dtype": _dtype(getattr(mp, "param_dtype", None)),
        "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None)),
        "offload": _name(k.get("offload_policy")),
    })


# ----------------------------------------------------------------------------------------------------
# Device meshes (init_device_mesh)


def patch_device_mesh(module) -> None:
    def recording(original):
        def init_device_mesh(*a, **k):
            mesh = original(*a, **k)
            _safe(_record_mesh)(mesh, a, k, general.caller())
            return mesh
        return init_device_mesh

    _wrap_function(module, "init_device_mesh", recording, also_in="torch.distributed")


def _wrap_function(module, name: str, recording, also_in: str) -> None:
    """`module.name` replaced, once, by `recording(original)`, and so is the same function where the module
    `also_in` re-exports it (a script that imported it from there calls the wrapper too)."""
    original = getattr(module, name, None)
    if original is None or getattr(original, "_gpuadvise", False):
        return
    wrapper = functools.wraps(original)(recording(original))
    wrapper._gpuadvise = True
    setattr(module, name, wrapper)
    other = sys.modules.get(also_in)
    if other is not None and getattr(other, name, None) is original:
        setattr(other, name, wrapper)


def _record_mesh(mesh, a, k, where: str) -> None:
    layout = getattr(mesh, "mesh", None)
    shape = list(getattr(layout, "shape", ()) or ())
    names = getattr(mesh, "mesh_dim_names", None)
    if len(_MESHES) < MAX_ENTRIES:
        _MESHES.append({"created_at": where, "device_type": str(getattr(mesh, "device_type", "")),
                        "shape": [int(x) for x in shape], "dim_names": list(names) if names else None,
                        "mesh": layout.tolist() if layout is not None else None})


# ----------------------------------------------------------------------------------------------------
# DeepSpeed


def patch_deepspeed(ds) -> None:
    original = getattr(ds, "initialize", None)
    if original is None:
        return

    @functools.wraps(original)
    def initialize(*a, **k):
        _safe(_record_deepspeed)(k, general.caller())
        return original(*a, **k)

    ds.initialize = initialize


def _record_deepspeed(k: dict, where: str) -> None:
    import json

    config = k.get("config", k.get("config_params"))
    args = k.get("args")
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None)
    if isinstance(config, (str, os.PathLike)):
        with open(config) as fh:
            config = json.load(fh)
    stage = (config or {}).get("zero_optimization", {}).get("stage") if isinstance(config, dict) else None
    _DEEPSPEED.append({"created_at": where, "zero_stage": stage})


# ----------------------------------------------------------------------------------------------------


def _safe(fn):
    return general._safe(fn)


def _wrap_init(cls, record) -> None:
    general._wrap_init(cls, record)


def _wrap_method(cls, name: str, record) -> None:
    """Record each call of `cls.name` (before it runs) and call the original."""
    original = getattr(cls, name, None)
    if original is None or getattr(original, "_gpuadvise", False):
        return

    @functools.wraps(original)
    def method(self, *a, **k):
        _safe(record)(self, (self, *a), k)
        return original(self, *a, **k)

    method._gpuadvise = True
    setattr(cls, name, method)

"""Typed reads of the run.json facts `gpuadvise profile` records (`Analysis.facts`).

Rules read run.json only through these functions, never `a.facts[...]` directly: the file is
user-editable JSON, so every reader here checks types and returns None / {} / [] for anything
missing or malformed, and a rule never fails over a hand-edited file. A plain trace has no facts at
all. docs/rule-api.md lists every accessor.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import frames


def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def settings(facts: dict) -> dict:
    """Backend flags (TF32, cudnn.benchmark, determinism, anomaly detection), as the profiled window ended."""
    return _dict(_dict(facts).get("settings"))


def settings_read_at(facts: dict) -> str | None:
    """When the settings were read ("window end" or "exit"): what the traced steps ran with, or later."""
    return _str(settings(facts).get("read_at"))


def flag(facts: dict, name: str) -> bool | None:
    """One backend flag from `settings` ("cudnn_benchmark", "matmul_allow_tf32", "anomaly_detection",
    "deterministic_algorithms", "cudnn_deterministic", ...) as the recorded steps ran with it; None when not
    recorded, or when the script changed it while they ran (`changed_in_window`: no one value held)."""
    if name in changed_in_window(facts):
        return None
    v = settings(facts).get(name)
    return v if isinstance(v, bool) else None


def changed_in_window(facts: dict) -> dict[str, tuple]:
    """The backend flags the script changed while the recorded steps ran: name → (at their start, at their end)."""
    changed = _dict(settings(facts).get("changed_in_window"))
    return {k: (v[0], v[1]) for k, v in changed.items() if isinstance(k, str) and isinstance(v, list) and len(v) == 2}


def machine(facts: dict) -> dict:
    """Everything `gpuadvise doctor` checks, as recorded in the profiled process."""
    return _dict(_dict(_dict(facts).get("environment")).get("machine"))


def env_vars(facts: dict) -> dict[str, str]:
    """The watched environment variables that were set in the profiled process."""
    return {k: v for k, v in _dict(machine(facts).get("env")).items() if isinstance(k, str) and isinstance(v, str)}


def cuda_available(facts: dict) -> bool | None:
    v = _dict(_dict(facts).get("environment")).get("cuda_available")
    return v if isinstance(v, bool) else None


def device_name(facts: dict) -> str | None:
    name = _dict(_dict(_dict(facts).get("environment")).get("device")).get("name")
    return name if isinstance(name, str) else None


def describe_device(facts: dict | None, model=None, has_gpu: bool | None = None) -> str:
    """The device in one phrase, from the best source (run.json, then the trace), so every format and the
    TUI print the same words."""
    facts = facts or {}
    name = device_name(facts)
    dev = model.device if model is not None else None
    if name is None and dev is not None and dev.name:
        name = dev.name
    if name:
        parts = [name]
        if dev is not None and dev.name == name and dev.compute_major is not None:
            # "sm" is NVIDIA's word (sm_90); an AMD GPU's major.minor is its gfx generation (9.4: gfx94x)
            word = "compute capability" if dev.vendor == "amd" else "sm"
            parts.append(f"{word} {dev.compute_major}.{dev.compute_minor}")
        if dev is not None and dev.name == name and dev.total_memory:
            parts.append(f"{dev.total_memory / 2**30:.1f} GiB")
        platform = getattr(getattr(model, "meta", None), "platform", "unknown")
        if platform and platform != "unknown":
            parts.append(platform.upper())
        return ", ".join(parts)
    if cuda_available(facts) is False:
        return "CPU only (run.json: no GPU was available)"
    if has_gpu:
        return _unnamed_gpu(model)
    if model is not None and model.meta.devices:
        return "GPU listed in the trace, but no GPU activity recorded"
    return "CPU only (no GPU activity in the trace, no run.json)" if model is not None else "not recorded"


def _unnamed_gpu(model) -> str:
    """A GPU the trace does not name, in the words its kernels or its runtime calls allow."""
    from .devices import from_kernels
    from .trace import distinct_names

    platform = getattr(getattr(model, "meta", None), "platform", "unknown")
    kernels = model.kernels if model is not None else None
    seen = from_kernels(distinct_names(kernels["name"])) if kernels is not None and len(kernels) else None
    if seen is not None and (seen.vendor == "amd" or platform != "rocm"):
        return seen.describe()
    if platform == "rocm":
        return "an AMD GPU (its runtime calls are HIP's), not named in the trace"
    return "a GPU not named in the trace (no deviceProperties)"


def param_devices(facts: dict) -> dict[str, int]:
    """Parameters per device type, summed over the optimizers that stepped ({"cpu": 12, "cuda": 0, ...})."""
    out: dict[str, int] = {}
    for opt in optimizers(facts):
        for kind, n in opt.param_devices.items():
            out[kind] = out.get(kind, 0) + n
    return out


@dataclass(frozen=True)
class AutocastFact:
    """One autocast context the script built: where (`created_at`), for which device and dtype, whether it
    was `enabled` (`enabled=args.amp` with the flag off builds one that does nothing), and how often it was
    entered (`entered`; `entered_in_window`: while the recorded steps ran). None: not recorded (a run.json
    written before the harness recorded it)."""

    created_at: str
    device_type: str | None
    dtype: str
    enabled: bool | None
    entered: int | None
    entered_in_window: int | None

    @property
    def half(self) -> bool:
        """To bf16 or fp16 (what moves matmuls onto Tensor Cores)."""
        return "bfloat16" in self.dtype or "float16" in self.dtype

    @property
    def acted(self) -> bool:
        """Whether it could act on the recorded steps: enabled, and entered while they ran (True where
        run.json does not say)."""
        return self.enabled is not False and self.entered_in_window != 0

    def describe(self) -> str:
        """"autocast to bfloat16 built at train.py:40"."""
        where = f" built at {self.created_at}" if self.created_at != "?" else ""
        return f"autocast to {self.dtype.replace('torch.', '')}{where}"


def autocasts(facts: dict) -> list[AutocastFact]:
    """Every autocast context the script built, as recorded."""
    return [AutocastFact(created_at=site(e.get("created_at")) or "?", device_type=_str(e.get("device_type")),
                         dtype=str(e["dtype"]), enabled=_bool(e.get("enabled")), entered=_int(e.get("entered")),
                         entered_in_window=_int(e.get("entered_in_window")))
            for e in _entries(facts, "autocast") if e.get("dtype")]


def autocast_dtypes(facts: dict) -> list[str]:
    """The dtypes of the autocast contexts that could act on the recorded steps ("torch.bfloat16", ...): one
    built with `enabled=False`, or never entered while they ran, is left out."""
    return [c.dtype for c in autocasts(facts) if c.acted]


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _bool(v) -> bool | None:
    return v if isinstance(v, bool) else None


def _entries(facts: dict, key: str) -> list[dict]:
    v = _dict(facts).get(key)
    return [e for e in v if isinstance(e, dict)] if isinstance(v, list) else []


@dataclass(frozen=True)
class DataLoaderFact:
    """One `torch.utils.data.DataLoader` the script built, with the settings it was built with."""

    created_at: str  # "file.py:LINE" of the user code that built it, "?" when unknown
    num_workers: int | None
    pin_memory: bool | None
    batch_size: int | None
    prefetch_factor: int | None
    persistent_workers: bool | None
    created_via: str | None = None  # the framework call that built it for the user ("`train` in transformers")
    # the installed package that built it for the user ("transformers" inside `trainer.train()`; None: the
    # user's own `DataLoader(...)`), the user's line that called it as written, and the user's function there
    built_by: str | None = None
    call: str | None = None
    in_function: str | None = None
    batches_in_window: int | None = None  # batches taken from it while the recorded steps ran (None: not recorded)

    @property
    def where(self) -> str:
        """Where the user's code built it, with the framework call in between: "train.py:40 (through …)"."""
        return f"{self.created_at} (through {self.created_via})" if self.created_via else self.created_at

    def settings(self) -> tuple:
        """Its settings, as a key: frameworks often rebuild a loader with the same ones (Accelerate's prepare)."""
        return (self.num_workers, self.pin_memory, self.prefetch_factor, self.persistent_workers)


@dataclass(frozen=True)
class WrapperFact:
    """One model wrapper the script built: kind is "DataParallel" or "DistributedDataParallel"."""

    kind: str
    created_at: str
    created_via: str | None = None


@dataclass(frozen=True)
class OptimizerFact:
    """One optimizer that stepped: its class name, whether it was built with foreach/fused (None: the
    default), how many parameters it holds and on which device types."""

    cls: str
    foreach: bool | None
    fused: bool | None
    params: int | None
    param_devices: dict[str, int]
    steps_in_window: int | None = None  # its steps while the recorded steps ran (None: not recorded)

    def as_dict(self) -> dict:
        """The fact as run.json spells it, for evidence."""
        return {"class": self.cls, "foreach": self.foreach, "fused": self.fused, "params": self.params,
                "param_devices": dict(self.param_devices)}


def site(v) -> str | None:
    """A recorded source site ("file.py:LINE") when it points into the user's code; None for a library
    frame (a run.json written before the harness judged frames: model/frames.py), or nothing."""
    return frames.user_site(_str(v))


def _located(entry: dict) -> dict:
    """A recorded compile / graph-break entry with `where` kept only when it is the user's line; a
    library frame moves to `library_where` (named, never shown as the user's line)."""
    where = _str(entry.get("where"))
    user = site(where)
    if where and user is None and not entry.get("library_where"):
        frame = frames.parse(where)
        return dict(entry, where=None, library_where=frames.library_label(frame) if frame else where)
    return dict(entry, where=user)


def dataloaders(facts: dict) -> list[DataLoaderFact]:
    """Every DataLoader the script built, in creation order."""
    return [DataLoaderFact(created_at=site(e.get("created_at")) or "?", num_workers=_int(e.get("num_workers")),
                           pin_memory=_bool(e.get("pin_memory")), batch_size=_int(e.get("batch_size")),
                           prefetch_factor=_int(e.get("prefetch_factor")),
                           persistent_workers=_bool(e.get("persistent_workers")), created_via=_str(e.get("created_via")),
                           built_by=_str(e.get("built_by")), call=_str(e.get("call")), in_function=_str(e.get("in_function")),
                           batches_in_window=_int(e.get("batches_in_window")))
            for e in _entries(facts, "dataloaders")]


def iterated_loaders(facts: dict) -> list[DataLoaderFact] | None:
    """The DataLoaders the recorded steps took batches from; None where run.json does not tell (no loader's
    batches were counted there: an older harness, or a loader whose own `__iter__` bypasses torch's)."""
    loaders = dataloaders(facts)
    fed = [d for d in loaders if d.batches_in_window]
    return fed or None


def training_loaders(facts: dict) -> list[DataLoaderFact]:
    """The DataLoaders that feed training, one per distinct origin and settings: the ones the recorded steps
    took batches from where run.json counted them (`iterated_loaders`); a loader a framework rebuilt with
    the same settings (Accelerate's `prepare`, Lightning's distributed sampler) is the user's own one again;
    under Lightning, the loaders a `val_dataloader()` / `test_dataloader()` returned are left out when a
    training one is known."""
    loaders = dataloaders(facts)
    fed = iterated_loaders(facts)
    if fed is not None:  # the iterated ones, and the user's own loaders a framework rebuilt them from
        loaders = [d for d in loaders if d in fed or any(f.built_by and f.settings() == d.settings() for f in fed)]
    fw = framework(facts)
    if fw is not None and fw.name == "lightning":
        train = [d for d in loaders if d.in_function == "train_dataloader"]
        loaders = train or loaders
    out: list[DataLoaderFact] = []
    for d in loaders:
        twin = next((o for o in out if o.settings() == d.settings() and (o.created_at == d.created_at or d.built_by)), None)
        if twin is None:
            out.append(d)
    return out


def wrappers(facts: dict, kind: str | None = None) -> list[WrapperFact]:
    """The DataParallel / DistributedDataParallel wrappers the script built (only `kind` when given)."""
    out = [WrapperFact(kind=_str(e.get("kind")) or "?", created_at=site(e.get("created_at")) or "?",
                       created_via=_str(e.get("created_via")))
           for e in _entries(facts, "wrappers")]
    return [w for w in out if kind is None or w.kind == kind]


def optimizers(facts: dict, cls: str | None = None, in_window_only: bool = True) -> list[OptimizerFact]:
    """The optimizers that stepped in the recorded steps where run.json counted their steps there (else, or
    with `in_window_only=False`, every one that stepped); only those of class name `cls` when given, e.g. "AdamW"."""
    out = []
    for e in _entries(facts, "optimizers"):
        devices = {k: n for k, n in _dict(e.get("param_devices")).items() if isinstance(k, str) and _int(n) is not None}
        out.append(OptimizerFact(cls=_str(e.get("class")) or "?", foreach=_bool(e.get("foreach")),
                                 fused=_bool(e.get("fused")), params=_int(e.get("params")), param_devices=devices,
                                 steps_in_window=_int(e.get("steps_in_window"))))
    if in_window_only:
        out = [o for o in out if o.steps_in_window] or out
    return [o for o in out if cls is None or o.cls == cls]


# -- the training framework that ran the loop (run.json `framework`, written by harness/frameworks/loop.py) ------

FRAMEWORK_LABELS = {"transformers": "transformers' Trainer", "lightning": "Lightning's Trainer", "accelerate": "Accelerate"}


@dataclass(frozen=True)
class FrameworkFact:
    """The framework whose loop the script ran: `name` ("transformers", "lightning", "accelerate"), its
    `version`, the `entry` that started the loop ("Trainer.train()"), the user's line that called it
    (`called_at` "train.py:41", `call` as written), its `settings` as it reported them
    (TrainingArguments fields, Lightning's precision / accumulate_grad_batches / strategy, …), and
    `accelerate`: Accelerate's state under transformers' Trainer."""

    name: str
    version: str | None
    entry: str | None
    called_at: str
    call: str | None
    settings: dict
    accelerate: dict

    @property
    def label(self) -> str:
        return FRAMEWORK_LABELS.get(self.name, self.name)

    def setting(self, key: str):
        """One setting (a scalar or a list of scalars), None when not recorded."""
        v = self.settings.get(key)
        if isinstance(v, list):
            return [x for x in v if isinstance(x, (bool, int, float, str))]
        return v if isinstance(v, (bool, int, float, str)) else None


def _scalars(v) -> dict:
    return {k: x for k, x in _dict(v).items() if isinstance(k, str) and (x is None or isinstance(x, (bool, int, float, str, list)))}


def framework(facts: dict) -> FrameworkFact | None:
    """The training framework that ran the loop; None when the script drove its own."""
    fw = _dict(_dict(facts).get("framework"))
    name = _str(fw.get("name"))
    if not name:
        return None
    return FrameworkFact(name=name, version=_str(fw.get("version")), entry=_str(fw.get("entry")),
                         called_at=site(fw.get("called_at")) or "?", call=_str(fw.get("call")),
                         settings=_scalars(fw.get("settings")), accelerate=_scalars(fw.get("accelerate")))


def framework_phases(facts: dict) -> list[dict]:
    """What the framework ran between its steps, as recorded: `kind` ("evaluation", "checkpoint"), `step`
    (run.json step number), `window` (the profiler's phase in that step), `ms`."""
    phases = _dict(_dict(facts).get("framework")).get("phases")
    return [{"kind": p["kind"], "step": p["step"], "window": _str(p.get("window")), "ms": _num(p.get("ms"))}
            for p in phases if isinstance(p, dict) and isinstance(p.get("kind"), str) and _int(p.get("step")) is not None] \
        if isinstance(phases, list) else []


# -- torch.compile -----------------------------------------------------------------------------------
def compiled(facts: dict) -> dict:
    """run.json's `compiled` (what torch.compile did while the script ran); {} when it never compiled."""
    return _dict(facts.get("compiled"))


def step_times_ms(facts: dict) -> dict[int, float]:
    """Every timed step (run.json `steps`: number → ms), in and out of the profiled window."""
    steps = _dict(facts.get("steps"))
    numbers, ms = steps.get("number"), steps.get("ms")
    if not isinstance(numbers, list) or not isinstance(ms, list):
        return {}
    return {n: float(v) for n, v in zip(numbers, ms)
            if isinstance(n, int) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0}


COMPILE_WARMUP_STEPS = 2  # steps 0 and 1 compile (and recompile once for grad mode / automatic dynamic) by design


def _compile_list(v) -> list[dict]:
    return [e for e in v if isinstance(e, dict)] if isinstance(v, list) else []


def _seconds(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else 0.0


def compile_events(facts: dict) -> list[dict]:
    """Each frame compile `gpuadvise profile` recorded, `seconds` made a float (0.0 when missing)."""
    return [_located(dict(c, seconds=_seconds(c.get("seconds")))) for c in _compile_list(compiled(facts).get("compiles"))]


def compiles_in_window(facts: dict) -> list[dict]:
    """The compiles (as `compile_events`) that ran in a recorded step of the window."""
    window = window_steps(facts)
    return [c for c in compile_events(facts) if c.get("phase") == "active" or c.get("step") in window]


def recompiles_after_warmup(facts: dict) -> list[dict]:
    """Recompilations from step COMPILE_WARMUP_STEPS on, each with its compile seconds when recorded."""
    seconds = {c.get("compile_id"): c["seconds"] for c in compile_events(facts)}
    return [_located(dict(r, seconds=seconds.get(r.get("compile_id"), 0.0)))
            for r in _compile_list(compiled(facts).get("recompiles")) if (_int(r.get("step")) or -1) >= COMPILE_WARMUP_STEPS]


def recompile_limit_hits(facts: dict) -> list[dict]:
    """Frames that hit dynamo's recompile limit (and run eagerly from then on): function, where, step, reason."""
    return [_located(h) for h in _compile_list(compiled(facts).get("limit_hit"))]


def compiled_module(entry: dict) -> str:
    """The compiled code of a compile entry, named in the user's terms: "the compiled `Net` (torch.compile
    at train.py:31)" for a module dynamo compiled through a frame inside torch or a framework, else "the
    function at model.py:22"; "a frame inside torch" when the entry names no user line at all."""
    where = entry.get("where")
    module, at = _str(entry.get("module")), site(entry.get("compiled_at"))
    if module:
        forward = f", forward at {where}" if where and where != at else ""
        return f"the compiled `{module}` (torch.compile at {at or '?'}{forward})"
    if where:
        return f"the function at {where}"
    library = _str(entry.get("library_where"))
    if library:
        return f"a frame inside {frames.package(library)}"
    frame = _str(entry.get("frame"))  # a recompile read from a trace: its compile id F/R only
    return f"compiled frame {frame.split('/')[0]}" if frame else "an unrecorded frame"


def compile_seconds_by_step(facts: dict) -> dict[int, float]:
    """Seconds spent compiling in each step (run.json step numbers)."""
    out: dict[int, float] = {}
    for k, v in (compiled(facts).get("compile_seconds_per_step") or {}).items():
        try:
            out[int(k)] = out.get(int(k), 0.0) + _seconds(v)
        except (TypeError, ValueError):
            continue
    return out


def graph_break_sites(facts: dict) -> list[dict]:
    """One entry per graph-break site: `where` (user file:line or None), `reason`, `count`, `steps`."""
    return [_located(b) for b in _compile_list(compiled(facts).get("graph_breaks"))]


def window_steps(facts: dict) -> list[int]:
    """The step numbers (as run.json's `steps` counts them) that the profiler recorded."""
    steps = facts.get("steps") if isinstance(facts.get("steps"), dict) else {}
    return [n for n, p in zip(steps.get("number") or [], steps.get("phase") or []) if p == "active" and isinstance(n, int)]


# -- where the DataLoader's time goes (run.json `capture.loader`, written by harness/loaderprobe.py) --------

def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


def usable_cpus(facts: dict) -> int | None:
    """CPU cores the profiled process could use (its affinity, capped by a cgroup quota)."""
    cpu = _dict(machine(facts).get("cpu"))
    usable, limit = _num(cpu.get("usable")), _num(cpu.get("cgroup_limit"))
    if usable is None:
        return None
    return int(min(usable, limit)) if limit else int(usable)


# the CPU flags (`environment.machine.cpu.flags`, /proc/cpuinfo's names) that give a 16-bit float type its
# own arithmetic: x86's AVX-512 and AMX instructions, Arm's BF16 and half-precision SIMD. Without one the CPU
# converts to float32 and back around each operation.
NATIVE_16BIT = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16"), "float16": ("avx512_fp16", "amx_fp16", "asimdhp")}


def cpu_16bit(facts: dict) -> dict[str, bool] | None:
    """Whether the CPU computes in each 16-bit float type ("bfloat16", "float16"): None when run.json did
    not record the CPU's flags (not Linux, or written before they were recorded)."""
    flags = _dict(machine(facts).get("cpu")).get("flags")
    if not isinstance(flags, list):
        return None
    have = {f for f in flags if isinstance(f, str)}
    return {dtype: any(f in have for f in native) for dtype, native in NATIVE_16BIT.items()}


def cpu_matmul_ms(facts: dict) -> tuple[int, dict[str, float]] | None:
    """`gpuadvise profile`'s timing of one n-square matmul on the CPU in float32 and in each 16-bit type the
    script autocast to there (`environment.machine.cpu.matmul`: n, ms by type name): (n, {"float32": ms, …});
    None when not recorded (a run without CPU autocast, or an older run.json)."""
    mm = _dict(_dict(machine(facts).get("cpu")).get("matmul"))
    times = {k: float(v) for k, v in _dict(mm.get("ms")).items() if isinstance(k, str) and _num(v)}
    n = _int(mm.get("n"))
    return (n, times) if n and "float32" in times else None


def cpu_model(facts: dict) -> str | None:
    return _str(_dict(machine(facts).get("cpu")).get("model"))


def threads(facts: dict) -> int | None:
    """torch.get_num_threads() as the window ended: the threads one op runs on (intra-op)."""
    v = settings(facts).get("num_threads")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


@dataclass(frozen=True)
class Cores:
    """The CPU cores one rank of the job has: what the process could use, shared by the ranks on its node."""

    usable: int  # the process's affinity, capped by a cgroup quota (`usable_cpus`)
    ranks_on_node: int  # the job's local world size (1 outside a job, or when run.json does not say)

    @property
    def per_rank(self) -> int:
        """Each rank's share of the node's cores (at least one)."""
        return max(1, self.usable // max(1, self.ranks_on_node))

    def words(self) -> str:
        """"2 usable, 2 ranks on this node: 1 per rank" / "8 usable"."""
        if self.ranks_on_node > 1:
            return f"{self.usable} usable, {self.ranks_on_node} ranks on this node: {self.per_rank} per rank"
        return f"{self.usable} usable"


def cores(facts: dict) -> Cores | None:
    """The cores each rank of the job has (run.json's `environment.machine.cpu` and `distributed`): None
    without the machine's count. Ranks on one node share its cores: their number is the local world size."""
    usable = usable_cpus(facts)
    if usable is None:
        return None
    local = job(facts).local_world_size
    return Cores(usable=usable, ranks_on_node=local if local and local > 0 else 1)


def loader_profile(facts: dict) -> dict | None:
    """run.json's `capture.loader`, numbers checked: None without a measured batch build time."""
    lp = _dict(_dict(facts.get("capture")).get("loader"))
    build = _num(lp.get("build_ms_per_batch"))
    if not build:
        return None
    out = {k: _num(lp.get(k)) for k in ("build_ms_per_batch", "build_cpu_ms_per_batch", "fetch_ms_per_batch",
                                         "fetch_ms_per_sample",
                                         "collate_ms_per_batch", "wait_ms_per_batch", "between_batches_ms",
                                         "batches_built", "samples")}
    workers = lp.get("num_workers")
    out["num_workers"] = workers if isinstance(workers, int) and not isinstance(workers, bool) and workers >= 0 else None
    out["fetch"] = lp.get("fetch") if isinstance(lp.get("fetch"), str) else "__getitem__"
    out["functions"] = [
        {"function": f["function"], "file": f["file"], "line": int(f["line"]), "share_pct": float(f["share_pct"]),
         "ms_per_batch": _num(f.get("ms_per_batch"))}
        for f in lp.get("functions") or []
        if isinstance(f, dict) and isinstance(f.get("function"), str) and isinstance(f.get("file"), str)
        and not frames.is_library(f["file"], stripped=False)
        and _num(f.get("line")) is not None and _num(f.get("share_pct")) is not None]
    return out


# -- distributed training (run.json `distributed`) -----------------------------------------------------
def distributed(facts: dict) -> dict:
    """run.json's `distributed` as written (docs/jobs.md); {} for a process outside a job."""
    return _dict(_dict(facts).get("distributed"))


@dataclass(frozen=True)
class JobFact:
    """How the job was launched: the process group as the window ended."""

    world_size: int | None
    rank: int | None
    local_world_size: int | None
    backend: str | None  # "nccl", "gloo", …


def job(facts: dict) -> JobFact:
    d = distributed(facts)
    return JobFact(world_size=_int(d.get("world_size")), rank=_int(d.get("rank")),
                   local_world_size=_int(d.get("local_world_size")), backend=_str(d.get("backend")))


@dataclass(frozen=True)
class DDPFact:
    """One DistributedDataParallel the script built, with its settings and what DDP itself measured."""

    created_at: str
    find_unused_parameters: bool | None
    static_graph: bool | None
    bucket_cap_mb: float | None
    gradient_as_bucket_view: bool | None
    comm_hooks: tuple[str, ...]
    no_sync_calls: int | None
    params: int | None
    params_without_grad: int | None  # the most parameters without a gradient after an optimizer step
    unused_parameter_bytes: int | None  # DDP's logging data: bytes of parameters its search found unused
    buckets: int | None = None  # DDP's logging data: gradient buckets (as rebuilt after the first step)
    parameter_bytes: int | None = None  # DDP's logging data: the parameters' bytes
    no_sync_entered: int | None = None  # `with` entries of what no_sync() returned (None: not recorded)

    def as_dict(self) -> dict:
        return {"created_at": self.created_at, "find_unused_parameters": self.find_unused_parameters,
                "static_graph": self.static_graph, "bucket_cap_mb": self.bucket_cap_mb,
                "gradient_as_bucket_view": self.gradient_as_bucket_view, "comm_hooks": list(self.comm_hooks),
                "no_sync_calls": self.no_sync_calls, "params_without_grad": self.params_without_grad}


def ddp(facts: dict) -> list[DDPFact]:
    """The DistributedDataParallel wrappers the script built (run.json `distributed.ddp`)."""
    out = []
    for e in _entries(distributed(facts), "ddp"):
        hooks = tuple(h for h in e.get("comm_hooks") or [] if isinstance(h, str)) if isinstance(e.get("comm_hooks"), list) else ()
        cap = e.get("bucket_cap_mb")
        out.append(DDPFact(created_at=site(e.get("created_at")) or "?",
                           find_unused_parameters=_bool(e.get("find_unused_parameters")),
                           static_graph=_bool(e.get("static_graph")),
                           bucket_cap_mb=float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else None,
                           gradient_as_bucket_view=_bool(e.get("gradient_as_bucket_view")), comm_hooks=hooks,
                           no_sync_calls=_int(e.get("no_sync_calls")), params=_int(e.get("params")),
                           params_without_grad=_int(e.get("params_without_grad")),
                           unused_parameter_bytes=_int(e.get("unused_parameter_bytes")),
                           buckets=_int(e.get("buckets")), parameter_bytes=_int(e.get("parameter_bytes")),
                           no_sync_entered=_int(e.get("no_sync_entered"))))
    return out


@dataclass(frozen=True)
class AccumulationFact:
    """Backward passes per optimizer step (medians over the steps seen), and how many all-reduced."""

    backward_per_step: float
    synced_backward_per_step: float
    steps: int


def accumulation(facts: dict) -> AccumulationFact | None:
    a = _dict(distributed(facts).get("accumulation"))
    b, s, n = _num(a.get("backward_per_step")), _num(a.get("synced_backward_per_step")), _int(a.get("steps"))
    if b is None or s is None or not n:
        return None
    return AccumulationFact(backward_per_step=b, synced_backward_per_step=s, steps=n)


def fsdp(facts: dict) -> dict:
    """FSDP settings (run.json `distributed.fsdp`): `wrappers` (FSDP1: `sharding_strategy`, `cpu_offload`,
    `mixed_precision`, `backward_prefetch`, `forward_prefetch`, `limit_all_gathers`, `use_orig_params`),
    `fully_shard` (FSDP2 calls: `module`, `reshard_after_forward`, `mesh_dims`, `param_dtype`,
    `reduce_dtype`, `offload`), `prefetch` (explicit FSDP2 prefetch calls); {} without FSDP."""
    d = _dict(distributed(facts).get("fsdp"))
    return {"wrappers": _entries(d, "wrappers"), "fully_shard": _entries(d, "fully_shard"),
            "prefetch": {k: v for k, v in _dict(d.get("prefetch")).items() if _int(v) is not None}} if d else {}


def process_groups(facts: dict) -> list[dict]:
    """The process groups the rank was in as its window ended (run.json `distributed.process_groups`):
    {"name", "desc", "ranks", "backend"} each; [] when not recorded."""
    out = []
    for g in _entries(distributed(facts), "process_groups"):
        ranks = g.get("ranks")
        if _str(g.get("name")) is not None and isinstance(ranks, list) and all(_int(r) is not None for r in ranks):
            out.append({"name": str(g["name"]), "desc": str(g.get("desc") or ""), "ranks": [int(r) for r in ranks],
                        "backend": str(g.get("backend") or "")})
    return out


def meshes(facts: dict) -> list[dict]:
    """The device meshes `init_device_mesh` built (run.json `distributed.meshes`): `shape`, `dim_names`,
    `mesh` (the ranks' layout, nested lists), `created_at`; [] when none."""
    return [m for m in _entries(distributed(facts), "meshes") if isinstance(m.get("shape"), list)]


def zero_stage(facts: dict) -> int | None:
    """DeepSpeed's ZeRO stage when the script called deepspeed.initialize with one."""
    return _int(_dict(distributed(facts).get("deepspeed")).get("zero_stage"))


# -- long runs: the windows after the first and their triggers (run.json `capture.windows`, `capture.triggers`) --

@dataclass(frozen=True)
class WindowFact:
    """One profiled window of a run: window 1 is `--wait/--warmup/--active`'s, the others were asked for
    while the script ran (`trigger`: "signal", "trigger file", "slower", "stall", "every")."""

    index: int
    trigger: str
    detail: str
    steps: tuple[int, int] | None  # the first and last recorded step
    state: str  # "captured", "planned", "incomplete: …", "not reached: …", "failed: …"
    trace: str | None  # its trace file's name in the run folder
    requested_at: int | None  # the step boundary at which it was asked for


def windows(facts: dict) -> list[WindowFact]:
    """Every window run.json lists, by index (empty for a run with one window)."""
    out = []
    for w in _entries(_dict(facts.get("capture")), "windows"):
        index = _int(w.get("index"))
        if index is None:
            continue
        span = w.get("steps")
        steps = (span[0], span[1]) if isinstance(span, list) and len(span) == 2 and all(
            _int(v) is not None for v in span) else None
        out.append(WindowFact(index=index, trigger=_str(w.get("trigger")) or "?", detail=_str(w.get("detail")) or "",
                              steps=steps, state=_str(w.get("state")) or "?", trace=_str(w.get("trace")),
                              requested_at=_int(w.get("requested_at"))))
    return sorted(out, key=lambda w: w.index)


def window_facts(facts: dict, index: int) -> dict:
    """The facts a later window's trace is analysed with: the run's, with that window's `steps` (its recorded
    steps and the unprofiled ones around them, for the profiler's calibration) and what was measured while
    it recorded (`capture.loader`, `capture.shapes`). Window 1, or a run without windows: the run's."""
    if index <= 1:
        return facts
    entry = next((w for w in _entries(_dict(facts.get("capture")), "windows") if w.get("index") == index), None)
    if entry is None:
        return facts
    capture = {k: v for k, v in _dict(facts.get("capture")).items() if k not in ("loader", "shapes")}
    capture.update({k: entry[k] for k in ("loader", "shapes") if k in entry})
    capture["window"] = {"wait": None, "warmup": entry.get("warmup"), "active": entry.get("active")}
    out = dict(facts, capture=capture)
    out["steps"] = _dict(entry.get("step_times"))
    return out


def unprofiled_median_ms(facts: dict) -> float | None:
    """run.json `steps.unprofiled_median_ms`: the median step no profiler touched (ms)."""
    v = _num(_dict(facts.get("steps")).get("unprofiled_median_ms"))
    return v if v else None


def slower_steps(facts: dict) -> int | None:
    """`--slower-steps` of the run (the steps in each median `--when-slower` compared), when it was set."""
    return _int(_dict(_dict(facts.get("capture")).get("triggers")).get("slower_steps"))


def device_memory(facts: dict) -> int | None:
    """The GPU's memory in bytes, as run.json recorded it."""
    return _int(_dict(_dict(_dict(facts).get("environment")).get("device")).get("total_memory"))


def shape_capture(facts: dict) -> tuple[dict, dict]:
    """How `gpuadvise profile` recorded op shapes: run.json `capture.options` (`record_shapes`,
    `shapes_probe`) and `capture.shapes` (where the trace's shapes came from, and the probe's `state`);
    both empty for a trace from elsewhere."""
    capture = _dict(_dict(facts).get("capture"))
    return _dict(capture.get("options")), _dict(capture.get("shapes"))

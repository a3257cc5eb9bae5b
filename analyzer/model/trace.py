"""The analysis model: one trace (one rank) as typed pandas frames plus its facts.

Every frame has `ts` and `dur` in microseconds, rebased so that the earliest event is at 0, and
`end = ts + dur`. Names are pandas categoricals: a 100k-row kernel frame with 300 distinct names costs
a few bytes per row for the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


def name_mask(col: pd.Series, predicate) -> np.ndarray:
    """Boolean mask over a name column, calling `predicate(name)` once per distinct name.

    Names are categoricals: testing the few hundred categories instead of a million strings is what
    keeps rules cheap on gigabyte traces.
    """
    if isinstance(col.dtype, pd.CategoricalDtype):
        cats = col.cat.categories
        hit = np.fromiter((bool(predicate(str(c))) for c in cats), dtype=bool, count=len(cats))
        codes = col.cat.codes.to_numpy()
        if not len(hit):
            return np.zeros(len(col), dtype=bool)
        return np.where(codes >= 0, hit[np.clip(codes, 0, None)], False)
    cache: dict = {}
    return np.fromiter((cache[v] if v in cache else cache.setdefault(v, bool(predicate(str(v)))) for v in col),
                       dtype=bool, count=len(col))


def distinct_names(col: pd.Series) -> list[str]:
    """The column's names in order of first appearance, as text (a missing one as "nan"): found on the
    categorical's codes rather than on a million strings."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return [str(n) for n in col.unique()]
    return list(col.astype(str).unique())


def names_in(col: pd.Series, names) -> np.ndarray:
    names = set(names)
    return name_mask(col, names.__contains__)


@dataclass
class Device:
    id: int
    name: str
    compute_major: int | None = None
    compute_minor: int | None = None
    total_memory: int | None = None
    num_sms: int | None = None

    @property
    def vendor(self) -> str:
        n = self.name.lower()
        if "amd" in n or "instinct" in n or "radeon" in n:
            return "amd"
        if n:
            return "nvidia"
        return "unknown"


@dataclass
class TraceMeta:
    path: str
    rank: int | None = None
    world_size: int | None = None
    devices: list[Device] = field(default_factory=list)
    backend: str | None = None  # the job's distributed backend (distributedInfo): "nccl", "gloo", …
    # the process groups this rank belongs to (distributedInfo's `pg_config`): {"name", "desc", "ranks", "backend"}
    process_groups: list[dict] = field(default_factory=list)
    platform: str = "unknown"  # "cuda", "rocm" or "unknown"
    versions: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, Any] = field(default_factory=dict)  # record_shapes, with_stack, profile_memory
    base_ts_us: float = 0.0  # absolute timestamp of rebased 0
    events_total: int = 0
    events_skipped: int = 0  # malformed events dropped while loading
    unknown_categories: dict[str, int] = field(default_factory=dict)
    truncated: bool = False  # the file was cut off mid-write (or damaged) and salvaged
    damaged_at: int | None = None  # byte where the JSON stopped being valid, when it was not simply cut off
    bytes_total: int = 0
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    profiler_ranges: int = 0  # CUPTI range-profiler events (no kernel timeline in that mode)
    overhead_events: int = 0


@dataclass
class TraceModel:
    """One rank's trace. Frames (all may be empty):

    - `gpu`: kernels, memcpys and memsets (`kind` in {"kernel", "memcpy", "memset"}), with
      `device`, `stream`, `correlation`, `external_id`, `bytes`, and `graph_node`: the CUDA-graph node
      that launched it (CUPTI's `graph node id`; -1 for work launched directly).
    - `runtime`: CUDA/HIP runtime and driver calls (`pid`, `tid`, `correlation`, `external_id`).
    - `cpu`: CPU ops and user annotations (`is_annotation`), with `external_id`, `seq` (the autograd
      sequence number ops carry while grad mode is on, -1 without), `input_type`, `input_dims` and
      `input_concrete` (the scalar arguments; matmul, convolution and attention ops only:
      model/flopops.py) and the legacy `call_stack`.
    - `python`: python_function frames (`python_id`, `parent_id`).
    - `memory`: `[memory]` instant events (`bytes`, `total_allocated`, `total_reserved`, `device`).
    - `syncs`: Kineto `cuda_sync` events.
    - `gpu_annotations`: GPU-projected user annotations.
    - `comms`: every event that is a collective on any backend (model/collectives.py): its `role`
      ("kernel", "host" or "call"), where it ran (`pid`/`tid`: device/stream for kernels), and the
      metadata newer torch records (`collective`, `pg`, `group_size`, `in_nelems`, `out_nelems`,
      `dtype`, `seq`; and, newer still, the group's description `pg_desc` and ranks `pg_ranks` as written,
      and `comms_id`, the one id a collective has on every rank, as its text; "" where absent).
    """

    meta: TraceMeta
    gpu: pd.DataFrame
    runtime: pd.DataFrame
    cpu: pd.DataFrame
    python: pd.DataFrame
    memory: pd.DataFrame
    syncs: pd.DataFrame
    gpu_annotations: pd.DataFrame
    comms: pd.DataFrame

    @property
    def kernels(self) -> pd.DataFrame:
        return self._gpu_kind("kernel")

    @property
    def copies(self) -> pd.DataFrame:
        return self._gpu_kind("memcpy")

    def _gpu_kind(self, kind: str) -> pd.DataFrame:
        """`gpu`'s rows of one kind, filtered once per `gpu` frame (every rule and metric reads them; callers
        never change the frame they get)."""
        views = self.__dict__.setdefault("_gpu_views", {})
        held = views.get(kind)
        if held is None or held[0] is not self.gpu:
            held = views[kind] = (self.gpu, self.gpu[self.gpu["kind"] == kind])
        return held[1]

    def per_cpu_frame(self, key: str, compute):
        """`compute(self)`, worked out once per `cpu` frame: what the measure stage derives from the CPU ops
        (each op's pass, its FLOPs) and several metrics and rules read."""
        held = self.__dict__.setdefault("_per_cpu_frame", {}).get(key)
        if held is None or held[0] is not self.cpu:
            held = self.__dict__["_per_cpu_frame"][key] = (self.cpu, compute(self))
        return held[1]

    @property
    def device(self) -> Device | None:
        """The device the GPU events ran on (the busiest one when several appear)."""
        if not self.meta.devices:
            return None
        if len(self.gpu):
            busiest = int(self.gpu.groupby("device", observed=True)["dur"].sum().idxmax())
            for d in self.meta.devices:
                if d.id == busiest:
                    return d
        return self.meta.devices[0]

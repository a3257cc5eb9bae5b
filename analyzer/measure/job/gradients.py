"""Room to hide a gradient reduction: the compute a rank still does once its first gradient is ready.

Data-parallel training reduces gradients while the backward pass computes the rest: DDP all-reduces a
bucket as soon as its gradients are ready, FSDP reduce-scatters a layer's. So the transfer a better
overlap can hide is at most the compute that comes after the first gradient of the step's last backward
pass is ready and before its last one is: a model whose gradients are all ready at the same moment (one
layer, `Linear(20, 1)`) has nothing to hide its reduction behind, whatever its buckets.

A gradient is ready when autograd accumulates it (`autograd::engine::evaluate_function:
torch::autograd::AccumulateGrad`). The step's last backward pass is the run of backward ops
(`autograd::engine::evaluate_function: …`) after the last op outside them (forward work) that precedes
the last accumulation: with gradient accumulation only the last micro-batch's backward reduces. The
room is the rank's own work between the first and the last accumulation of that pass: CPU ops on its
training threads (a CPU backend's collectives, gloo's), or the compute kernels launched there (a GPU
job's: their union on the GPU).
"""

from __future__ import annotations

import numpy as np

from ..basics import intervals as iv
from ..basics.metrics import Metrics
from ..basics.steps import cpu_windows
from gpuadvise.analyzer.model import collectives as coll
from gpuadvise.analyzer.model.kernels import is_comm
from gpuadvise.analyzer.model.trace import TraceModel, name_mask

BACKWARD = "autograd::engine::evaluate_function: "
READY = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def reduction_room_per_step(model: TraceModel, m: Metrics,
                            own_work: tuple[np.ndarray, np.ndarray]) -> list[float] | None:
    """Per row of `m.per_step`, µs: the rank's own work between the first and the last gradient ready in the
    step's last backward pass (0 in a step without one). None when the trace records no gradient
    accumulation at all (no autograd ops: the room is unknown, not nil). `own_work`: the rank's work as
    merged intervals on the model's clock (measure/job/collectives.own_work less its base), used for a CPU
    backend's collectives."""
    cpu = model.cpu
    n = len(m.per_step)
    if cpu.empty or not n:
        return None
    ops = cpu[~cpu["is_annotation"].to_numpy(dtype=bool)]
    backward = name_mask(ops["name"], lambda s: s.startswith(BACKWARD))
    ready = name_mask(ops["name"], lambda s: s == READY)
    if not ready.any():
        return None
    ts, end = ops["ts"].to_numpy(dtype=float), ops["end"].to_numpy(dtype=float)
    b_lo, b_hi = iv.union(ts[backward], end[backward])
    # forward work: ops outside every backward op (a step's last forward ends before its last backward begins),
    # on the training threads (a CPU backend's own threads run the collectives, not the model), collectives' calls
    # left out
    comms = model.comms
    backend_threads = (set(comms.loc[comms["role"] == coll.HOST, "tid"].tolist())
                       if comms is not None and len(comms) else set())
    training = ~ops["tid"].isin(backend_threads).to_numpy() & ~name_mask(ops["name"], lambda s: coll.role(s, False) is not None)
    outside = training & ~backward & (iv.covered(b_lo, b_hi, ts, end) < (end - ts) - 1e-6)
    f_ts = np.sort(ts[outside])
    r_ts, r_end = ts[ready], end[ready]
    order = np.argsort(r_ts)
    r_ts, r_end = r_ts[order], r_end[order]
    lo, hi = cpu_windows(m.steps, m.window)
    room_lo, room_hi = np.zeros(n), np.zeros(n)
    for j in range(n):
        mine = np.flatnonzero((r_ts >= lo[j]) & (r_ts < hi[j]))
        if not len(mine):
            continue
        last = mine[-1]
        # the last forward op before the last accumulation: the last backward pass begins after it
        k = np.searchsorted(f_ts, r_ts[last], side="left") - 1
        since = f_ts[k] if k >= 0 and f_ts[k] >= lo[j] else lo[j]
        in_pass = mine[r_ts[mine] >= since]
        room_lo[j], room_hi[j] = r_end[in_pass[0]], r_end[last]
    if not model.kernels.empty and m.has_gpu:
        return _kernels_launched(model, m, room_lo, room_hi)
    work_lo, work_hi = own_work
    return [float(iv.covered(work_lo, work_hi, np.array([a]), np.array([b]))[0]) if b > a else 0.0
            for a, b in zip(room_lo.tolist(), room_hi.tolist())]


def _kernels_launched(model: TraceModel, m: Metrics, room_lo: np.ndarray, room_hi: np.ndarray) -> list[float]:
    """A GPU job: the compute kernels launched inside each window, their union on the GPU."""
    la = m.launches
    if la.empty:
        return [0.0] * len(room_lo)
    compute = ~name_mask(la["gpu_name"], is_comm)
    launch_ts = la["launch_ts"].to_numpy(dtype=float)
    g_ts = la["gpu_ts"].to_numpy(dtype=float)
    g_end = g_ts + la["gpu_us"].to_numpy(dtype=float)
    out = []
    for a, b in zip(room_lo.tolist(), room_hi.tolist()):
        pick = compute & (launch_ts >= a) & (launch_ts < b) if b > a else np.zeros(len(la), dtype=bool)
        out.append(float(iv.total(*iv.union(g_ts[pick], g_end[pick]))) if pick.any() else 0.0)
    return out

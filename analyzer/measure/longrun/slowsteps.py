"""Steps of one trace that took far longer than the others, and what their extra time went to: the name a
periodic stall gets from the window that recorded one (an evaluation, data loading, a sync, work outside
any recorded op such as a checkpoint written to disk or logging).

A step is slow when it takes at least `SLOW_X` times the median of the trace's other steps and `SLOW_MIN_US`
more. Its extra time is split, each part against the median of the other steps: DataLoader waits, sync
waits, device→host copies, the CPU time outside any recorded op, and the top-level ops by name (ops not
nested in another op on the training thread). The forward and backward ops it ran beyond the others say
whether the extra work was an evaluation: model forward ops (`aten::linear`, convolutions, matmuls,
attention) with no backward to go with them. Steps left out of the figures as one-time costs are
examined too (a stall is often the slowest step of its window).
"""

from __future__ import annotations

import re

import numpy as np

from gpuadvise.analyzer.model.calls import STEP

SLOW_X = 2.0
SLOW_MIN_US = 1_000.0
SHARE = 0.5  # a part that holds this share of the extra time names it
CHECKPOINT_BYTES = 50e6  # device→host copies this large in one step: tensors saved to host memory
FORWARD = re.compile(r"^aten::(linear|conv[123]d|conv_transpose[123]d|matmul|bmm|einsum|scaled_dot_product_attention)$")
BACKWARD = re.compile(r"^autograd::engine::evaluate_function:")
TOP_OPS = 5


def slow_steps(model, metrics) -> list[dict]:
    steps = sorted(list(metrics.steps) + list(metrics.left_out_steps), key=lambda s: s.number)
    if len(steps) < 2:
        return []
    durs = np.array([s.dur for s in steps], dtype=float)
    out = []
    for i, step in enumerate(steps):
        base = float(np.median(np.delete(durs, i)))
        if durs[i] >= SLOW_X * base and durs[i] - base >= SLOW_MIN_US:
            out.append(_explain(model, metrics, step, [s for s in steps if s is not step], base))
    return out


def _explain(model, m, step, others, base_us: float) -> dict:
    mine = _profile(model, m, step)
    theirs = [_profile(model, m, s) for s in others]

    def extra(key):
        return mine[key] - float(np.median([t[key] for t in theirs]))

    excess = step.dur - base_us
    parts = {"dataloader": extra("dataloader_us"), "sync": extra("sync_us"), "outside_ops": extra("untraced_us")}
    names = set(mine["ops"]) | {n for t in theirs for n in t["ops"]}
    grew = sorted(((n, mine["ops"].get(n, (0.0, 0))[0] - float(np.median([t["ops"].get(n, (0.0, 0))[0] for t in theirs])),
                    mine["ops"].get(n, (0.0, 0))[1], float(np.median([t["ops"].get(n, (0.0, 0))[1] for t in theirs])))
                   for n in names), key=lambda r: -r[1])
    forward, backward = extra("forward"), extra("backward")
    dtoh = extra("dtoh_bytes")
    kind, what = _name(excess, parts, forward, backward, dtoh, grew)
    return {
        "step": step.number, "ms": round(step.dur / 1e3, 3), "others_ms": round(base_us / 1e3, 3),
        "excess_ms": round(excess / 1e3, 3), "kind": kind, "what": what,
        "forward_ops_extra": round(forward, 1), "backward_ops_extra": round(backward, 1),
        "parts_ms": {k: round(v / 1e3, 3) for k, v in parts.items()}, "dtoh_mb_extra": round(dtoh / 1e6, 1),
        "top_ops": [{"name": n, "extra_ms": round(us / 1e3, 3), "calls": c, "others_calls": oc}
                    for n, us, c, oc in grew[:TOP_OPS] if us > 0],
    }


def _name(excess, parts, forward, backward, dtoh, grew) -> tuple[str, str]:
    if excess <= 0:
        return "unknown", "nothing in the trace explains it"
    if parts["dataloader"] >= SHARE * excess:
        return "data loading", (f"waiting for the DataLoader ({parts['dataloader'] / 1e3:.1f} ms more than a usual step: "
                                "a new epoch's first batch waits for its workers to start)")
    if forward >= 2 and backward < 0.5 * forward:
        ops = sum(us for _, us, _, _ in grew if us > 0)
        if ops >= 0.4 * excess:
            return "evaluation", (f"an evaluation: {forward:.0f} more model forward ops than a usual step and no "
                                  f"backward to go with them ({ops / 1e3:.1f} ms in ops)")
    if dtoh >= CHECKPOINT_BYTES:
        return "checkpoint", f"a checkpoint save: {dtoh / 1e6:.0f} MB more copied from the GPU to host memory"
    if parts["sync"] >= SHARE * excess:
        return "sync", f"waiting for the GPU in a sync ({parts['sync'] / 1e3:.1f} ms more than a usual step)"
    if parts["outside_ops"] >= SHARE * excess:
        return "outside ops", (f"CPU time outside any recorded op ({parts['outside_ops'] / 1e3:.1f} ms more than a usual "
                               "step): Python or I/O such as a checkpoint written to disk, logging or metrics")
    top = [f"{n} (+{us / 1e3:.1f} ms)" for n, us, _, _ in grew[:3] if us > 0]
    return "ops", "more time in " + (", ".join(top) if top else "its ops")


def _profile(model, m, step) -> dict:
    """One step's figures on its CPU span: time per top-level op name, time outside them, forward and
    backward op counts, DataLoader and sync waits, device→host bytes."""
    lo, hi = step.start, step.end
    cpu = model.cpu
    out = {"ops": {}, "untraced_us": 0.0, "forward": 0.0, "backward": 0.0, "dataloader_us": 0.0, "sync_us": 0.0,
           "dtoh_bytes": 0.0}
    if len(cpu):
        inside = cpu[(cpu["ts"].to_numpy() >= lo) & (cpu["ts"].to_numpy() < hi)]
        names = inside["name"].astype(str).to_numpy()
        marks = np.array([STEP.match(n) is not None for n in names], dtype=bool)
        tid = _step_thread(cpu, step.number)
        main = inside[(~marks) & ((inside["tid"].to_numpy() == tid) if tid is not None else True)]
        out["forward"] = float(sum(1 for n in names if FORWARD.match(n)))
        out["backward"] = float(sum(1 for n in names if BACKWARD.match(n)))
        if len(main):
            order = np.argsort(main["ts"].to_numpy(), kind="stable")
            ts, end = main["ts"].to_numpy()[order], np.minimum(main["end"].to_numpy()[order], hi)
            top = ts >= np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
            top_names = main["name"].astype(str).to_numpy()[order][top]
            dur = (end - ts)[top]
            for n, d in zip(top_names, dur):
                total, calls = out["ops"].get(n, (0.0, 0))
                out["ops"][n] = (total + float(d), calls + 1)
            out["untraced_us"] = max(0.0, (hi - lo) - float(dur.sum()))
        else:
            out["untraced_us"] = hi - lo
    dl = m.dataloader
    if len(dl):
        out["dataloader_us"] = float(dl.loc[(dl["ts"] >= lo) & (dl["ts"] < hi), "dur"].sum())
    sy = m.syncs
    if len(sy):
        sel = (sy["ts"] >= lo) & (sy["ts"] < hi) & ~sy["profiler_sync"].astype(bool)
        out["sync_us"] = float(sy.loc[sel, "dur"].sum())
    cp = m.copies
    if len(cp):
        out["dtoh_bytes"] = float(np.nansum(cp.loc[(cp["step"] == step.number) & (cp["direction"] == "DtoH"), "bytes"]))
    return out


def _step_thread(cpu, number: int):
    rows = cpu[cpu["name"].astype(str) == f"ProfilerStep#{number}"]
    return int(rows["tid"].iloc[0]) if len(rows) else None

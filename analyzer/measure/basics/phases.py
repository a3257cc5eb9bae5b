"""Framework phases in the window: evaluation and checkpoint saving that a training framework runs
between two of its optimizer steps (`gpuadvise profile` marks them with "gpuadvise: evaluation" /
"gpuadvise: checkpoint" annotations, analyzer/model/calls.py PHASE_PREFIX).

A step that holds one is no ordinary training step: its time is the evaluation loop's, its DataLoader
waits are the evaluation loader's. Such steps are left out of every figure, as steps holding a one-time
cost are (warmup.py), and the header says why; when every step holds one, the phases' time is cut out of
the figures instead.
"""

from __future__ import annotations

import numpy as np

from gpuadvise.analyzer.model.calls import PHASE_PREFIX

from . import intervals as iv
from .spans import annotation_spans

MIN_SHARE = 0.01  # a phase that takes under 1 % of a step (a checkpoint call with nothing to save) changes nothing
REASON = "the framework's "  # how a left-out step's reason starts when a phase put it there


def is_phase(reason: str) -> bool:
    """Whether a left-out step's reason (`Metrics.left_out`) is a framework phase, not a one-time cost."""
    return reason.startswith(REASON)


def phase_spans(model) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each phase kind → its merged time ranges."""
    spans = annotation_spans(model, PHASE_PREFIX)
    out = {}
    for kind, g in spans.groupby("name", observed=True) if len(spans) else ():
        out[str(kind)[len(PHASE_PREFIX):]] = iv.union(g["ts"].to_numpy(), g["end"].to_numpy())
    return out


def apply(plan, model, steps) -> None:
    """Add the steps that hold a framework phase to `plan.left_out` (with the reason), or, when no step
    would remain, the phases' time ranges to `plan.cut`."""
    phases = phase_spans(model)
    if not phases:
        return
    reasons: dict[int, str] = {}
    for st in steps:
        lo, hi = min(st.start, st.window[0]), max(st.end, st.window[1])
        held = [(kind, float(iv.covered(s, e, [lo], [hi])[0])) for kind, (s, e) in phases.items()]
        held = [(kind, us) for kind, us in held if st.dur > 0 and us >= MIN_SHARE * st.dur]
        if held:
            reasons[st.number] = "; ".join(f"{REASON}{kind} ran in it ({us / 1e3:.0f} ms of its "
                                           f"{st.dur / 1e3:.0f} ms): not a training step" for kind, us in held)
    left = {**plan.left_out, **reasons}
    if len(left) < len(steps):
        plan.left_out = left
        return
    starts = np.concatenate([s for s, _ in phases.values()])
    ends = np.concatenate([e for _, e in phases.values()])
    if plan.cut is not None:
        starts, ends = np.concatenate([starts, plan.cut[0]]), np.concatenate([ends, plan.cut[1]])
    plan.cut = iv.union(starts, ends)

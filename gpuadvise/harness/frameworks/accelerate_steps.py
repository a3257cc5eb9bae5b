"""Accelerate under a profiling session (a hand-written loop on `accelerator.prepare(...)`, started with
`python` or `accelerate launch`): the optimizer Accelerate wraps marks the steps, and its settings go
into run.json.

`AcceleratedOptimizer.step()` is called for every micro-batch; it steps the real optimizer only when
gradients sync (the last micro-batch of a gradient-accumulation step), and under fp16 a grad scaler may
skip even that. The step is the iteration either way: a boundary after each call made with gradients
synced, whether or not the update ran. `prepare()` with an optimizer hands the loop to Accelerate; its
prefetching DataLoader asks for a batch ahead, so only the first batch starts a step, as the first batch
of a hand-written loop does. Inside transformers' Trainer (which prepares through Accelerate) the
Trainer's steps win (loop.PRIORITY).
"""

from __future__ import annotations

import functools
import sys

from . import loop


def settings(accelerator) -> dict:
    out = {}
    for key in ("mixed_precision", "gradient_accumulation_steps", "distributed_type", "num_processes", "device"):
        try:
            out[key] = getattr(accelerator, key)
        except Exception:
            continue
    return out


def attach(module) -> None:
    if not loop.attach_once("accelerate"):
        return
    import accelerate
    from accelerate.optimizer import AcceleratedOptimizer

    accelerator = module.Accelerator
    original_prepare = accelerator.prepare

    @functools.wraps(original_prepare)
    def prepare(self, *args, **kwargs):
        result = original_prepare(self, *args, **kwargs)
        try:
            prepared = result if isinstance(result, tuple) else (result,)
            if any(isinstance(r, AcceleratedOptimizer) for r in prepared):
                loop.started("accelerate", accelerate.__version__, "Accelerator.prepare()", settings(self),
                                   frame=sys._getframe(1), first_batch_starts=True)
        except Exception:
            pass
        return result

    original_step = AcceleratedOptimizer.step

    @functools.wraps(original_step)
    def step(self, *args, **kwargs):
        out = original_step(self, *args, **kwargs)
        try:
            if self.gradient_state.sync_gradients:
                loop.step("accelerate")
        except Exception:
            pass
        return out

    loop.patch(accelerator, "prepare", prepare)
    loop.patch(AcceleratedOptimizer, "step", step)

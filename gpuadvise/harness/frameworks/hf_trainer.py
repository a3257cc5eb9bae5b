"""transformers' `Trainer` under a profiling session: its optimizer steps are the steps, its
`TrainingArguments` go into run.json, and its evaluation and checkpoints are marked as such.

Attached when the script imports `transformers.trainer` (importwatch.py): every `Trainer.train()` from
then on runs with a `StepCallback` (unless the user added gpuadvise's own callback, which is one), and
`Trainer.evaluate` / `Trainer._save_checkpoint` run as `Phase("evaluation")` / `Phase("checkpoint")`.

The Trainer calls `on_train_begin` before its first batch and `on_step_end` after each optimizer step
(after all of a step's gradient-accumulation micro-batches; also when a grad scaler skipped the update),
then logs, evaluates and saves: so step k+1 holds whatever ran after step k's update, and its
evaluation is marked.
"""

from __future__ import annotations

import functools
import sys

import transformers
from transformers import TrainerCallback

from . import loop

# The TrainingArguments that decide how fast a step is (run.json `framework.settings`, as the Trainer
# reports them: `dataloader_pin_memory` is already False there on a CPU run).
SETTINGS = ("dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
            "dataloader_prefetch_factor", "per_device_train_batch_size", "gradient_accumulation_steps", "bf16",
            "fp16", "tf32", "torch_compile", "torch_compile_backend", "torch_compile_mode", "gradient_checkpointing",
            "optim", "max_grad_norm", "eval_strategy", "eval_steps", "save_strategy", "save_steps", "logging_steps",
            "use_cpu", "parallel_mode", "world_size")
ACCELERATE_STATE = {"mixed_precision": "_mixed_precision", "distributed_type": "distributed_type",
                    "num_processes": "num_processes"}  # what run.json calls it: where AcceleratorState keeps it


class StepCallback(TrainerCallback):
    """Marks the Trainer's steps for the running session (does nothing without one)."""

    def on_train_begin(self, args, state, control, **kwargs):
        loop.started("transformers", transformers.__version__, "Trainer.train()", training_arguments(args),
                           frame=sys._getframe(1))
        loop.record("accelerate", accelerate_state())
        loop.loader_built(kwargs.get("train_dataloader"), "transformers", sys._getframe(1))
        loop.step("transformers")  # the first step starts here, as a hand-written loop's first batch would

    def on_step_end(self, args, state, control, **kwargs):
        loop.step("transformers")


def training_arguments(args) -> dict:
    return {k: getattr(args, k) for k in SETTINGS if hasattr(args, k)}


def accelerate_state() -> dict:
    """Accelerate's state the Trainer runs on (mixed precision, distribution), without creating it."""
    try:
        import accelerate
        from accelerate.state import AcceleratorState

        shared = AcceleratorState._shared_state
        if not shared:
            return {}
        return {"version": accelerate.__version__, **{k: shared.get(v) for k, v in ACCELERATE_STATE.items() if v in shared}}
    except Exception:
        return {}


def attach(module) -> None:
    """Patch the Trainer class the script imported (once per session)."""
    if not loop.attach_once("transformers"):
        return
    trainer = module.Trainer
    original_train = trainer.train

    @functools.wraps(original_train)
    def train(self, *args, **kwargs):
        # at train(), not at construction: a Trainer built before the session started is marked too
        try:
            if not any(isinstance(cb, StepCallback) for cb in self.callback_handler.callbacks):
                self.add_callback(StepCallback())
        except Exception:
            pass
        return original_train(self, *args, **kwargs)

    loop.patch(trainer, "train", train)
    for name, kind in (("evaluate", "evaluation"), ("_save_checkpoint", "checkpoint")):
        method = trainer.__dict__.get(name)
        if method is not None and not hasattr(method, "__gpuadvise_phase__"):
            loop.patch(trainer, name, loop.in_phase(kind, method))

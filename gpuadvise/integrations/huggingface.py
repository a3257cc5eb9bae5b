"""`GpuadviseCallback` for transformers' `Trainer`:

    from gpuadvise.integrations.huggingface import GpuadviseCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[GpuadviseCallback("runs/hf")])

It profiles a window of the Trainer's optimizer steps as `gpuadvise profile` would (`wait`, `warmup`,
`active` and the other options are profile's), writes the same run folder, with the Trainer's
`TrainingArguments` in run.json's `framework`, and prints the run folder and the top findings when
training ends (`summary=False`: the folder only). `log_findings=True` also sends the top findings to
transformers' logger. Under `gpuadvise profile` it only marks the steps.
"""

from __future__ import annotations

try:
    import transformers
    from gpuadvise.harness.frameworks.hf_trainer import StepCallback
except ImportError as exc:  # pragma: no cover - exercised in a process without transformers
    raise ImportError("gpuadvise.integrations.huggingface needs transformers: pip install 'gpuadvise[hf]'") from exc

from .callback_capture import CallbackCapture

__all__ = ["GpuadviseCallback"]


class GpuadviseCallback(StepCallback):
    def __init__(self, out=None, *, wait: int = 10, warmup: int = 2, active: int = 3, force: bool = False,
                 record_shapes: bool = False, with_stack: bool = False, memory_history: bool = True,
                 loader_probe: bool = True, stop_after_capture: bool = False, summary: bool = True,
                 log_findings: bool = False):
        self.session = CallbackCapture("GpuadviseCallback(transformers)", out, dict(
            wait=wait, warmup=warmup, active=active, force=force, record_shapes=record_shapes, with_stack=with_stack,
            memory_history=memory_history, loader_probe=loader_probe), summary=summary or log_findings)
        self.stop_after_capture = stop_after_capture
        self.log_findings = log_findings

    def on_train_begin(self, args, state, control, **kwargs):
        self.session.start()
        super().on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if self.stop_after_capture and self.session.complete():
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        self.session.finish()
        if self.log_findings:
            logger = transformers.utils.logging.get_logger("gpuadvise")
            for line in self.session.top_findings():
                logger.warning(line)

    @property
    def path(self):
        """The run folder (None until training starts, when no `out` was given)."""
        return self.session.path

"""`GpuadviseCallback` for Lightning's `Trainer`:

    from gpuadvise.integrations.lightning import GpuadviseCallback
    trainer = L.Trainer(max_steps=1000, callbacks=[GpuadviseCallback("runs/lit")])

It profiles a window of the Trainer's optimizer steps as `gpuadvise profile` would (`wait`, `warmup`,
`active` and the other options are profile's), writes the same run folder, with the Trainer's precision,
gradient accumulation, strategy and DataLoader workers in run.json's `framework`, and prints the run folder
and the top findings when training ends (`summary=False`: the folder only). `log_findings=True` also
logs each top finding's predicted saving to the Trainer's logger (`gpuadvise/<topic>_saving_pct`) and its
text through Lightning's console log. Under `gpuadvise profile` it only marks the steps.
"""

from __future__ import annotations

try:
    try:
        import lightning.pytorch  # noqa: F401 - the package the callback's base class comes from
        _PACKAGE = "lightning.pytorch"
    except ImportError:
        import pytorch_lightning  # noqa: F401 - Lightning's older package name
        _PACKAGE = "pytorch_lightning"
    from gpuadvise.harness.frameworks.lightning_trainer import step_callback_class
except ImportError as exc:  # pragma: no cover - exercised in a process without lightning
    raise ImportError("gpuadvise.integrations.lightning needs Lightning: pip install 'gpuadvise[lightning]'") from exc

from .callback_capture import CallbackCapture

__all__ = ["GpuadviseCallback"]


class GpuadviseCallback(step_callback_class(_PACKAGE)):
    def __init__(self, out=None, *, wait: int = 10, warmup: int = 2, active: int = 3, force: bool = False,
                 record_shapes: bool = False, with_stack: bool = False, memory_history: bool = True,
                 loader_probe: bool = True, stop_after_capture: bool = False, summary: bool = True,
                 log_findings: bool = False):
        super().__init__()
        self.session = CallbackCapture("GpuadviseCallback(lightning)", out, dict(
            wait=wait, warmup=warmup, active=active, force=force, record_shapes=record_shapes, with_stack=with_stack,
            memory_history=memory_history, loader_probe=loader_probe), summary=summary or log_findings)
        self.stop_after_capture = stop_after_capture
        self.log_findings = log_findings

    def on_fit_start(self, trainer, pl_module):
        self.session.start()
        super().on_fit_start(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.stop_after_capture and self.session.complete():
            trainer.should_stop = True

    def on_fit_end(self, trainer, pl_module):
        self.session.finish()
        if self.log_findings:
            self._log(trainer)

    def on_exception(self, trainer, pl_module, exception):
        self.session.finish(failed=True)

    def _log(self, trainer) -> None:
        import importlib

        info = importlib.import_module(_PACKAGE + ".utilities").rank_zero_info
        for line in self.session.top_findings():
            info(line)
        if trainer.logger is not None and self.session.reports:
            from gpuadvise.analyzer.model.report import all_findings

            trainer.logger.log_metrics({f"gpuadvise/{f.topic}_saving_pct": f.impact.est_step_saving_pct
                                        for f in all_findings(self.session.reports)[:3]}, step=trainer.global_step)

    @property
    def path(self):
        """The run folder (None until training starts, when no `out` was given)."""
        return self.session.path

"""Where step boundaries come from, with no change to the user's code.

In order of precedence:
- `gpuadvise.step()`: once called, the only signal;
- a training framework's own step, once the framework runs the loop (frameworks/loop.py: transformers'
  Trainer, Lightning's Trainer, Accelerate): its optimizer step after gradient accumulation, counted even
  when a grad scaler skipped the update; the sources below are then ignored (an evaluation loop's
  batches and accumulation micro-batches are no steps);
- a global optimizer-step hook (after every `optimizer.step()`);
- the DataLoader iterator (each batch), until the first optimizer step is seen;
- fallbacks for loops none of those see: CUDA graph replays (`CUDAGraph.replay()`) and autograd
  backward calls (`loss.backward()`). A fallback takes over once it fires twice with no step from
  the sources above ever seen (backward() 64 times once an optimizer exists: gradient accumulation runs
  several backward passes before the first optimizer step, and that step will come), or, after they were seen, once they have been silent for three of
  their usual steps while the fallback kept firing more than twice as often as it ever did inside one
  of their steps (a loop that ends in graph replays after a few eager warm-up steps; gradient
  accumulation's several backward() per optimizer step never takes over, however slow one step is). Any of the sources above takes back over when it fires again.

Kept apart from the session because it only decides *that* a step ended and which source said so; what
a boundary does (time it, step the profiler, write files) is the session's business (`on_step`).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import deque

from ..facts import general
from ..windows.window import cuda

# source key → what run.json's capture.step_source and the messages call it
SOURCES = {
    "manual": "gpuadvise.step()",
    "optimizer": "optimizer.step()",
    "dataloader": "DataLoader batch",
    "cuda_graph": "CUDA graph replay",
    "backward": "backward()",
    # a framework's step (frameworks/loop.py), keyed by the framework
    "transformers": "transformers Trainer step",
    "lightning": "Lightning Trainer step",
    "accelerate": "Accelerate optimizer step",
}
FALLBACKS = ("cuda_graph", "backward")
BACKWARD_BEFORE_OPTIMIZER = 64  # backward() calls before an existing optimizer's first step that make them the steps


class StepSources:
    """Calls `on_step(source)` at each step boundary the precedence above accepts."""

    def __init__(self, on_step):
        self.on_step = on_step
        self.torch = None
        self.mode = "auto"  # "auto" (the precedence above), "framework" (one runs the loop) or "manual"
        self.framework: str | None = None  # the framework whose steps are the steps
        self._first_batch_starts = False  # the framework's first step starts at its first batch
        self.optimizer_steps = 0
        self.fallback = None  # the fallback source driving the steps, if any
        self._fallback_count = {s: 0 for s in FALLBACKS}
        self._primary_resumed: int | None = None  # when the user's code last resumed after a main-source step
        self._primary_steps_ns: deque = deque(maxlen=16)  # the last steps from the main sources, our work excluded
        # the most fallback calls seen inside one main-source step (gradient accumulation: several
        # backward() per optimizer step); a fallback needs well over that before it may take over
        self._fallback_per_step = dict.fromkeys(FALLBACKS, 0)
        self.optimizer_built = False  # an optimizer exists: its step will mark the steps

    def install(self, torch) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.torch = torch
        register_optimizer_step_post_hook(self._after_optimizer_step)
        self._hook_optimizer_init(torch)
        self._hook_dataloader()
        self._hook_fallbacks(torch)

    def manual(self) -> None:
        self.mode = "manual"
        self.on_step("manual")

    def claim(self, framework: str, first_batch_starts: bool = False) -> None:
        """Framework `framework` runs the loop from now on: only its steps count (gpuadvise.step() still wins)."""
        if self.mode == "manual":
            return
        self.mode, self.framework, self._first_batch_starts = "framework", framework, first_batch_starts
        self.fallback = None

    def framework_step(self, framework: str) -> None:
        if self.mode != "framework" or framework != self.framework:
            return
        self._first_batch_starts = False
        self.on_step(framework)

    def note(self) -> str:
        """A note for the capture message when a fallback marked the steps."""
        if self.fallback is None:
            return ""
        return (f" (steps marked by {SOURCES[self.fallback]} calls: no optimizer.step() or DataLoader batch "
                "was seen; call gpuadvise.step() once per iteration to mark the steps yourself)")

    # -- the hooks ---------------------------------------------------------------------------------
    def _after_optimizer_step(self, opt, args, kwargs) -> None:
        try:
            general.record_optimizer(opt)
        except Exception:
            pass
        self.optimizer_steps += 1
        if self.mode == "auto":
            self._primary("optimizer")

    def _hook_optimizer_init(self, torch) -> None:
        sources = self
        original = torch.optim.Optimizer.__init__

        @functools.wraps(original)
        def __init__(opt, *args, **kwargs):
            sources.optimizer_built = True
            return original(opt, *args, **kwargs)

        torch.optim.Optimizer.__init__ = __init__

    def _hook_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl

        original = dl._BaseDataLoaderIter.__next__
        sources = self

        def __next__(it):
            sources.batch()
            try:
                general.batch_taken(it)  # after the boundary the batch may start: counted in the step it feeds
            except Exception:
                pass
            return original(it)

        dl._BaseDataLoaderIter.__next__ = __next__

    def batch(self) -> None:
        """A DataLoader batch is asked for."""
        # Without an optimizer (inference, custom update rules) each batch starts a step.
        if self.mode == "auto" and self.optimizer_steps == 0:
            self._primary("dataloader")
        elif self.mode == "framework" and self._first_batch_starts:  # the framework's first step starts here
            self.framework_step(self.framework)

    def _hook_fallbacks(self, torch) -> None:
        sources = self
        original_backward = torch.autograd.backward

        @functools.wraps(original_backward)
        def backward(*args, **kwargs):
            sources._fallback_event("backward")
            return original_backward(*args, **kwargs)

        torch.autograd.backward = backward  # Tensor.backward() calls torch.autograd.backward
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        original_replay = getattr(graph_cls, "replay", None)
        if cuda(torch) and original_replay is not None:
            @functools.wraps(original_replay)
            def replay(graph, *args, **kwargs):
                sources._fallback_event("cuda_graph")
                return original_replay(graph, *args, **kwargs)

            graph_cls.replay = replay

    # -- precedence --------------------------------------------------------------------------------
    def _primary(self, source: str) -> None:
        now = time.perf_counter_ns()
        if self._primary_resumed is not None:  # the user's own time for that step, our work excluded
            self._primary_steps_ns.append(now - self._primary_resumed)
            for src, n in self._fallback_count.items():
                self._fallback_per_step[src] = max(self._fallback_per_step[src], n)
        self._fallback_count = dict.fromkeys(self._fallback_count, 0)
        self.fallback = None  # a main source that fires again takes back over
        try:
            self.on_step(source)
        finally:  # silence is counted from when the user's code resumes: our work (an export) is none
            self._primary_resumed = time.perf_counter_ns()

    def _fallback_event(self, source: str) -> None:
        if self.mode != "auto":
            return
        try:
            compiling = getattr(getattr(self.torch, "compiler", None), "is_compiling", None)
            if compiling is not None and compiling():  # inside a graph torch.compile is tracing: not a step
                return
            if self.fallback is None:
                self._fallback_count[source] += 1
                if not self._fallback_takes_over(source):
                    return
                self.fallback = source
            elif self.fallback != source:
                return
        except Exception:
            return
        self.on_step(source)

    def _fallback_takes_over(self, source: str) -> bool:
        n = self._fallback_count[source]
        if self._primary_resumed is None:  # no optimizer step or batch ever: the fallback is all there is
            return n >= (BACKWARD_BEFORE_OPTIMIZER if source == "backward" and self.optimizer_built else 2)
        if n < max(3, 2 * self._fallback_per_step[source] + 1) or not self._primary_steps_ns:
            return False  # a count, not only a time: a slow step on a loaded machine is no silence
        usual = statistics.median(self._primary_steps_ns)
        return time.perf_counter_ns() - self._primary_resumed > 3 * usual


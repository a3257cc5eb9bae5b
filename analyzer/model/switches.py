"""The switch a user turns to change a setting, in the framework their run used: advice says "set
`dataloader_num_workers=4` in `TrainingArguments`" to a transformers Trainer user, "pass `num_workers=4`
to the `DataLoader` your `train_dataloader()` returns" to a Lightning user, and the torch call otherwise.

Each function takes the run's `FrameworkFact` (None: a hand-written loop) and returns one phrase that
starts with a verb, for a sentence of the rule's own. `already(...)` says whether the framework's own
setting is on already, so that advice never asks for what the run had (the framework's word for it
wins over a DataLoader it may have built differently on this device).
"""

from __future__ import annotations

from .runfacts import DataLoaderFact, FrameworkFact

TRAINING_ARGUMENTS = "`TrainingArguments`"


def sentence(phrase: str) -> str:
    """A phrase from here as the start of a sentence."""
    return phrase[:1].upper() + phrase[1:]


def _hf(fw: FrameworkFact | None) -> bool:
    return fw is not None and fw.name == "transformers"


def _lightning(fw: FrameworkFact | None) -> bool:
    return fw is not None and fw.name == "lightning"


def _loader_site(loader: DataLoaderFact | None) -> str:
    if loader is None or loader.created_at == "?":
        return ""
    return f" at {loader.created_at}" + (f", in your `{loader.in_function}()`" if loader.in_function not in (None, "", "<module>") else "")


def num_workers(fw: FrameworkFact | None, n: int | None, loader: DataLoaderFact | None = None) -> str:
    """`n` None: no number to give (more workers, how many unmeasured)."""
    if _hf(fw):
        return (f"set `dataloader_num_workers={n}` in {TRAINING_ARGUMENTS}" if n is not None
                else f"raise `dataloader_num_workers` in {TRAINING_ARGUMENTS}")
    if _lightning(fw):
        value = f"`num_workers={n}`" if n is not None else "`num_workers` (more than 0)"
        return f"pass {value} to the `DataLoader`{_loader_site(loader) or ' your `train_dataloader()` returns'}"
    return f"use num_workers={n}" if n is not None else "give it worker processes"


def loader_origin(fw: FrameworkFact | None, loader: DataLoaderFact) -> str:
    """"created at train.py:12", or "built by transformers' Trainer (train.py:41 `trainer.train()`)"."""
    if not loader.built_by:
        return f"created at {loader.where}"
    by = fw.label if fw is not None and fw.name == loader.built_by else loader.built_by
    return f"built by {by} ({loader.created_at}" + (f" `{loader.call}`" if loader.call else "") + ")"


def pin_memory(fw: FrameworkFact | None, loader: DataLoaderFact | None = None) -> str:
    if _hf(fw):
        return f"set `dataloader_pin_memory=True` in {TRAINING_ARGUMENTS}"
    return "pass `pin_memory=True` to the `DataLoader`" + _loader_site(loader)


def bf16(fw: FrameworkFact | None) -> str:
    if _hf(fw):
        return f"set `bf16=True` in {TRAINING_ARGUMENTS}"
    if _lightning(fw):
        return 'pass `precision="bf16-mixed"` to the `Trainer`'
    if fw is not None and fw.name == "accelerate":
        return 'pass `mixed_precision="bf16"` to `Accelerator(...)` (or `accelerate launch --mixed_precision bf16`)'
    return "run the forward pass under `torch.autocast('cuda', dtype=torch.bfloat16)`"


def tf32(fw: FrameworkFact | None) -> str:
    if _hf(fw):
        return f"set `tf32=True` in {TRAINING_ARGUMENTS}"
    return "call `torch.set_float32_matmul_precision('high')`" + (" before `trainer.fit(...)`" if _lightning(fw) else "")


def fused_optimizer(fw: FrameworkFact | None, opt: str) -> str:
    if _hf(fw):
        return f'set `optim="adamw_torch_fused"` in {TRAINING_ARGUMENTS}'
    where = " in your `configure_optimizers()`" if _lightning(fw) else ""
    return f"construct `{opt}` with `foreach=True` or, where available, `fused=True`{where}"


def compile_model(fw: FrameworkFact | None) -> str:
    if _hf(fw):
        return f"set `torch_compile=True` in {TRAINING_ARGUMENTS}"
    if _lightning(fw):
        return "compile the model before fitting (`model = torch.compile(model)`, then `trainer.fit(model)`)"
    if fw is not None and fw.name == "accelerate":
        return 'pass `dynamo_backend="inductor"` to `Accelerator(...)`'
    return "compile the model (`model = torch.compile(model)`)"


# the framework's own name for a setting, where it has one: knob → (framework, its setting)
_OWN = {"pin_memory": {"transformers": "dataloader_pin_memory"}, "bf16": {"transformers": "bf16"},
        "tf32": {"transformers": "tf32"}, "compile": {"transformers": "torch_compile"}}


def already(fw: FrameworkFact | None, knob: str) -> str | None:
    """The framework's own setting for `knob` when the run had it on ("`dataloader_pin_memory=True` in
    `TrainingArguments`"); None when it was off, not recorded, or the framework has no such setting."""
    if fw is None:
        return None
    name = _OWN.get(knob, {}).get(fw.name)
    if name is None:
        if knob == "bf16" and fw.name == "lightning" and str(fw.setting("precision") or "").startswith("bf16"):
            return f'`precision="{fw.setting("precision")}"` on the `Trainer`'
        return None
    return f"`{name}=True` in {TRAINING_ARGUMENTS}" if fw.setting(name) is True else None


# -- fixes built from what is off: `on` is the switches the input shows on (measure/settings/switches_on.py), by key --

def fewer_launches(fw: FrameworkFact | None, on) -> str:
    """The next step to cut kernel launches, as a sentence: compile when the model is not compiled (with the
    framework's own switch), CUDA graphs when it is, and more work per launch when both are on already."""
    if "compile" not in on:
        text = ("Cut the number of launches: fuse kernels with torch.compile, "
                + ("" if "cuda_graphs" in on else "replay the step as a CUDA graph, ") + "or batch more work per launch.")
        return text + (f" Under {fw.label}: {compile_model(fw)}." if fw is not None else "")
    if "cuda_graphs" not in on:
        how = (f'`torch_compile_mode="reduce-overhead"` in {TRAINING_ARGUMENTS}' if _hf(fw)
               else '`torch.compile(model, mode="reduce-overhead")`')
        return f"Cut the number of launches: replay each compiled step as a CUDA graph ({how}), or batch more work per launch."
    return "Cut the number of launches: give each launch more work (a larger batch, or fewer, larger layers)."


def launch_fix_lines(on, comment: str | None = None) -> list[str]:
    """Code lines (for a ```python block) that cut launches, from what is off; `comment` heads the compile
    line instead of its own trailing comment."""
    if "compile" not in on:
        lines = ([comment, "model = torch.compile(model)"] if comment else
                 ["model = torch.compile(model)                     # fuse small ops into fewer, larger kernels"])
        if "cuda_graphs" not in on and not comment:
            lines.append('# or: torch.compile(model, mode="reduce-overhead")  # also replays the step as a CUDA graph')
        return lines
    if "cuda_graphs" not in on:
        return ['model = torch.compile(model, mode="reduce-overhead")  # compiled already: replay each step as a CUDA graph']
    return []


def loader_line(on, batch: str = "bs") -> str | None:
    """A DataLoader construction with the input-pipeline switches that are off; None when all are on."""
    args = []
    if "workers" not in on:
        args.append("num_workers=8")
    if "pin_memory" not in on:
        args.append("pin_memory=True")
    if "workers" not in on:
        args.append("persistent_workers=True")
    return f"loader = DataLoader(ds, batch_size={batch}, {', '.join(args)})" if args else None

"""The framework support's parts, without starting a framework: step precedence once a framework runs the
loop, where a framework-built object is placed, the import watcher, run.json's `framework` read back,
phases left out of the figures, advice in the framework's own terms, and the callbacks' import error.
The end-to-end runs with the real frameworks are in test_frameworks_e2e.py."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from gpuadvise.analyzer.model import runfacts, switches
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import GEMM, TraceBuilder
from gpuadvise.fixtures.runjson import run_json
from gpuadvise.rules import find_rule

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"

HF = {"name": "transformers", "version": "5.24.0", "entry": "Trainer.train()", "called_at": "train.py:41",
      "call": "trainer.train()", "settings": {"dataloader_num_workers": 0, "dataloader_pin_memory": True, "bf16": False,
                                              "torch_compile": False, "gradient_accumulation_steps": 4},
      "accelerate": {"mixed_precision": "no"}, "phases": [{"kind": "evaluation", "step": 7, "window": "after", "ms": 40.0}]}
LIGHTNING = {"name": "lightning", "version": "2.6.6", "entry": "Trainer.fit()", "called_at": "train.py:60",
             "call": "trainer.fit(model)", "settings": {"precision": "bf16-mixed", "accumulate_grad_batches": 2}}
HF_LOADERS = [  # the Trainer's DataLoader, and the copy Accelerate's prepare() makes of it
    {"created_at": "train.py:41", "in_function": "<module>", "built_by": "transformers", "call": "trainer.train()",
     "num_workers": 0, "pin_memory": True, "batch_size": 8, "prefetch_factor": None, "persistent_workers": False},
    {"created_at": "train.py:41", "in_function": "<module>", "built_by": "transformers", "call": "trainer.train()",
     "num_workers": 0, "pin_memory": True, "batch_size": None, "prefetch_factor": None, "persistent_workers": False}]
LIGHTNING_LOADERS = [
    {"created_at": "model.py:30", "in_function": "val_dataloader", "num_workers": 0, "pin_memory": False,
     "batch_size": 8, "prefetch_factor": None, "persistent_workers": False},
    {"created_at": "model.py:27", "in_function": "train_dataloader", "num_workers": 0, "pin_memory": False,
     "batch_size": 8, "prefetch_factor": None, "persistent_workers": False}]


def _facts(framework: dict | None = None, loaders: list | None = None, **kw) -> dict:
    facts = run_json(**kw)
    if framework is not None:
        facts["framework"] = framework
    facts["dataloaders"] = list(loaders or [])
    return facts


def _finding(load_built, builder: TraceBuilder, facts: dict, topic: str):
    report = analyze_model(load_built(builder), facts)
    found = [f for f in report.findings if f.topic == topic]
    return found[0] if found else None


# -- steps: a framework's own step wins ------------------------------------------------------------------------
class _Session:
    """What frameworks/loop.py needs of a session: its step sources and the step count."""

    def __init__(self):
        from gpuadvise.harness.steps.sources import StepSources

        self.boundaries: list[str] = []
        self.sources = StepSources(self.boundaries.append)
        self.steps = 0

    def step_phase(self, k):
        return "wait"


@pytest.fixture
def session():
    from gpuadvise.harness.frameworks import loop
    from gpuadvise.harness.active import set_active

    s = _Session()
    set_active(s)
    loop.reset()
    yield s
    set_active(None)
    loop.reset()


def test_a_framework_step_replaces_the_other_sources(session):
    from gpuadvise.harness.frameworks import loop

    loop.started("lightning", "2.6.6", "Trainer.fit()", {"accumulate_grad_batches": 2})
    src = session.sources
    src._after_optimizer_step(object(), (), {})  # an optimizer step inside the framework's loop
    src._fallback_event("backward")
    src._fallback_event("backward")
    loop.step("lightning")
    assert session.boundaries == ["lightning"]
    src.manual()  # gpuadvise.step() still wins over everything
    loop.step("lightning")
    assert session.boundaries == ["lightning", "manual"]


def test_the_trainers_steps_win_over_the_accelerate_it_runs_on(session):
    from gpuadvise.harness.frameworks import loop

    # transformers' Trainer prepares its optimizer through Accelerate, then starts its own loop
    loop.started("accelerate", "1.15.0", "Accelerator.prepare()", {}, first_batch_starts=True)
    loop.started("transformers", "5.24.0", "Trainer.train()", {"gradient_accumulation_steps": 2})
    loop.step("accelerate")
    loop.step("transformers")
    loop.started("accelerate", "1.15.0", "Accelerator.prepare()", {})  # a later prepare() changes nothing
    loop.step("accelerate")
    assert session.boundaries == ["transformers"]
    assert loop.summary()["name"] == "transformers"


def test_accelerate_starts_its_first_step_at_the_first_batch(session):
    from gpuadvise.harness.frameworks import loop

    loop.started("accelerate", "1.15.0", "Accelerator.prepare()", {}, first_batch_starts=True)
    # Accelerate's loader asks for a batch ahead: only the first batch starts a step, as in a hand-written loop
    session.sources.batch()
    session.sources.batch()
    loop.step("accelerate")
    session.sources.batch()
    assert session.boundaries == ["accelerate", "accelerate"]


def test_without_a_framework_batches_start_steps_until_an_optimizer_steps(session):
    session.sources.batch()
    session.sources.batch()
    session.sources._after_optimizer_step(object(), (), {})
    session.sources.batch()
    assert session.boundaries == ["dataloader", "dataloader", "optimizer"]


def test_phases_are_recorded_with_their_step(session):
    from gpuadvise.harness.frameworks import loop

    loop.started("transformers", "5.24.0", "Trainer.train()", {})
    session.steps = 5
    with loop.Phase("evaluation"):
        pass
    loop.Phase("checkpoint").end()  # an end without a begin records nothing
    [phase] = loop.summary()["phases"]
    assert (phase["kind"], phase["step"], phase["window"]) == ("evaluation", 5, "wait") and phase["ms"] >= 0


def test_framework_facts_record_the_users_line(session):
    from gpuadvise.harness.frameworks import loop

    loop.started("lightning", "2.6.6", "Trainer.fit()", {"strategy": _Enum("ddp"), "devices": (0, 1)})
    fw = loop.summary()
    assert fw["called_at"].endswith(f"test_frameworks.py:{sys._getframe().f_lineno - 2}")
    assert fw["settings"] == {"strategy": "ddp", "devices": [0, 1]}  # as JSON holds them


class _Enum:
    def __init__(self, value):
        self.value = value


# -- objects a framework built, placed at the user's line ----------------------------------------------------------
@pytest.fixture
def fake_framework(tmp_path, monkeypatch):
    """An installed package `fakefw` whose `train()` builds an object for the user, and whose
    `wrapped_init(obj)` records an object the user builds, from a wrapper that holds it (as Lightning
    wraps `DataLoader.__init__`)."""
    site = tmp_path / "site-packages"  # model/frames.py: a frame in a site-packages folder is library code
    (site / "fakefw").mkdir(parents=True)
    (site / "fakefw" / "__init__.py").write_text(textwrap.dedent('''
        import sys
        from gpuadvise.harness.facts import general

        class Loader:
            def __init__(self):
                self.origin = general.built(self, sys._getframe(1))

        def train():
            return _make()

        def _make():
            return Loader()

        def wrapped_init(obj):
            obj.origin = general.built(obj, sys._getframe(0))
    '''))
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop("fakefw", None)
    yield importlib.import_module("fakefw")
    sys.modules.pop("fakefw", None)


def test_an_object_a_framework_built_is_placed_at_the_users_call(fake_framework):
    line = sys._getframe().f_lineno + 1
    made = fake_framework.train()
    o = made.origin
    assert o["built_by"] == "fakefw" and o["created_at"].endswith(f"test_frameworks.py:{line}")
    assert (o["call"], o["in_function"]) == ("made = fake_framework.train()", sys._getframe().f_code.co_name)


def test_a_wrapper_holding_the_object_builds_nothing(fake_framework):
    obj = type("Loader", (), {})()
    fake_framework.wrapped_init(obj)  # the user's own DataLoader, seen through a framework's __init__ wrapper
    assert "built_by" not in obj.origin and obj.origin["created_at"].endswith(f"test_frameworks.py:{sys._getframe().f_lineno - 1}")


# -- the import watcher -------------------------------------------------------------------------------------------
def test_a_watched_module_is_attached_after_the_scripts_import(tmp_path, monkeypatch):
    from gpuadvise.harness.frameworks import importwatch

    (tmp_path / "watchedfw.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    monkeypatch.setattr(importwatch, "WATCHED", {"watchedfw": lambda m: seen.append(m.VALUE)})
    sys.modules.pop("watchedfw", None)
    importwatch.install()
    try:
        assert "watchedfw" not in sys.modules  # installing imports nothing
        import watchedfw  # noqa: F401 - the script's own import
        assert seen == [42]
        assert not hasattr(sys.modules["watchedfw"].__loader__, "__dict__") or \
            "exec_module" not in vars(sys.modules["watchedfw"].__loader__)  # the loader is the module's own again
    finally:
        importwatch.uninstall()
        sys.modules.pop("watchedfw", None)
    assert not any(type(f).__name__ == "_Finder" for f in sys.meta_path)


def test_a_failing_attach_never_breaks_the_import(tmp_path, monkeypatch):
    from gpuadvise.harness.frameworks import importwatch

    (tmp_path / "brokenfw.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(importwatch, "WATCHED", {"brokenfw": lambda m: 1 / 0})
    monkeypatch.setattr(importwatch, "ERRORS", [])
    sys.modules.pop("brokenfw", None)
    importwatch.install()
    try:
        import brokenfw

        assert brokenfw.VALUE == 1 and importwatch.ERRORS == ["brokenfw: ZeroDivisionError: division by zero"]
    finally:
        importwatch.uninstall()
        sys.modules.pop("brokenfw", None)


# -- run.json's framework, read back -------------------------------------------------------------------------------
def test_framework_facts_read_as_written():
    fw = runfacts.framework({"framework": HF})
    assert (fw.name, fw.label, fw.called_at, fw.call) == ("transformers", "transformers' Trainer", "train.py:41", "trainer.train()")
    assert fw.setting("dataloader_num_workers") == 0 and fw.setting("missing") is None
    assert runfacts.framework_phases({"framework": HF}) == [{"kind": "evaluation", "step": 7, "window": "after", "ms": 40.0}]


@pytest.mark.parametrize("broken", [{"framework": []}, {"framework": {"name": 3}}, {"framework": {"phases": "x"}},
                                    {"framework": {"name": "transformers", "settings": [1], "phases": [{"kind": 1}]}}])
def test_a_hand_edited_framework_never_breaks_a_reader(broken):
    fw = runfacts.framework(broken)
    assert fw is None or (fw.settings == {} and fw.setting("bf16") is None)
    assert runfacts.framework_phases(broken) == []


def test_training_loaders_are_the_ones_that_feed_training():
    # the Trainer's loader and Accelerate's copy of it are one loader to the user
    [hf] = runfacts.training_loaders(_facts(HF, HF_LOADERS))
    assert hf.built_by == "transformers"
    # under Lightning, the validation loader is not what the training step waits for
    [train] = runfacts.training_loaders(_facts(LIGHTNING, LIGHTNING_LOADERS))
    assert train.in_function == "train_dataloader"
    assert len(runfacts.training_loaders(_facts(None, LIGHTNING_LOADERS))) == 2  # no framework: every loader counts


def test_the_loader_the_steps_iterate_stands_for_the_users_own_when_a_framework_rebuilt_it():
    """Where run.json counts the batches the recorded steps took, a loader they did not iterate does not feed
    training, but the user's own loader a framework copied (Accelerate's prepare, Lightning's distributed
    sampler: same settings, built by the framework) is the one the iterated copy stands for."""
    user = {"created_at": "train.py:12", "in_function": "<module>", "num_workers": 0, "pin_memory": False,
            "batch_size": 8, "prefetch_factor": None, "persistent_workers": False, "batches_in_window": 0}
    copy = dict(user, created_at="train.py:13", built_by="accelerate", call="accelerator.prepare(loader)",
                batch_size=None, batches_in_window=3)
    unused = dict(user, created_at="train.py:20", num_workers=4, pin_memory=True)  # built, never iterated
    [train] = runfacts.training_loaders(_facts(None, [user, unused, copy]))
    assert train.created_at == "train.py:12"
    [alone] = runfacts.training_loaders(_facts(None, [user, unused, dict(copy, built_by=None)]))
    assert alone.created_at == "train.py:13"  # the user's own second loader: the one they iterate


# -- advice in the framework's own terms -------------------------------------------------------------------------------
def _stall() -> TraceBuilder:
    return find_rule("dataloader-stall").positive()


def test_the_stall_names_the_trainers_switch(load_built):
    f = _finding(load_built, _stall(), _facts(HF, HF_LOADERS), "dataloader-stall")
    assert "raise `dataloader_num_workers` in `TrainingArguments`" in f.advice
    assert f.advice.count("The DataLoader built by transformers' Trainer (train.py:41 `trainer.train()`)") == 1
    assert f.evidence.sources[-1] == "train.py:41"


def test_the_stall_names_the_lightning_train_dataloader(load_built):
    f = _finding(load_built, _stall(), _facts(LIGHTNING, LIGHTNING_LOADERS), "dataloader-stall")
    assert "pass `num_workers` (more than 0) to the `DataLoader` at model.py:27, in your `train_dataloader()`" in f.advice
    assert "model.py:30" not in f.advice


def test_a_hand_written_loop_keeps_the_torch_words(load_built):
    f = _finding(load_built, _stall(), _facts(None, [dict(LIGHTNING_LOADERS[1], in_function="<module>")]), "dataloader-stall")
    assert f.advice.startswith("The loader runs in the training process (`num_workers=0`): give it worker processes.")
    assert "TrainingArguments" not in f.advice


@pytest.mark.parametrize("framework, kept, left_out", [
    (None, [], ["Trainer", "Lightning"]),
    (HF, ["Under transformers' Trainer the switch is `TrainingArguments(dataloader_num_workers=…,\n"
          "dataloader_pin_memory=True)`"], ["Lightning"]),
    (LIGHTNING, ["Under Lightning, the switch is the `DataLoader`"], ["Trainer", "TrainingArguments"]),
])
def test_a_fix_carries_only_the_paragraphs_of_the_framework_the_run_used(load_built, framework, kept, left_out):
    loaders = {None: [dict(LIGHTNING_LOADERS[1], in_function="<module>")], "transformers": HF_LOADERS,
               "lightning": LIGHTNING_LOADERS}[framework and framework["name"]]
    f = _finding(load_built, _stall(), _facts(framework, loaders), "dataloader-stall")
    assert "If workers are already in use and still stall" in f.fix  # the fix's own prose stays
    for text in kept:
        assert text in f.fix
    for word in left_out:
        assert word not in f.fix, f.fix


def test_lightnings_profiler_marks_show_the_framework_without_run_json(load_built):
    b = _stall()
    with b.op("[pl][profile][Strategy]SingleDeviceStrategy.training_step", cat="user_annotation"):
        b.idle(10)
    b.finish()
    f = _finding(load_built, b, {}, "dataloader-stall")
    assert "Under Lightning" in f.fix and "Trainer" not in f.fix


def test_measured_workers_advice_names_the_switch():
    from gpuadvise.rules.dataloader_stall import workers_advice

    plan = {"workers": 3, "workers_now": 0, "free_cores": 3, "keeps_up": 3}
    measured = {"fetch": "__getitem__"}
    hf = runfacts.framework({"framework": HF})
    assert workers_advice(measured, plan, hf).startswith("Set `dataloader_num_workers=3` in `TrainingArguments` (3 free")
    assert workers_advice(measured, plan).startswith("Use num_workers=3 (3 free")


def _multi_stall() -> TraceBuilder:
    """Workers that fall behind: the shortest wait (1.5 ms) is the hand-over of a ready batch, which
    pinned memory shortens and more workers do not."""
    b = TraceBuilder()
    for wait in (1_500, 6_000, 6_000, 6_000):
        with b.step():
            b.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", wait)
            for _ in range(10):
                b.kernel(GEMM, 300)
            b.sync()
    b.finish()
    return b


def test_pin_memory_is_never_asked_for_when_the_trainer_has_it_on(load_built):
    loaders = [dict(d, num_workers=2, pin_memory=False) for d in HF_LOADERS]  # built without pinning, on this device
    on = _finding(load_built, _multi_stall(), _facts(HF, loaders), "dataloader-stall")
    off = _finding(load_built, _multi_stall(), _facts(dict(HF, settings=dict(HF["settings"], dataloader_pin_memory=False)),
                                                      loaders), "dataloader-stall")
    assert on is not None and off is not None
    assert "pin" not in on.advice.split("hand-over of a ready batch")[-1]
    assert "set `dataloader_pin_memory=True` in `TrainingArguments`" in off.advice


def test_bf16_is_never_asked_for_when_the_run_had_it(load_built):
    rule = find_rule("no-tensor-cores")
    hf_bf16 = dict(HF, settings=dict(HF["settings"], bf16=True))
    asked = _finding(load_built, rule.positive(), _facts(HF), "no-tensor-cores")
    had = _finding(load_built, rule.positive(), _facts(hf_bf16), "no-tensor-cores")
    lightning = _finding(load_built, rule.positive(), _facts(dict(LIGHTNING, settings={"precision": "32-true"})), "no-tensor-cores")
    plain = _finding(load_built, rule.positive(), _facts(None), "no-tensor-cores")
    assert asked.advice.startswith("Set `bf16=True` in `TrainingArguments`")
    assert "set `tf32=True` in `TrainingArguments`" in asked.advice
    # set, and the trace shows it acting on some matmuls: these run outside the framework's autocast region
    acting = _finding(load_built, _some_matmuls_in_bf16(), _facts(hf_bf16), "no-tensor-cores")
    assert acting.advice.startswith("`bf16=True` in `TrainingArguments` is set, yet these matmuls ran in fp32: they "
                                    "run outside the autocast region the framework opens")
    assert "Set `bf16=True`" not in acting.advice
    # set, yet every matmul ran in fp32: the trace decides, and the advice names the conflict first
    assert had.advice.startswith("run.json records `bf16=True` in `TrainingArguments`, but the trace shows it did not "
                                 "act: all ")
    assert "They run outside the autocast region the framework opens" in had.advice
    assert "Set `bf16=True`" not in had.advice
    assert lightning.advice.startswith('Pass `precision="bf16-mixed"` to the `Trainer`')
    assert plain.advice.startswith("Run the forward pass under `torch.autocast('cuda', dtype=torch.bfloat16)`")


def _some_matmuls_in_bf16() -> TraceBuilder:
    """no-tensor-cores' loop with one bf16 Tensor Core GEMM a step beside its fp32 SIMT ones."""
    b = TraceBuilder(device="NVIDIA A100-SXM4-80GB", compute=(8, 0))
    for _ in range(4):
        with b.step():
            b.kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 200)
            for _ in range(20):
                b.kernel("ampere_sgemm_128x64_nn", 800)
                b.kernel("void at::native::vectorized_elementwise_kernel<4, relu>", 40)
            b.sync()
    b.finish()
    return b


def test_optimizer_and_compile_advice_name_the_trainers_switches(load_built):
    opt = _finding(load_built, find_rule("single-tensor-optimizer").positive(), _facts(HF), "single-tensor-optimizer")
    assert opt.advice == 'Set `optim="adamw_torch_fused"` in `TrainingArguments`.'
    from gpuadvise.rules.launch_bound import tiny_kernels

    launch = find_rule("launch-bound")
    compiling = _facts(dict(HF, settings=dict(HF["settings"], torch_compile=True)))
    off = _finding(load_built, launch.positive(), _facts(HF), "launch-bound")
    on = _finding(load_built, tiny_kernels(compiled=True), compiling, "launch-bound")
    assert "Under transformers' Trainer: set `torch_compile=True` in `TrainingArguments`." in off.advice
    assert on.advice.startswith("torch.compile is on already (`torch_compile=True` in `TrainingArguments`).")
    assert '`torch_compile_mode="reduce-overhead"` in `TrainingArguments`' in on.advice  # the next step: CUDA graphs
    assert "set `torch_compile=True`" not in on.advice and "torch.compile(model)" not in on.advice + on.fix
    # set, yet the recorded steps ran eagerly: the trace decides, and the advice says why it asks again
    eager = _finding(load_built, launch.positive(), compiling, "launch-bound")
    assert eager.advice.startswith("run.json records `torch_compile=True` in `TrainingArguments`, but the trace shows "
                                   "no compiled code in the recorded steps")
    assert "set `torch_compile=True` in `TrainingArguments`" in eager.advice


def test_switch_phrases_per_framework():
    hf, lit = runfacts.framework({"framework": HF}), runfacts.framework({"framework": LIGHTNING})
    acc = runfacts.framework({"framework": {"name": "accelerate", "settings": {}}})
    assert switches.already(lit, "bf16") == '`precision="bf16-mixed"` on the `Trainer`'
    assert switches.already(hf, "pin_memory") == "`dataloader_pin_memory=True` in `TrainingArguments`"
    assert switches.already(hf, "bf16") is None and switches.already(None, "bf16") is None
    assert switches.bf16(acc).startswith('pass `mixed_precision="bf16"` to `Accelerator(...)`')
    assert switches.compile_model(lit).startswith("compile the model before fitting")


def test_compare_lists_the_framework_settings_that_changed():
    from gpuadvise.analyzer.compare.diff import environment
    from gpuadvise.analyzer.compare.side import Side

    def side(workers: int) -> Side:
        fw = dict(HF, settings=dict(HF["settings"], dataloader_num_workers=workers))
        return Side(label=f"{workers} workers", facts=_facts(fw, HF_LOADERS))

    rows = environment(side(0), side(4))
    assert {"key": "framework.settings.dataloader_num_workers", "before": 0, "after": 4} in rows
    assert not [r for r in rows if r["key"].startswith("framework.") and r["key"] != "framework.settings.dataloader_num_workers"]


# -- evaluation and checkpoints inside the window --------------------------------------------------------------------
def _steps_with_phase(kind: str | None, at: int = 2, gpu: bool = True) -> TraceBuilder:
    b = TraceBuilder() if gpu else TraceBuilder(device=None)
    for i in range(4):
        with b.step():
            b.cpu(SINGLE, 2_000)
            if gpu:
                for _ in range(10):
                    b.kernel(GEMM, 300)
                b.sync()
            else:
                b.cpu("aten::mm", 3_000)
            if kind is not None and i == at:
                with b.op(f"gpuadvise: {kind}", cat="user_annotation"):
                    b.cpu(SINGLE, 5_000)  # the evaluation loader's batches
                    b.cpu("aten::mm", 20_000)
    b.finish()
    return b


@pytest.mark.parametrize("gpu", [True, False])
def test_a_step_holding_an_evaluation_is_left_out(load_built, gpu):
    from gpuadvise.analyzer.measure.basics.metrics import compute
    from gpuadvise.analyzer.run.figures import one_time_note

    m = compute(load_built(_steps_with_phase("evaluation", gpu=gpu)))
    assert [s.number for s in m.steps] == [0, 1, 3] and [s.number for s in m.left_out_steps] == [2]
    assert "the framework's evaluation ran in it" in m.left_out[2]
    note = one_time_note(m)
    assert note.startswith("Left out of every figure (the framework's evaluation or checkpointing, not training): step #2")
    # the evaluation loader's waits are no training waits: the stall figures are the training steps'
    assert float(m.per_step["dataloader_us"].max()) == pytest.approx(2_000, rel=0.01)


def test_without_phases_every_step_counts(load_built):
    from gpuadvise.analyzer.measure.basics.metrics import compute

    m = compute(load_built(_steps_with_phase(None)))
    assert [s.number for s in m.steps] == [0, 1, 2, 3] and m.left_out == {}


def test_phases_in_every_step_are_cut_instead(load_built):
    from gpuadvise.analyzer.measure.basics.metrics import compute
    from gpuadvise.analyzer.run.figures import one_time_note

    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(10):
                b.kernel(GEMM, 300)
            with b.op("gpuadvise: checkpoint", cat="user_annotation"):
                b.cpu("aten::copy_", 10_000)
            b.sync()
    b.finish()
    m = compute(load_built(b))
    assert len(m.steps) == 3 and m.one_time_cut is not None
    assert one_time_note(m).startswith("Every step holds the framework's evaluation or checkpointing")


def test_a_callback_that_cannot_profile_lets_training_run(tmp_path, capsys):
    from gpuadvise.integrations.callback_capture import CallbackCapture

    (tmp_path / "run.json").write_text("{}")  # an earlier capture the user did not ask to replace
    session = CallbackCapture("GpuadviseCallback(test)", tmp_path, {}, summary=True)
    session.start()
    assert session.capture is None and not session.complete()
    session.finish()  # the end of training: nothing to end, nothing printed
    err = capsys.readouterr().err
    assert err.startswith("gpuadvise> not profiling this run: ") and str(tmp_path) in err and "force" in err
    assert err.count("\n") == 1


# -- the callbacks without their framework --------------------------------------------------------------------------
@pytest.mark.parametrize("module, blocked, extra", [
    ("gpuadvise.integrations.huggingface", ("transformers",), "hf"),
    ("gpuadvise.integrations.lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"), "lightning"),
])
def test_a_callback_without_its_framework_names_the_extra(monkeypatch, module, blocked, extra):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'gpuadvise\[{extra}\]'"):
        importlib.import_module(module)

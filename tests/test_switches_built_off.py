"""The trace decides what ran: a switch the script built but disabled or bypassed is off, whatever run.json
recorded where it was built.

One CPU training loop per switch builds it and then does not use it (an autocast with `enabled=False`, one
entered around none of the matmuls, a compiled module that is never called, a DataLoader with workers that
is never iterated, a foreach optimizer that steps only before the recorded steps, TF32 and cudnn.benchmark
turned off while the steps run, `no_sync()` called without `with`, a channels_last model fed NCHW batches).
Each is captured in this process (`gpuadvise.capture`, the harness `gpuadvise profile` runs), once, and
what a user checks is asserted on it:

- no finding calls the switch on, and the switch table (measure/settings/switches_on.py) has it off, naming the
  conflict where run.json recorded the switch;
- where the switch's rule fires (the captured run.json under that rule's own positive trace: on a CPU the
  GPU rules have nothing to see), its advice asks for the switch.

The analysis side is also drawn by Hypothesis over autocast records of every shape (enabled or not, entered
or not, for the CPU or the GPU, older records without those fields) under fp32 matmuls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from _hypothesis_support import examples
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.measure.settings.switches_on import (SWITCHES, asked_for, is_on, switch_off, switches_on,
                                                     with_conflicts_named)
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.runjson import run_json
from gpuadvise.rules import find_rule

torch = pytest.importorskip("torch")
nn = torch.nn

STEPS = 5  # wait 1 (its step records the matmuls' input types), warm-up 1, 2 recorded, one after
WINDOW = {"wait": 1, "warmup": 1, "active": 2}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(model, opt, x, ctx=None) -> None:
    import contextlib

    with ctx if ctx is not None else contextlib.nullcontext():
        loss = model(x).float().pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


# -- the loops: each builds its switch, then runs the steps without it ------------------------------------

def autocast_disabled():
    model, x = _mlp(), torch.randn(16, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = False  # `enabled=args.amp` with the flag off
    for _ in range(STEPS):
        _train(model, opt, x, torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp))


def autocast_bypassed():
    model, x = _mlp(), torch.randn(16, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    for _ in range(STEPS):
        with ctx:  # entered every step, around none of the matmuls
            y = x * 1.0
        _train(model, opt, y)


def compile_bypassed():
    model, x = _mlp(), torch.randn(16, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.compile(model)  # the compiled module is built, and the eager one is called
    for _ in range(STEPS):
        _train(model, opt, x)


def loader_bypassed():
    from torch.utils.data import DataLoader, TensorDataset

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(16 * STEPS, 32))
    DataLoader(data, batch_size=16, num_workers=2, pin_memory=True)  # built for training, never iterated
    for (x,) in DataLoader(data, batch_size=16):  # the loop iterates this one
        _train(model, opt, x)


def optimizer_bypassed():
    model, x = _mlp(), torch.randn(16, 32)
    warm = torch.optim.AdamW(model.parameters(), foreach=True)
    _train(model, warm, x)  # steps once, before the recorded steps
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    for _ in range(STEPS - 1):
        _train(model, opt, x)


def flags_changed():
    model, x = _mlp(), torch.randn(16, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.benchmark = True
    try:
        for i in range(STEPS):
            if i == 3:  # the second recorded step: on at their start, off at their end
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.benchmark = False
            _train(model, opt, x)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.benchmark = False


def no_sync_bypassed(store: Path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        model, x = DistributedDataParallel(_mlp()), torch.randn(16, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(STEPS):
            for micro in range(2):  # gradient accumulation over two micro-batches
                if micro == 0:
                    model.no_sync()  # called, never entered: the first backward all-reduces too
                model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        dist.destroy_process_group()


def channels_last_bypassed():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 3, 8, 8)  # NCHW batches: converted at every convolution
    for _ in range(STEPS):
        _train(model, opt, x)


# loop → (the switches it builds and bypasses, the rule that asks for the first, the word its advice asks with)
LOOPS = {
    autocast_disabled: (("autocast",), "no-tensor-cores"),
    autocast_bypassed: (("autocast",), "no-tensor-cores"),
    compile_bypassed: (("compile",), "launch-bound"),
    loader_bypassed: (("workers", "pin_memory"), "dataloader-stall"),
    optimizer_bypassed: (("fused_optimizer",), "single-tensor-optimizer"),
    flags_changed: (("tf32", "cudnn_benchmark"), "no-tensor-cores"),
    no_sync_bypassed: (("no_sync",), "ddp-sync-per-microbatch"),
    channels_last_bypassed: (("channels_last",), "channels-last"),
}
# the word a finding's text uses when it says the switch is on already
WORD = {"autocast": "autocast", "compile": "torch.compile", "workers": "worker", "pin_memory": "pin",
        "fused_optimizer": "fused", "tf32": "tf32", "cudnn_benchmark": "benchmark", "no_sync": "no_sync",
        "channels_last": "channels_last"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Each loop captured once (one run folder each), in this process."""
    import gpuadvise

    tmp = tmp_path_factory.mktemp("built-off")
    out = {}
    for loop in LOOPS:
        with gpuadvise.capture(tmp / loop.__name__, **WINDOW):
            loop(tmp / "store") if loop is no_sync_bypassed else loop()
        out[loop.__name__] = tmp / loop.__name__
    return out


def _analysis(run: Path) -> Analysis:
    model = load_trace(next(run.glob("trace*.json*")))
    return Analysis(model, compute(model), json.loads((run / "run.json").read_text()))


CLAIM = re.compile(r"\b(?:is|are) (?:on|set|in use) already\b|\balready on\b|\bis on \(", re.I)


def _says_on(text: str, switch: str) -> bool:
    """A sentence that names the switch and states it is on ("Autocast is on already (run.json: …)",
    "Already on, so not repeated here: torch.compile is on (…)"); a condition ("If workers are already in
    use …") states nothing."""
    return any(WORD[switch] in s.lower() and CLAIM.search(s) and not s.lstrip().lower().startswith("if ")
               for s in re.split(r"(?<=[.;])\s+|\n", text))


@pytest.mark.parametrize("loop", list(LOOPS), ids=[f.__name__ for f in LOOPS])
def test_a_switch_built_but_not_used_is_off(loop, runs):
    run = runs[loop.__name__]
    switches, _ = LOOPS[loop]
    a = _analysis(run)
    on = switches_on(a)
    report = analyze_paths([str(run)], jobs=1)
    notes = " ".join(n for r in report for n in r.notes)
    for switch in switches:
        assert switch not in on, (switch, on.get(switch))
        for f in all_findings(report):
            assert not _says_on(f.advice + "\n" + f.fix, switch), (switch, f.topic, f.advice)
        off = switch_off(switch, a)
        if switch == "channels_last":  # run.json records no layout: the trace alone decides, with nothing to name
            assert off is None
            continue
        assert off is not None, f"{switch}: run.json records it, and no conflict is named"
        assert f"{off.text}: the findings take " in notes and SWITCHES[switch].label in notes, (off, notes)


def test_the_harness_records_what_ran_beside_what_was_built(runs):
    """What run.json says of each bypassed switch: its construction, and that the recorded steps did not use it."""
    def facts(name):
        return json.loads((runs[name] / "run.json").read_text())

    (disabled,) = facts("autocast_disabled")["autocast"]
    assert disabled["enabled"] is False and disabled["entered_in_window"] == 2
    line = _line('torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp)')
    assert disabled["created_at"].endswith(f"test_switches_built_off.py:{line}")
    (bypassed,) = facts("autocast_bypassed")["autocast"]
    assert bypassed["enabled"] is True and bypassed["entered"] == STEPS and bypassed["entered_in_window"] == 2
    built, used = facts("loader_bypassed")["dataloaders"]
    assert (built["num_workers"], built["batches_in_window"]) == (2, 0)
    assert (used["num_workers"], used["batches_in_window"]) == (0, 2)
    warm, opt = facts("optimizer_bypassed")["optimizers"]
    assert (warm["foreach"], warm["steps"], warm["steps_in_window"]) == (True, 1, 0)
    assert (opt["foreach"], opt["steps_in_window"]) == (False, 2)
    changed = facts("flags_changed")["settings"]["changed_in_window"]
    assert changed["matmul_allow_tf32"] == changed["cudnn_benchmark"] == [True, False]
    assert changed["float32_matmul_precision"] == ["high", "highest"]  # what allow_tf32 sets with it
    (ddp,) = facts("no_sync_bypassed")["distributed"]["ddp"]
    assert (ddp["no_sync_calls"], ddp["no_sync_entered"]) == (STEPS, 0)
    assert facts("compile_bypassed")["compiled"]["calls"]
    assert "compiled" not in facts("loader_bypassed")  # the block after it starts from nothing


def test_where_the_switchs_rule_fires_its_advice_asks_for_it(runs, load_built):
    """The captured run.json of each loop under its rule's own positive trace (the GPU pattern the rule
    looks for): the rule fires, asks for the switch that was built but off, and names the conflict."""
    for loop, (switches, topic) in LOOPS.items():
        rule = find_rule(topic)
        built = rule.positive()
        captured = json.loads((runs[loop.__name__] / "run.json").read_text())
        facts = dict(getattr(built, "facts", None) or run_json())
        facts.update({k: captured[k] for k in ("autocast", "dataloaders", "optimizers", "compile", "compiled",
                                               "distributed") if k in captured})
        facts["settings"] = dict(facts.get("settings") or {}, **captured["settings"])
        report = analyze_model(load_built(built), facts, rules=[rule])
        found = [f for f in report.findings if f.topic == topic]
        assert found, f"{loop.__name__}: {topic} does not fire on its positive trace"
        said = found[0].advice + "\n" + found[0].fix
        assert switches[0] in asked_for(said), (loop.__name__, said)
        model = load_built(built)
        off = switch_off(switches[0], Analysis(model, compute(model), facts))
        if off is not None:  # the conflict is named ahead of the advice (its first letter up)
            assert off.text[1:] in found[0].advice.split(". ", 1)[0], (off, found[0].advice)


# -- the analysis side, drawn: autocast records of every shape under fp32 matmuls -------------------------

AUTOCAST = st.fixed_dictionaries({
    "created_at": st.sampled_from(["train.py:40", "model.py:12"]),
    "device_type": st.sampled_from(["cuda", "cpu"]),
    "dtype": st.sampled_from(["torch.bfloat16", "torch.float16"]),
}, optional={"enabled": st.booleans(), "entered": st.integers(0, 9), "entered_in_window": st.integers(0, 3)})


@pytest.fixture(scope="module")
def fp32_loop(tmp_path_factory):
    """no-tensor-cores' positive trace (every matmul an fp32 SIMT kernel), read once."""
    path = tmp_path_factory.mktemp("fp32") / "trace.json.gz"
    find_rule("no-tensor-cores").positive().write(path)
    model = load_trace(path)
    return model, compute(model)


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(AUTOCAST, min_size=1, max_size=3))
def test_autocast_over_fp32_matmuls_is_never_on_and_is_asked_for(records, fp32_loop):
    model, metrics = fp32_loop
    facts = dict(run_json(), autocast=records)
    a = Analysis(model, metrics, facts)
    assert is_on("autocast", a) is None
    off = switch_off("autocast", a)
    assert off is not None
    disabled = [r for r in records if r.get("enabled") is False]
    if len(disabled) == len(records):  # built with enabled=False: said so, at the line that built it
        assert off.source == "run.json" and f"built at {disabled[0]['created_at']} with enabled=False" in off.text
    (f,) = find_rule("no-tensor-cores").check(a)
    advice = with_conflicts_named(f.advice, f.fix, a)  # what the engine adds to every finding
    assert "autocast" in asked_for(advice) and advice.startswith(off.text[1:], 1)
    assert not _says_on(advice, "autocast")


def _line(statement: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if statement in ln and "_line(" not in ln)

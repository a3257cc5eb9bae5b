"""Advice asks only for what is off: the switch table reads run.json or the trace alone, the fixes a rule
gives turn to the next step when a switch is on (a compiled loop is told about CUDA graphs, not told to
compile), and the layout-conversion rule blames convolutions only for the conversions they launched.

The property over every input (the corpus and every rule's fixtures) is in test_consistency.py
(`test_no_recommendation_asks_for_a_switch_that_is_on`); these are the behaviours behind it."""

from __future__ import annotations

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.measure.settings.switches_on import On, asked_for, is_on, switch_off, switches_on, without_what_is_on
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.compiled import compiled_facts, compiled_loop
from gpuadvise.fixtures.runjson import run_json
from gpuadvise.rules import find_rule
from gpuadvise.rules.channels_last import FPROP, TO_NCHW, TO_NHWC

SHORT = "void at::native::vectorized_elementwise_kernel<4, add>"


def _analysis(model, facts=None) -> Analysis:
    return Analysis(model, compute(model), facts or {})


def _findings(load_built, builder, facts=None, topic=None):
    """The findings of the rule of `topic` (run alone: the engine's own path, the others' replays spared)."""
    report = analyze_model(load_built(builder), facts, rules=[find_rule(topic)])
    return [f for f in report.findings if f.topic == topic]


def _launch_bound(compiled: bool, graphs: bool = False) -> TraceBuilder:
    """launch-bound's loop (200 kernels of 3 µs a step, 8 µs of Python between launches), eager or inside
    compiled graphs (Inductor's kernels), launched one by one or from a CUDA graph."""
    b = TraceBuilder(launch_us=12.0)
    for _ in range(4):
        with b.step():
            if compiled:
                with b.op("Torch-Compiled Region: 0/0"), b.op("CompiledFunction"):
                    for i in range(200):
                        b.kernel(f"triton_poi_fused_add_{i % 7}", 3, call="cudaGraphLaunch" if graphs and i == 0 else None)
                        b.idle(8)
            else:
                for _ in range(200):
                    b.kernel(SHORT, 3)
                    b.idle(8)
            b.sync()
    b.finish()
    return b


# -- the table: run.json or the trace ------------------------------------------------------------------

def test_compile_is_on_from_the_trace_alone_and_from_run_json(load_built):
    model = load_built(compiled_loop())
    from_trace = is_on("compile", _analysis(model))
    assert from_trace is not None and from_trace.source == "the trace"
    assert "compiled-frame call" in from_trace.what and "Inductor kernels" in from_trace.what
    plain = load_built(find_rule("launch-bound").positive())
    assert is_on("compile", _analysis(plain)) is None
    from_facts = is_on("compile", Analysis(None, None, compiled_facts(mode="default")))
    assert from_facts is not None and from_facts.source == "run.json"
    # run.json's compile over a trace of eager steps: the trace decides, and the conflict is named
    eager = _analysis(plain, compiled_facts(mode="default"))
    assert is_on("compile", eager) is None
    assert "no compiled code in the recorded steps" in switch_off("compile", eager).text
    assert is_on("compile", _analysis(model, compiled_facts(mode="default"))).source == "run.json"


def test_loader_and_optimizer_switches_from_the_trace(load_built):
    pinned = TraceBuilder()
    with pinned.step():
        with pinned.op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", cat="user_annotation"):
            pinned.idle(100)
        pinned.kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 50)
        pinned.sync()
    pinned.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::pin_memory", "ts": 1_050.0, "dur": 20.0,
                          "pid": 1, "tid": 99, "args": {"External id": 9_999}})  # the loader's pin thread
    pinned.finish()
    on = switches_on(_analysis(load_built(pinned)))
    assert {"workers", "pin_memory", "fused_optimizer"} <= on.keys()
    assert all(e.source == "the trace" for e in on.values())
    off = switches_on(_analysis(load_built(find_rule("dataloader-stall").positive())))
    assert not {"workers", "pin_memory", "fused_optimizer"} & off.keys()


def test_run_json_settings_and_loaders_count():
    facts = run_json(settings={"matmul_allow_tf32": True, "cudnn_benchmark": True})
    a = Analysis(None, None, facts)
    assert is_on("tf32", a).source == "run.json" and is_on("cudnn_benchmark", a) is not None
    assert is_on("autocast", a) is None and is_on("compile", a) is None


def test_recommendations_are_recognised_and_reports_of_what_is_on_are_not():
    assert asked_for("```python\nmodel = torch.compile(model)\n```") == {"compile"}
    assert asked_for("Pass `pin_memory=True` to the `DataLoader`.") == {"pin_memory"}
    # a sentence that says the switch is on already asks for nothing
    assert asked_for("`dataloader_pin_memory=True` in `TrainingArguments` is set already, so pin the tensors.") == set()
    assert "cuda_graphs" in asked_for('Replay each compiled step as a CUDA graph (`torch.compile(model, mode="reduce-overhead")`).')
    assert "compile" not in asked_for('Replay each compiled step as a CUDA graph (`torch.compile(model, mode="reduce-overhead")`).')


def test_a_fix_block_loses_the_lines_for_switches_that_are_on_with_their_comments_and_blocks():
    fix = ("Do this:\n```python\n# half the bytes\nwith torch.autocast(\"cuda\", dtype=torch.bfloat16):\n"
           "    loss = model(x)\nopt = AdamW(params, fused=True)\nloss.backward()\n```\nDone.")
    out = without_what_is_on(fix, {"autocast": On("autocast", "run.json", "autocast to bfloat16")})
    assert "autocast" not in out and "loss = model(x)" not in out and "# half the bytes" not in out
    assert "fused=True" in out and "loss.backward()" in out and out.endswith("Done.")
    gone = without_what_is_on("Pin:\n```python\nloader = DataLoader(ds, pin_memory=True)\n```",
                              {"pin_memory": On("pin_memory", "the trace", "pinned")})
    assert gone == "Pin:"  # a block left empty goes with its fences


# -- rules built from what is off ----------------------------------------------------------------------

def test_launch_bound_on_a_compiled_trace_turns_to_cuda_graphs_not_compile(load_built):
    (eager,) = _findings(load_built, _launch_bound(compiled=False), topic="launch-bound")
    assert "torch.compile(model)" in eager.advice + eager.fix
    (compiled,) = _findings(load_built, _launch_bound(compiled=True), topic="launch-bound")
    said = compiled.advice + "\n" + compiled.fix
    assert compiled.advice.startswith("torch.compile is on already (")
    assert 'mode="reduce-overhead"' in said and "torch.compile(model)" not in said
    assert "compile the model" not in said.lower() and "compile" not in asked_for(said)


def _helper_beside(matmuls_compiled: bool) -> TraceBuilder:
    """launch-bound's loop with a matmul every 5th kernel, and a small compiled function (one Inductor
    kernel) each step; the matmuls are launched outside the compiled region (an eager model beside a
    compiled helper) or inside it (a compiled model)."""
    b = TraceBuilder(launch_us=12.0)
    for _ in range(4):
        with b.step():
            with b.op("Torch-Compiled Region: 0/0"), b.op("## Call CompiledFxGraph abc ##"):
                b.kernel("triton_poi_fused_add_0", 3)
                b.idle(8)
                if matmuls_compiled:
                    for _ in range(40):
                        b.kernel("ampere_sgemm_32x32_sliced1x4_tn", 3)
                        b.idle(8)
            for i in range(200):
                b.kernel(SHORT if matmuls_compiled or i % 5 else "ampere_sgemm_32x32_sliced1x4_tn", 3)
                b.idle(8)
            b.sync()
    b.finish()
    return b


def test_a_compiled_helper_beside_an_eager_model_is_no_compiled_model(load_built):
    # the model's matmuls all run eagerly: compiling the model is still the fix, and the notes say why
    report = analyze_model(load_built(_helper_beside(matmuls_compiled=False)), None, rules=[find_rule("launch-bound")])
    assert is_on("compile", _analysis(load_built(_helper_beside(matmuls_compiled=False)))) is None
    (f,) = [f for f in report.findings if f.topic == "launch-bound"]
    assert "compile" in asked_for(f.advice + "\n" + f.fix) and "on already" not in f.advice
    assert any("the model runs eagerly: 0 of its 160 matmul kernels were launched inside compiled code" in n
               for n in report.notes)
    # the same helper with the matmuls inside it: a compiled model, told about CUDA graphs instead
    compiled = analyze_model(load_built(_helper_beside(matmuls_compiled=True)), None, rules=[find_rule("launch-bound")])
    (g,) = [f for f in compiled.findings if f.topic == "launch-bound"]
    assert g.advice.startswith("torch.compile is on already (") and "compile" not in asked_for(g.advice + "\n" + g.fix)
    assert not any("runs eagerly" in n for n in compiled.notes)


def test_low_utilization_fix_lists_only_what_is_off(load_built):
    rule = find_rule("low-gpu-utilization")
    (plain,) = _findings(load_built, rule.positive(), topic="low-gpu-utilization")
    assert "model = torch.compile(model)" in plain.fix and "pin_memory=True" in plain.fix
    compiled = compiled_loop(breaks=1, island_us=8_000)  # a compiled loop whose GPU idles behind 8 ms of Python a step
    found = _findings(load_built, compiled, topic="low-gpu-utilization")
    assert found, "the compiled loop with 8 ms of eager Python a step idles its GPU"
    fix = found[0].fix
    assert "torch.compile(model)" not in fix.replace('torch.compile(model, mode="reduce-overhead")', "")
    assert 'mode="reduce-overhead"' in fix and "Already on, so not repeated here: torch.compile is on (the trace:" in fix


# -- channels-last -------------------------------------------------------------------------------------

def _convnet(conversion_us: float, miopen: bool = False, launcher: str = "aten::cudnn_convolution",
             batch_norm: bool = False, volta: bool = False) -> TraceBuilder:
    kw = {"platform": "rocm", "device": "AMD Instinct MI300X", "compute": None} if miopen else {}
    if volta:
        kw = {"device": "Tesla V100-SXM2-16GB", "compute": (7, 0)}
    b = TraceBuilder(**kw)
    to = "batched_transpose_32x32_half" if miopen else TO_NHWC
    back = "batched_transpose_16x32_half" if miopen else TO_NCHW
    conv = "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt256x128x32" if miopen else FPROP
    for _ in range(4):
        with b.step():
            b.idle(100)
            for _ in range(4):
                with b.op("aten::conv2d"), b.op(launcher):
                    b.kernel(to, conversion_us)
                    b.kernel(conv, 400)
                    b.kernel(back, conversion_us)
                if batch_norm:
                    with b.op("aten::miopen_batch_norm" if miopen else "aten::cudnn_batch_norm"):
                        b.kernel("MIOpenBatchNormFwdTrainSpatial" if miopen else "cudnn::bn_fw_tr_1C11_kernel_NCHW", 80)
            b.sync()
    b.finish()
    return b


def test_channels_last_names_the_convolutions_and_predicts_from_the_replay(load_built):
    (f,) = _findings(load_built, find_rule("channels-last").positive(), topic="channels-last")
    assert f.impact.est_step_saving_pct > 0 and "critical-path replay" in f.impact.basis
    assert {i["name"] for i in f.evidence.items} == {"aten::cudnn_convolution", "aten::convolution_backward"}
    assert "64×3×56×56" in {i["input_shape"] for i in f.evidence.items}
    assert "model.to(memory_format=torch.channels_last)" in f.advice and "memory_format=torch.channels_last" in f.fix


def test_channels_last_stays_quiet_without_conversions_or_when_they_are_negligible(load_built):
    rule = find_rule("channels-last")
    nhwc = load_built(rule.negative())
    assert not rule.check(_analysis(nhwc))
    assert is_on("channels_last", _analysis(nhwc)) is not None  # NHWC convolutions, no conversions
    assert not _findings(load_built, _convnet(conversion_us=5), topic="channels-last")  # ~2 % of kernel time


def test_channels_last_reads_miopen_and_blames_only_convolutions(load_built):
    (f,) = _findings(load_built, _convnet(conversion_us=60, miopen=True, launcher="aten::miopen_convolution"),
                     topic="channels-last")
    assert f.evidence.items[0]["name"] == "aten::miopen_convolution"
    # an AMD GPU's batch norm is MIOpen's, not cuDNN's
    (bn,) = _findings(load_built, _convnet(conversion_us=60, miopen=True, launcher="aten::miopen_convolution",
                                          batch_norm=True), topic="channels-last")
    assert "runs MIOpen's NHWC kernels" in bn.message and "cuDNN" not in bn.message
    (nv,) = _findings(load_built, _convnet(conversion_us=60, batch_norm=True), topic="channels-last")
    assert "runs cuDNN's NHWC kernels" in nv.message


def test_channels_last_fix_autocasts_in_the_type_the_tensor_cores_take(load_built):
    (volta,) = _findings(load_built, _convnet(conversion_us=60, volta=True), topic="channels-last")
    assert "dtype=torch.float16" in volta.fix and "GradScaler" in volta.fix and "bfloat16" not in volta.fix
    (newer,) = _findings(load_built, _convnet(conversion_us=60), topic="channels-last")
    assert "dtype=torch.bfloat16" in newer.fix
    # the same transposes launched by a non-convolution op are someone else's layout
    assert not _findings(load_built, _convnet(conversion_us=60, miopen=True, launcher="aten::bmm"), topic="channels-last")


def test_a_fused_optimizer_run_json_records_over_per_tensor_updates_is_off_and_asked_for(load_built):
    """run.json records AdamW(fused=True), the trace's optimizer steps launch one kernel per tensor and no
    multi-tensor one: the trace decides, the advice names the conflict and asks for the fused path again."""
    facts = run_json()
    facts["optimizers"] = [{"class": "AdamW", "foreach": None, "fused": True, "params": 60, "param_devices": {"cuda": 60}}]
    model = load_built(find_rule("single-tensor-optimizer").positive())
    assert is_on("fused_optimizer", _analysis(model, facts)) is None
    (f,) = _findings(load_built, find_rule("single-tensor-optimizer").positive(), facts, topic="single-tensor-optimizer")
    assert f.advice.startswith("run.json records AdamW with fused=True, but the trace shows its updates one tensor at a time")
    assert "fused_optimizer" in asked_for(f.advice)


def test_an_autocast_never_entered_in_the_steps_is_off_unless_compiled_code_could_have_entered_it(load_built):
    """run.json counts the Python `with` entries of each autocast: none in the recorded steps is off, with the
    conflict named; where the steps run compiled code, torch.compile's graph enters it without Python, so
    the uncounted entry says nothing and run.json's autocast stands."""
    facts = run_json()
    facts["autocast"] = [{"created_at": "train.py:40", "device_type": "cuda", "dtype": "torch.bfloat16", "enabled": True,
                          "entered": 2, "entered_in_window": 0}]
    eager = _analysis(load_built(find_rule("launch-bound").positive()), facts)
    assert is_on("autocast", eager) is None
    assert switch_off("autocast", eager).text == ("autocast to bfloat16 built at train.py:40 was not entered while the "
                                                  "recorded steps ran")
    compiled = _analysis(load_built(compiled_loop()), facts)
    assert is_on("autocast", compiled).source == "run.json" and switch_off("autocast", compiled) is None

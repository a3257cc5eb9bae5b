"""Advice for compiled training: what `gpuadvise profile` records about torch.compile, and the
findings it leads to.

End to end, with real torch.compile on the CPU (dynamo with the `eager` / `aot_eager` backends: they
recompile and break graphs exactly as Inductor does, in a fraction of the time): a batch size that
changes under `dynamic=False`, an `.item()` inside forward, a window on the first compiled steps, and a
clean compiled loop that must get none of those findings. The CUDA-graph counting runs on a fake torch
offering PyTorch's documented `torch.cuda.CUDAGraph` API (no GPU here).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from gpuadvise.harness.facts import compiled  # noqa: E402

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probes" / "compiled_train.py"
WINDOW = ["--wait", "4", "--warmup", "1", "--active", "3"]  # records steps 5-7; the script runs 10
COMPILE_RULES = {"compile-recompiles", "compile-graph-breaks", "compile-in-window", "cudagraphs-skipped"}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuadvise", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def profile_and_analyze(tmp: Path, case: str, backend: str = "eager", window=WINDOW, steps: int = 10):
    """Profile the probe from `tmp` (so file:line is relative to it), analyse the run folder as JSON."""
    import shutil

    script = Path(shutil.copy(PROBE, tmp / PROBE.name))
    proc = _run(["profile", "-o", "run", *window, script.name, case, str(steps), backend], tmp)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout  # the script ran to its end, its output untouched
    report = _run(["analyze", "run", "--format", "json"], tmp)
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    findings = data["findings"] if "findings" in data else [f for r in data["reports"] for f in r["findings"]]
    run = json.loads((tmp / "run" / "run.json").read_text())
    return script, run, findings


def by_rule(findings: list[dict], code: str) -> list[dict]:
    return [f for f in findings if f["rule"] == code]


def line_of(path: Path, predicate) -> int:
    (line,) = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if predicate(n)]
    return line


def forward_line(path: Path) -> int:
    return line_of(path, lambda n: isinstance(n, ast.FunctionDef) and n.name == "forward")


def item_line(path: Path) -> int:
    return line_of(path, lambda n: isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "item")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}

    def get(case, backend="eager", window=WINDOW):
        key = (case, backend, tuple(window))
        if key not in out:
            out[key] = profile_and_analyze(tmp_path_factory.mktemp(case), case, backend, window)
        return out[key]

    return get


# -- end to end -------------------------------------------------------------------------------------
def compile_line(path: Path) -> int:
    return line_of(path, lambda n: isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "compile")


@pytest.mark.slow
def test_changing_batch_size_recompiles_with_the_size_in_the_reason(runs):
    script, run, findings = runs("recompile")
    recompiles = run["compiled"]["recompiles"]
    assert recompiles and all("size mismatch" in r["reason"] for r in recompiles)
    assert {r["step"] for r in recompiles} >= {2, 4, 6, 8}  # a new batch size every two steps
    (f,) = by_rule(findings, "GA150")
    # torch's nn.Sequential is compiled through a frame in torch's own files: the finding names the module
    # and the user's torch.compile(...) line, never torch's file
    where = f"{script.name}:{compile_line(script)}"
    assert {r["where"] for r in recompiles} == {where} and {r["module"] for r in recompiles} == {"Sequential"}
    assert where in f["evidence"]["sources"]
    assert f"`Sequential` (torch.compile at {where})" in f["message"]
    assert "external_utils" not in json.dumps(f) and "site-packages" not in json.dumps(f)
    assert "size mismatch" in f["message"] and "actual" in f["message"]
    assert "mark_dynamic" in f["recommendation"]
    saving = f["impact"]["est_step_saving_pct"]
    assert 0 < saving <= 100
    # the saving is the recorded compile time over the timed steps from the first late recompile on
    steps = dict(zip(run["steps"]["number"], run["steps"]["ms"]))
    first = min(r["step"] for r in recompiles if r["step"] >= 2)
    late_s = sum(c["seconds"] for c in run["compiled"]["compiles"] if c["recompile_reason"] and c["step"] >= 2)
    expected = 100 * late_s / (sum(ms for n, ms in steps.items() if n >= first) / 1e3)
    assert saving == pytest.approx(min(expected, 100), abs=0.15)
    assert not by_rule(findings, "GA151")


@pytest.mark.slow
def test_item_in_forward_is_a_graph_break_at_its_line(runs):
    script, run, findings = runs("break", "aot_eager")
    where = f"{script.name}:{item_line(script)}"
    assert [b["where"] for b in run["compiled"]["graph_breaks"]] == [where]
    assert "item()" in run["compiled"]["graph_breaks"][0]["reason"]
    (f,) = by_rule(findings, "GA151")
    assert f["evidence"]["sources"] == [where]
    assert "item()" in f["message"]
    # aot_eager shows where the graphs ran: the eager island between them is measured, as a ceiling
    assert f["impact"]["upper_bound"] is True
    assert f["evidence"]["numbers"]["regions_per_step"] == 2
    assert f["impact"]["est_step_saving_pct"] == pytest.approx(f["evidence"]["numbers"]["island_pct"], abs=0.05)


@pytest.mark.slow
def test_window_on_the_first_compiled_steps_is_a_capture_problem(runs):
    script, run, findings = runs("clean", window=["--wait", "0", "--warmup", "0", "--active", "2"])
    (f,) = by_rule(findings, "GA152")
    assert f["topic"] == "capture-problem" and f["impact"]["est_step_saving_pct"] == 0
    assert f"{script.name}:{forward_line(script)}" in f["evidence"]["sources"]
    assert "--wait" in f["recommendation"]
    assert 0 < f["evidence"]["numbers"]["share_of_recorded_pct"] <= 100  # compiling is part of the recorded time


@pytest.mark.slow
def test_clean_compiled_loop_gets_no_compile_finding(runs):
    script, run, findings = runs("clean")
    assert run["compiled"]["frames"][0]["where"] == f"{script.name}:{forward_line(script)}"
    assert run["compiled"]["graph_breaks"] == [] and run["compiled"]["recompiles"] == []
    assert run["compiled"]["compile_seconds_per_step"].keys() == {"0"}  # compiled once, before any step ended
    names = {f["rule"] for f in findings}
    assert not names & {"GA150", "GA151", "GA152", "GA153"}


@pytest.mark.slow
def test_uncompiled_script_has_no_compiled_section(tmp_path):
    import shutil

    script = Path(shutil.copy(HERE / "probes" / "train_loop.py", tmp_path / "train_loop.py"))
    proc = _run(["profile", "-o", "run", *WINDOW, script.name, "10"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "compiled" not in json.loads((tmp_path / "run" / "run.json").read_text())


# -- the recorder, on torch's records and a fake CUDA torch ----------------------------------------------
def test_graph_break_site_from_current_and_older_payloads():
    now = ("Graph break in user code at /x/model.py:25\nGraph Break Reason: Encountered graph break when attempting "
           "to trace CALL: a function call, e.g. f(x, y):\n\nUnsupported Tensor.item() call with "
           "capture_scalar_outputs=False\n  Explanation: Dynamo does not support ...\n")
    assert compiled.break_site(now) == ("/x/model.py:25", "Unsupported Tensor.item() call with capture_scalar_outputs=False")
    older = ('Traceback (most recent call last):\n  File "/site-packages/torch/_dynamo/x.py", line 9, in f\n'
             '  File "/x/model.py", line 31, in forward\n    print(x)\ncall_function BuiltinVariable(print)')
    where, reason = compiled.break_site(older)
    assert where == "/x/model.py:31" and reason
    # a break dynamo places inside a framework's forward: the user's innermost frame of its traceback
    framework = ("Graph break in user code at /env/lib/python3.11/site-packages/transformers/modeling.py:412\n"
                 "Graph Break Reason: Unsupported Tensor.item() call\nUser code traceback:\n"
                 '  File "/x/train.py", line 30, in step\n  File "/x/model.py", line 12, in forward\n'
                 '  File "/env/lib/python3.11/site-packages/transformers/modeling.py", line 412, in forward\n')
    assert compiled.break_site(framework) == ("/x/model.py:12", "Unsupported Tensor.item() call")


def _records(rec: compiled.Recorder, steps: list[int]):
    step = iter(steps)
    rec.where = lambda: (next(step), "active")
    rec.on_record({"compilation_metrics": {"co_name": "forward", "co_filename": "/x/m.py", "co_firstlineno": 3,
                                           "entire_frame_compile_time_s": 1.25, "compile_id": "0/0"}}, None)
    rec.on_record({"compilation_metrics": {"co_name": "forward", "co_filename": "/x/m.py", "co_firstlineno": 3,
                                           "entire_frame_compile_time_s": 0.5, "compile_id": "0/1",
                                           "recompile_reason": "0/0: tensor 'x' size mismatch at index 0. expected 4, "
                                                               "actual 6\nUser stack trace: ...",
                                           "cudagraph_skip_reason": "skipping cudagraphs due to mutated inputs"}}, None)
    rec.on_record({"artifact": {"name": "dynamo_graph_break_reason"}}, "Graph break in user code at /x/m.py:9\n"
                  "Graph Break Reason: Unsupported builtin print\n")


def test_recorder_turns_torch_records_into_run_json(monkeypatch):
    rec = compiled.Recorder(torch, lambda: (0, "wait"))
    _records(rec, [0, 7, 7])
    s = rec.summary()
    assert [c["step"] for c in s["compiles"]] == [0, 7]
    assert s["recompiles"] == [{"compile_id": "0/1", "function": "forward", "where": "/x/m.py:3", "step": 7,
                                "phase": "active", "reason": "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 6"}]
    assert s["compile_seconds_per_step"] == {"0": 1.25, "7": 0.5}
    assert s["frames"] == [{"function": "forward", "where": "/x/m.py:3", "compiles": 2, "compile_seconds": 1.75,
                            "first_step": 0}]
    assert s["graph_breaks"] == [{"where": "/x/m.py:9", "reason": "Unsupported builtin print", "count": 1, "steps": [7],
                                  "first_phase": "active"}]
    assert s["cudagraphs"]["skip_reasons"] == ["skipping cudagraphs due to mutated inputs"]


def test_the_backwards_lazy_compile_counts_in_its_compile_and_step():
    """AOTAutograd compiles the backward on the first backward call (`bwd_compilation_metrics`): its time
    is compiling too, as the trace's compile spans show it."""
    steps = iter([(0, "wait"), (1, "wait")])
    rec = compiled.Recorder(torch, lambda: next(steps))
    rec.on_record({"compilation_metrics": {"compile_id": "0/0", "co_name": "forward", "co_filename": "/x/m.py",
                                           "co_firstlineno": 3, "entire_frame_compile_time_s": 1.25}}, None)
    rec.on_record({"bwd_compilation_metrics": {"compile_id": "0/0", "backward_cumulative_compile_time_us": 750_000}},
                  None)
    s = rec.summary()
    assert s["compiles"][0]["seconds"] == 2.0 and s["compiles"][0]["backward_seconds"] == 0.75
    assert s["compile_seconds_per_step"] == {"0": 1.25, "1": 0.75}  # each part in the step it ran in


def test_a_broken_record_is_noted_never_raised():
    rec = compiled.Recorder(torch, lambda: 1 / 0)  # the step lookup itself fails
    rec.attach()
    try:
        from torch._logging._internal import trace_log

        torch._logging.trace_structured("compilation_metrics", lambda: {"co_name": "f"}, expect_trace_id=False)
    finally:
        trace_log.removeHandler(rec.handler)
    assert rec.errors and "ZeroDivisionError" in rec.errors[0]


def fake_cuda_torch():
    """A torch whose CUDA side offers the documented `torch.cuda.CUDAGraph` methods, and nothing more."""
    calls = []

    class CUDAGraph:
        def capture_begin(self, *a, **k):
            calls.append("capture_begin")

        def replay(self):
            calls.append("replay")

    def compile_(model, **kw):
        return model

    fake = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: True, CUDAGraph=CUDAGraph), compile=compile_)
    return fake, calls


def test_reduce_overhead_counts_cuda_graph_captures_and_replays(monkeypatch):
    fake, calls = fake_cuda_torch()
    monkeypatch.setattr(compiled, "_REC", None)
    compiled.install(fake, lambda: (3, "wait"))
    model = object()
    assert fake.compile(model, mode="reduce-overhead") is model  # the user's call still returns torch's result
    g = fake.cuda.CUDAGraph()
    g.capture_begin()
    for _ in range(5):
        g.replay()
    assert calls == ["capture_begin"] + ["replay"] * 5  # the originals still run
    s = compiled.summary()
    assert s["calls"][0]["mode"] == "reduce-overhead" and s["calls"][0]["step"] == 3
    assert {k: s["cudagraphs"][k] for k in ("requested", "captures", "replays")} == \
        {"requested": True, "captures": 1, "replays": 5}
    compiled.reset()


def test_default_mode_does_not_touch_cuda_graphs(monkeypatch):
    fake, _ = fake_cuda_torch()
    original = fake.cuda.CUDAGraph.replay
    monkeypatch.setattr(compiled, "_REC", None)
    compiled.install(fake, lambda: (0, "wait"))
    fake.compile(object())
    assert fake.cuda.CUDAGraph.replay is original
    assert compiled.summary()["cudagraphs"]["requested"] is False
    compiled.reset()


def test_nothing_is_attached_before_torch_compile_is_called(monkeypatch):
    monkeypatch.setattr(compiled, "_REC", None)
    assert compiled.summary() is None


# -- the trace side and compare ------------------------------------------------------------------------
def test_compiled_share_of_each_step_from_graph_spans(load_built):
    from gpuadvise.analyzer.measure.compiled.compiledtrace import compiled_trace
    from gpuadvise.analyzer.measure.basics.metrics import compute
    from gpuadvise.fixtures.compiled import compiled_loop

    plain = load_built(compiled_loop())
    broken = load_built(compiled_loop(breaks=1, island_us=3_000))
    p, b = compiled_trace(plain, compute(plain)), compiled_trace(broken, compute(broken))
    assert p.graph_spans and all(s.regions == 1 for s in p.steps)
    assert b.steps[0].island_us - p.steps[0].island_us == pytest.approx(3_000, abs=5)  # the island the break adds
    assert p.inductor_kernels["template GEMM"]["count"] == 3
    assert "eager code" in b.describe()


def test_real_compiled_trace_is_recognised():
    import os

    from gpuadvise.analyzer.measure.compiled.compiledtrace import compiled_trace
    from gpuadvise.analyzer.measure.basics.metrics import compute
    from gpuadvise.analyzer.read.loader import load_trace

    root = Path(os.environ.get("GPUADVISE_TRACES") or HERE.parent.parent / "shared" / "traces")
    path = root / "tracelens" / "tests" / "traces" / "torch_compile_triton" / "trace.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found (set GPUADVISE_TRACES)")
    model = load_trace(path)
    ct = compiled_trace(model, compute(model))
    assert ct.graph_spans  # its `## Call CompiledFxGraph` annotation
    assert {k: v["count"] for k, v in ct.inductor_kernels.items()} == {"pointwise": 2, "reduction": 2}


def test_compare_lists_compile_facts_that_differ():
    from gpuadvise.analyzer.compare.diff import environment
    from gpuadvise.analyzer.compare.side import Side
    from gpuadvise.fixtures.compiled import compiled_facts

    before = compiled_facts([{"step": 0, "seconds": 4.0}] + [
        {"step": s, "seconds": 1.0, "recompile_reason": f"0/{i}: tensor 'x' size mismatch"} for i, s in enumerate((3, 5))],
        breaks=[{"where": "train.py:25", "reason": "print", "count": 1, "steps": [0]}])
    after = compiled_facts([{"step": 0, "seconds": 5.0}])
    rows = {r["key"]: r for r in environment(Side("before", facts=before), Side("after", facts=after))}
    assert {"compiled.recompiles", "compiled.recompiles_after_warmup", "compiled.graph_breaks",
            "compiled.graph_break_sites", "compiled.graphs"} <= rows.keys()
    assert not any("seconds" in k for k in rows)  # compile time differs in every pair of runs: not a fact

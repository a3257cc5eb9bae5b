"""The rule catalog: documentation contract, registry, each rule's own fixtures, finding shape, and
targeted behaviours a user relies on."""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import gpuadvise.rules as rules_pkg
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model, analyze_snapshot
from gpuadvise.analyzer.model.findings import Evidence, Impact
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.read.snapshot import load_snapshot
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import all_rules, find_rule

RULES = all_rules()
IDS = [r.name for r in RULES]
HEADINGS = ("## What it detects", "## Why it matters", "## Fix", "## Thresholds")
SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


@pytest.fixture(scope="module")
def fixture_reports(tmp_path_factory):
    """Every rule's positive and negative fixture, written as .json.gz (a memory snapshot as .pickle, a
    job-level rule's ranks as a folder, a trace with run.json facts as a run folder), loaded and analysed
    once, the way `gpuadvise analyze` reads it."""
    d = tmp_path_factory.mktemp("rule-fixtures")
    cache = {}

    def get(rule, kind):
        key = (rule.code, kind)
        if key not in cache:
            builder = getattr(rule, kind)()
            if getattr(builder, "facts", None) is not None:
                # a trace with run.json facts: read as the run folder `gpuadvise profile` leaves
                (cache[key],) = analyze_paths([str(builder.write_run_folder(d / f"{rule.name}-{kind}"))], jobs=1)
                return cache[key]
            path = builder.write(d / f"{rule.name}-{kind}{getattr(builder, 'suffix', '.json.gz')}")
            if path.is_dir():  # several ranks: the per-rank findings and the job's, as one report
                reports = analyze_paths([str(path)], jobs=1)
                assert reports.job is not None, f"{rule.name} {kind}: the folder is not a multi-rank job"
                cache[key] = SimpleNamespace(findings=all_findings(reports),
                                             notes=[n for r in reports for n in r.notes] + reports.job.notes)
            elif path.name.endswith(".pickle"):
                cache[key] = analyze_snapshot(load_snapshot(path), source=str(path))
            else:
                cache[key] = analyze_model(load_trace(path), source=str(path))
        return cache[key]

    return get


def topics(report):
    return [f.topic for f in report.findings]


def analyze(builder: TraceBuilder, load_built):
    return analyze_model(load_built(builder))


# ----------------------------------------------------------------------------------------------------
# Catalog and documentation


def test_catalog_is_not_empty():
    assert len(RULES) >= 7


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_docs_have_required_sections(rule):
    docs = rule.docs
    for heading in HEADINGS:
        assert re.search(rf"^{re.escape(heading)}\s*$", docs, flags=re.M), f"{rule.name}: docs lack '{heading}'"
    # in the documented order, each with some text under it
    positions = [docs.index(h) for h in HEADINGS]
    assert positions == sorted(positions), f"{rule.name}: headings out of order"
    for heading in HEADINGS:
        body = re.search(rf"^{re.escape(heading)}\s*\n(.*?)(?=^## |\Z)", docs, flags=re.S | re.M).group(1)
        assert body.strip(), f"{rule.name}: '{heading}' is empty"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_fix_section_has_python_code_block(rule):
    fix = re.search(r"^## Fix\s*\n(.*?)(?=^## |\Z)", rule.docs, flags=re.S | re.M).group(1)
    blocks = re.findall(r"```python\n(.*?)```", fix, flags=re.S)
    assert blocks, f"{rule.name}: '## Fix' has no ```python block"
    for code in blocks:
        ast.parse(code)  # the snippet a user copies must at least be valid Python


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_rule_identity(rule):
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name), f"name {rule.name!r} is not kebab-case"
    assert re.fullmatch(r"GA\d{3}", rule.code), rule.code
    assert rule.topic and rule.title
    assert isinstance(rule.thresholds, dict)
    assert find_rule(rule.code) is rule
    assert find_rule(rule.name.upper()) is rule
    assert find_rule(f" {rule.code.lower()} ") is rule


def test_codes_and_names_unique():
    codes = [r.code for r in RULES]
    names = [r.name for r in RULES]
    assert len(set(codes)) == len(codes)
    assert len(set(names)) == len(names)


def test_find_rule_unknown():
    assert find_rule("GA999") is None
    assert find_rule("no-such-rule") is None


def test_registry_finds_every_rule_module():
    """Every module in rules/ that assigns RULE at top level is in the catalog, and nothing else is."""
    defining = set()
    for info in pkgutil.iter_modules(rules_pkg.__path__):
        src = Path(rules_pkg.__path__[0], f"{info.name}.py")
        if not src.is_file():
            continue
        tree = ast.parse(src.read_text())
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "RULE" for t in targets):
                defining.add(info.name)
    registered = {type(r).__module__.rsplit(".", 1)[-1] for r in RULES}
    assert defining, "no rule modules found"
    assert registered == defining


# ----------------------------------------------------------------------------------------------------
# Each rule's own fixtures


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_positive_fixture_triggers_rule(rule, fixture_reports):
    report = fixture_reports(rule, "positive")
    assert rule.topic in topics(report), f"{rule.name} positive fixture gave {topics(report)}; notes {report.notes}"
    assert any(f.rule == rule.code for f in report.findings)
    assert not any("failed" in n for n in report.notes), report.notes


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_negative_fixture_does_not_trigger_rule(rule, fixture_reports):
    report = fixture_reports(rule, "negative")
    assert rule.topic not in topics(report), [f.message for f in report.findings if f.topic == rule.topic]
    assert not any("failed" in n for n in report.notes), report.notes


def _check_finding(f):
    assert f.rule in {r.code for r in RULES}
    assert f.topic == find_rule(f.rule).topic
    assert f.severity in ("high", "medium", "low", "info")
    assert isinstance(f.title, str) and f.title.strip()
    assert isinstance(f.message, str) and re.search(r"\d", f.message), f"{f.rule}: message quotes no number: {f.message!r}"
    assert isinstance(f.evidence, Evidence)
    assert isinstance(f.impact, Impact)
    assert 0.0 <= f.impact.est_step_saving_pct <= 100.0, f.impact
    assert f.impact.basis.strip()
    assert isinstance(f.recommendation, str) and f.recommendation.strip()
    d = f.to_dict()
    for key in ("rule", "topic", "severity", "title", "message", "evidence", "impact", "recommendation"):
        assert key in d


@pytest.mark.parametrize("kind", ["positive", "negative"])
@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_findings_are_complete_and_sorted(rule, kind, fixture_reports):
    report = fixture_reports(rule, kind)
    for f in report.findings:
        _check_finding(f)
    # Predictions of fixes are ordered biggest first; a symptom's ceiling (upper_bound) never outranks
    # a cause that explains at least half of it, and otherwise sits where its figure puts it.
    causes = [f for f in report.findings if not f.impact.upper_bound]
    savings = [f.impact.est_step_saving_pct for f in causes]
    assert savings == sorted(savings, reverse=True)
    for i, f in enumerate(report.findings):
        if f.impact.upper_bound:
            before = report.findings[:i]
            after = [g for g in report.findings[i + 1:] if not g.impact.upper_bound]
            assert all(g.impact.est_step_saving_pct < 0.5 * f.impact.est_step_saving_pct or
                       g.impact.est_step_saving_pct <= max((b.impact.est_step_saving_pct for b in before), default=100.0)
                       for g in after)
            assert all(b.impact.est_step_saving_pct >= 0.5 * f.impact.est_step_saving_pct or
                       b.impact.est_step_saving_pct >= f.impact.est_step_saving_pct for b in before if not b.impact.upper_bound)


def test_cpu_only_and_no_cuda_findings_are_complete(load_built):
    """The capture-problem branches quote numbers too (a user needs them to judge the trace)."""
    no_cuda = TraceBuilder()  # lists a GPU but recorded no CUDA activity
    cpu_only = TraceBuilder(device=None)  # no GPU at all
    for b in (no_cuda, cpu_only):
        for _ in range(3):
            with b.step():
                with b.op("aten::linear"):
                    b.idle(500)
    for b in (no_cuda, cpu_only):
        report = analyze(b, load_built)
        assert "capture-problem" in topics(report)
        for f in report.findings:
            _check_finding(f)


# ----------------------------------------------------------------------------------------------------
# Targeted behaviours


def test_dataloader_saving_counts_overlap_not_share(load_built):
    """The loader runs while the previous launches still execute: removing it gets back only the part
    the GPU did not cover, far less than the loader's share of the step."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(10):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 1_500)  # 15 ms of queued GPU work
            b.cpu(SINGLE, 20_000)  # 20 ms loading the next batch, overlapping the 15 ms
            b.sync()
    b.finish()
    report = analyze(b, load_built)
    m = report.metrics
    share = 100 * m.per_step["dataloader_us"].sum() / m.per_step["dur_us"].sum()
    assert share > 90
    f = next(f for f in report.findings if f.topic == "dataloader-stall")
    saving = f.impact.est_step_saving_pct
    # step ≈ 20.07 ms; without the loader it is GPU-bound at ≈ 15.07 ms → ≈ 25 % saved
    assert saving < share / 2
    assert 20 <= saving <= 30, saving
    assert f.evidence.numbers["single_process"] is True


def test_dataloader_without_overlap_saves_about_its_share(load_built):
    """Control for the test above: with nothing to overlap, the saving is close to the share."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu(SINGLE, 20_000)
            for _ in range(10):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 1_500)
            b.sync()
    b.finish()
    report = analyze(b, load_built)
    m = report.metrics
    share = 100 * m.per_step["dataloader_us"].sum() / m.per_step["dur_us"].sum()
    f = next(f for f in report.findings if f.topic == "dataloader-stall")
    assert abs(f.impact.est_step_saving_pct - share) < 3, (f.impact.est_step_saving_pct, share)


def _gemm_trace(device, compute, gemm):
    b = TraceBuilder(device=device, compute=compute)
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel(gemm, 800)
                b.kernel("void at::native::vectorized_elementwise_kernel<4, relu>", 40)
            b.sync()
    b.finish()
    return b


def test_no_tensor_cores_fires_for_sgemm_on_ampere(load_built):
    report = analyze(_gemm_trace("NVIDIA A100-SXM4-80GB", (8, 0), "ampere_sgemm_128x64_nn"), load_built)
    f = next(f for f in report.findings if f.topic == "no-tensor-cores")
    assert "TF32" in f.recommendation or "tf32" in f.recommendation.lower()
    assert f.impact.est_step_saving_pct > 10


def test_no_tensor_cores_silent_on_pascal(load_built):
    report = analyze(_gemm_trace("Tesla P100-PCIE-16GB", (6, 0), "maxwell_sgemm_128x64_nn"), load_built)
    assert "no-tensor-cores" not in topics(report)


def test_no_tensor_cores_silent_on_pascal_without_a_name(load_built):
    # compute capability alone decides, even with an sgemm name and no recognisable device name
    report = analyze(_gemm_trace("GPU 0", (6, 1), "sgemm_128x64_nn"), load_built)
    assert "no-tensor-cores" not in topics(report)


@pytest.mark.parametrize("gemm", [
    "ampere_tf32_s1688gemm_64x64_nn",
    "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4",
    "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel",
])
def test_no_tensor_cores_silent_with_tf32_kernels(load_built, gemm):
    report = analyze(_gemm_trace("NVIDIA A100-SXM4-80GB", (8, 0), gemm), load_built)
    assert "no-tensor-cores" not in topics(report)


def test_no_tensor_cores_volta_advice_is_fp16(load_built):
    report = analyze(_gemm_trace("Tesla V100-SXM2-16GB", (7, 0), "volta_sgemm_128x64_nn"), load_built)
    f = next(f for f in report.findings if f.topic == "no-tensor-cores")
    assert "fp16" in f.message + f.recommendation
    assert "no TF32" in f.recommendation


def test_capture_problem_without_cuda_activity(load_built):
    """deviceProperties present, no GPU events, no runtime calls: profiled without ProfilerActivity.CUDA."""
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            with b.op("aten::linear"):
                b.idle(2_000)
            b.cpu("aten::relu", 300)
    model = load_built(b)
    assert model.meta.devices and model.gpu.empty and model.runtime.empty
    report = analyze_model(model)
    capture = [f for f in report.findings if f.topic == "capture-problem"]
    assert len(capture) == 1
    assert "ProfilerActivity.CUDA" in capture[0].message + capture[0].recommendation
    assert capture[0].severity == "high"
    assert "low-gpu-utilization" not in topics(report)


def test_capture_problem_for_cpu_only_run_is_info(load_built):
    b = TraceBuilder(device=None)
    with b.step():
        b.cpu("aten::linear", 1_000)
    report = analyze(b, load_built)
    capture = [f for f in report.findings if f.topic == "capture-problem"]
    assert [f.severity for f in capture] == ["info"]
    assert "low-gpu-utilization" not in topics(report)


def test_capture_problem_for_truncated_trace(tmp_path):
    b = TraceBuilder()
    for _ in range(3):
        with b.step():
            for _ in range(20):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 500)
            b.sync()
    path = b.write(tmp_path / "full.json")
    data = path.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: int(len(data) * 0.6)])
    report = analyze_model(load_trace(cut))
    capture = [f for f in report.findings if f.topic == "capture-problem"]
    assert capture and any("cut" in f.message or "mid-event" in f.message for f in capture)


def _sync_trace(with_step_syncs: bool) -> TraceBuilder:
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            if with_step_syncs:
                b.sync()
            b.idle(2_000)  # python work after the sync, during which the GPU sits idle
    b.finish()
    return b


def test_host_sync_ignores_profiler_final_sync(load_built):
    report = analyze(_sync_trace(with_step_syncs=False), load_built)
    assert "host-sync" not in topics(report)


def test_host_sync_fires_for_syncs_inside_steps(load_built):
    report = analyze(_sync_trace(with_step_syncs=True), load_built)
    f = next(f for f in report.findings if f.topic == "host-sync")
    # the four in-step syncs, never the profiler's own
    assert f.evidence.numbers["blocking_calls"] == 4
    assert f.impact.est_step_saving_pct > 1


def test_host_sync_attributes_item_to_its_op(load_built):
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            b.item()
            b.idle(2_000)
    b.finish()
    report = analyze(b, load_built)
    f = next(f for f in report.findings if f.topic == "host-sync")
    assert f.evidence.numbers["scalar_reads"] >= 4
    assert any(item["op"] == "aten::_local_scalar_dense" for item in f.evidence.items)


def test_rule_failure_is_reported_not_fatal(load_built):
    """A rule that raises costs only its own finding; the note names it."""

    class Broken(type(RULES[0])):
        code, name = "GA999", "broken"

        def check(self, a):
            raise ValueError("boom")

    b = find_rule("low-gpu-utilization").positive()
    report = analyze_model(load_built(b), rules=[Broken(), find_rule("low-gpu-utilization")])
    assert "low-gpu-utilization" in topics(report)
    assert any("GA999" in n and "boom" in n for n in report.notes)


def test_job_rule_failure_is_reported_not_fatal(tmp_path):
    """A job-level rule that raises costs only its own finding; the job's notes name it."""
    from gpuadvise.fixtures.builder import write_job_folder

    class Broken(type(find_rule("straggler"))):
        code, name = "GA998", "broken-job-rule"

        def check(self, a):
            raise ValueError("boom")

    folder = write_job_folder(tmp_path / "job", ranks=2, straggler=1, steps=2)
    reports = analyze_paths([str(folder)], rules=[Broken(), find_rule("straggler")])
    assert [f.rule for f in reports.job.findings] == ["GA130"]
    assert any("GA998" in n and "boom" in n for n in reports.job.notes)


def test_job_rules_do_not_run_on_one_trace(load_built):
    """Single-trace analysis is unchanged: the ranks rules need two ranks or more."""
    for rule in (find_rule("straggler"), find_rule("comm-overlap")):
        one_rank = rule.positive().ranks[0]
        report = analyze_model(load_built(one_rank))
        assert rule.topic not in topics(report)

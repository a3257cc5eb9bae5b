"""The rule catalog: documentation contract, registry, each rule's own fixtures, finding shape, and
targeted behaviours a user relies on."""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuadvise.analyzer.model.findings import SEVERITIES

import gpuadvise.rules as rules_pkg
from gpuadvise.analyzer.model.report import all_findings
from gpuadvise.analyzer.run.engine import analyze_paths
from gpuadvise.analyzer.run.single import analyze_model, analyze_snapshot
from gpuadvise.analyzer.model.findings import Evidence, Impact
from _cli_support import evidence_parts, python_reprs
from gpuadvise.analyzer.report import evidence
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.read.snapshot import load_snapshot
from gpuadvise.fixtures.builder import RankFolder, TraceBuilder
from gpuadvise.fixtures.longrun import RunFolder
from gpuadvise.rules import all_rules, find_rule
from gpuadvise.rules.base import JobRule, Rule

RULES = all_rules()
IDS = [r.name for r in RULES]
HEADINGS = ("## What it detects", "## Why it matters", "## Fix", "## Thresholds")
SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


@pytest.fixture(scope="module")
def fixture_reports(tmp_path_factory):
    """Every rule's positive and negative fixture, written as .json.gz (a memory snapshot as .pickle, a
    job-level rule's ranks as a folder, a trace with run.json facts as a run folder, a long run as its run
    folder with a step record), loaded and analysed once, the way `gpuadvise analyze` reads it."""
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
            if isinstance(builder, RunFolder):  # a long run: its windows' findings and the run-level ones
                reports = analyze_paths([str(path)], jobs=1)
                assert len(reports.long_runs) == 1, f"{rule.name} {kind}: the folder has no step record"
                cache[key] = SimpleNamespace(findings=all_findings(reports),
                                             notes=[n for r in reports for n in r.notes] + reports.long_runs[0].notes)
            elif path.is_dir():  # several ranks: the per-rank findings and the job's, as one report
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


def test_job_rules_have_their_own_type():
    """Rules on the job view are JobRules: they require the ranks and build rank folders as fixtures;
    every other rule reads one trace or snapshot and never asks for ranks."""
    job = [r for r in RULES if r.job_level]
    assert {r.name for r in job} >= {"straggler", "comm-overlap"}
    for r in RULES:
        assert isinstance(r, JobRule) == r.job_level
        assert ("ranks" in r.requires) == r.job_level, r.name
    for r in job:
        assert isinstance(r.positive(), RankFolder) and isinstance(r.negative(), RankFolder)


def test_job_rule_cannot_ask_for_a_single_trace():
    with pytest.raises(TypeError, match="job rule"):
        type("Broken", (JobRule,), {"code": "GA999", "name": "broken", "requires": ("trace",)})


def test_topic_defaults_to_name():
    plain = type("Plain", (Rule,), {"code": "GA998", "name": "plain-rule"})()
    grouped = type("Grouped", (Rule,), {"code": "GA997", "name": "grouped-rule", "topic": "memory"})()
    assert plain.topic == "plain-rule" and grouped.topic == "memory"


def test_job_rules_run_through_the_engine(fixture_reports):
    """The engine finds JobRules in the catalog and runs them on a rank folder (no explicit rule list)."""
    for r in (r for r in RULES if r.job_level):
        assert r.topic in topics(fixture_reports(r, "positive"))


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


def test_every_fixture_run_folder_agrees_with_its_trace_alone(fixture_reports):
    """Each fixture written as a run folder (a trace with run.json facts), analysed once more from its
    trace alone: the same topics and savings within 5 points, but for docs/rule-api.md's list of topics
    that need run.json."""
    from _trace_alone import disagreements, needs_run_json, saving_needs_run_json

    listed = needs_run_json() | saving_needs_run_json()
    assert listed <= {r.topic for r in RULES}, f"docs/rule-api.md lists no such topic: {listed - {r.topic for r in RULES}}"
    found, folders = [], 0
    for rule in RULES:
        for kind in ("positive", "negative"):
            report = fixture_reports(rule, kind)
            source = getattr(report, "source", None)
            if not source or not (Path(source).parent / "run.json").is_file():
                continue
            folders += 1
            alone = all_findings(analyze_paths([source], jobs=1))
            found += disagreements(report.findings, alone, f"{rule.name} {kind}")
    assert folders >= 8, "the rule fixtures written as run folders went missing"
    assert not found, "\n".join(found)


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
    # By severity first (an [info] note never stands above a [low] finding), then within a severity
    # predictions of fixes biggest first; a symptom's ceiling (upper_bound) never outranks a cause that
    # explains at least half of it, and otherwise sits where its figure puts it.
    ranks = [SEVERITIES.index(f.severity) for f in report.findings]
    assert ranks == sorted(ranks)
    for sev in SEVERITIES:
        group = [f for f in report.findings if f.severity == sev]
        causes = [f for f in group if not f.impact.upper_bound]
        savings = [f.impact.est_step_saving_pct for f in causes]
        assert savings == sorted(savings, reverse=True)
        for i, f in enumerate(group):
            if f.impact.upper_bound:
                before = group[:i]
                after = [g for g in group[i + 1:] if not g.impact.upper_bound]
                assert all(g.impact.est_step_saving_pct < 0.5 * f.impact.est_step_saving_pct or
                           g.impact.est_step_saving_pct <= max((b.impact.est_step_saving_pct for b in before), default=100.0)
                           for g in after)
                assert all(b.impact.est_step_saving_pct >= 0.5 * f.impact.est_step_saving_pct or
                           b.impact.est_step_saving_pct >= f.impact.est_step_saving_pct for b in before if not b.impact.upper_bound)


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_every_renderer_shows_the_evidence_in_words(rule, fixture_reports):
    """The rule's positive-fixture findings (a job rule's: its ranks' and the job's) in the text,
    markdown and HTML reports and the TUI's finding pane: labels and units, never a repr; the JSON keeps
    the evidence's keys."""
    import json as json_module

    from gpuadvise.analyzer.model.report import TraceReport
    from gpuadvise.analyzer.report import html_report, json as json_report, markdown, text
    from gpuadvise.tui.finding_markdown import finding_markdown

    findings = list(fixture_reports(rule, "positive").findings)
    reports = [TraceReport(source="train", rank=None, model=None, metrics=None, findings=findings, kind="snapshot")]
    shown = {"markdown": evidence_parts(markdown.render(reports)),
             "HTML": evidence_parts(html_report.render(reports).split("<body", 1)[-1]),
             "pane": [part for f in findings for part in evidence_parts(finding_markdown(f))],
             # the terminal summary quotes a finding's source lines and its job-wide saving
             "text": [line for line in text.render(reports, top=len(findings)).splitlines()
                      if line.startswith(("   at ", "   on every rank"))]}
    assert len(shown["markdown"]) == len(shown["pane"]) == sum(1 for f in findings if _has_evidence(f.evidence))
    for name, parts in shown.items():
        for part in parts:
            assert not python_reprs(part), f"{rule.name} {name}: {python_reprs(part)}\n{part}"
    for f, part in zip([f for f in findings if _has_evidence(f.evidence)], shown["pane"]):
        for key, value in f.evidence.numbers.items():  # every named number is shown, under its label
            assert evidence.named(key, value)[0] in part.replace("\\", ""), (key, part)
    kept = {k for f in json_module.loads(json_report.render(reports))["findings"] for k in f["evidence"]["numbers"]}
    assert kept == {k for f in findings for k in f.evidence.numbers}


def _has_evidence(e) -> bool:
    return bool(e.steps or e.time_ranges_ms or e.sources or e.numbers)


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


def test_dataloader_waits_shorter_than_a_workers_hand_over_get_no_workers(load_built):
    """A 0.5 ms wait per batch in a 5 ms step (10 %): receiving a ready batch from a worker can take 2 ms, so
    the replay says workers would cost time; nothing is predicted from them and neither the advice nor the
    fix block asks for them."""
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu(SINGLE, 500)
            for _ in range(15):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            b.sync()
    b.finish()
    f = next(f for f in analyze(b, load_built).findings if f.topic == "dataloader-stall")
    assert f.impact.est_step_saving_pct == 0 and f.severity == "low"
    assert "workers would not pay" in f.advice and "use num_workers=" not in f.advice.lower()
    assert "num_workers=" not in f.fix.split("```python", 1)[1].split("```", 1)[0]


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
    """Control for the test above: with nothing to overlap, the saving is close to the share, less what
    workers cannot take from the training process: the hand-over of each ready batch (its upper end, 2 ms
    of each 20 ms wait)."""
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
    handover = 2.0 / 20.0  # of each wait
    assert abs(f.impact.est_step_saving_pct - share * (1 - handover)) < 3, (f.impact.est_step_saving_pct, share)


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
    # the fix block is the one this GPU can run: fp16 with its scaler, no bf16 or TF32 lines
    assert "dtype=torch.float16" in f.fix and "GradScaler" in f.fix
    assert "bfloat16" not in f.fix and "set_float32_matmul_precision" not in f.fix and "allow_tf32" not in f.fix
    ampere = analyze(_gemm_trace("NVIDIA A100-SXM4-80GB", (8, 0), "ampere_sgemm_128x64_nn"), load_built)
    g = next(f for f in ampere.findings if f.topic == "no-tensor-cores")
    assert "dtype=torch.bfloat16" in g.fix and "set_float32_matmul_precision" in g.fix


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
    """The job rules need two ranks or more: one rank's trace gets none of their findings (what its
    trace alone shows of its collectives is exposed-comm's: tests/test_exposed_comm.py)."""
    for rule in (find_rule("straggler"), find_rule("comm-overlap")):
        one_rank = rule.positive().ranks[0]
        report = analyze_model(load_built(one_rank))
        assert rule.code not in {f.rule for f in report.findings}


# ----------------------------------------------------------------------------------------------------
# Savings from the mechanism of each fix (the H100 pairs' lessons), on fixtures with known numbers


H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
GEMM_TC = "ampere_tf32_s1688gemm_64x64_nn"


def test_no_tensor_cores_on_h100_without_shapes_takes_the_gemms_as_memory_bound(load_built):
    # GPU-bound: per step 20 × (800 µs fp32 SIMT GEMM + 40 µs elementwise), no shapes recorded: the GEMMs'
    # roofline is unknown. The headline takes them as memory-bound (bf16 moves half the bytes: 400 µs; TF32
    # the same bytes: 800 µs), the elementwise kernel at 0.6× under autocast; the range's top is a large
    # GEMM's: the peak ratio (989.4 vs 66.9 TFLOP/s) times the large-GEMM efficiencies (78 % vs 77 %)
    from gpuadvise.analyzer.measure.efficiency.precision import AUTOCAST_MEMORY_FACTOR as HALF, LARGE_GEMM_EFFICIENCY as E

    report = analyze(_gemm_trace(*H100, "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_ffma_kernel"),
                     load_built)
    f = next(f for f in report.findings if f.topic == "no-tensor-cores")
    bf16 = 100 * (1 - (800 / 2 + 40 * HALF) / 840)
    bf16_large = 100 * (1 - (800 * 66.9 * E["fp32"] / (989.4 * E["bf16"]) + 40 * HALF) / 840)
    tf32_large = 100 * (1 - (800 * 66.9 * E["fp32"] / (494.7 * E["tf32"]) + 40) / 840)
    by_fix = f.evidence.numbers["saving_by_fix_pct"]
    assert f.impact.est_step_saving_pct == by_fix["bf16"] == pytest.approx(bf16, abs=1)
    assert by_fix["tf32"] < 1
    ranges = f.evidence.numbers["saving_range_by_fix_pct"]
    assert ranges["bf16"][1] == pytest.approx(bf16_large, abs=1) and ranges["tf32"][1] == pytest.approx(tf32_large, abs=1)
    assert f.impact.range_pct[1] == pytest.approx(bf16_large, abs=1)
    assert "989.4" in f.impact.basis and "494.7" in f.impact.basis and "roofline is unknown" in f.impact.basis
    assert "autocast" in f.recommendation and "set_float32_matmul_precision" in f.recommendation


def _shaped_gemm_loop(device, compute, dims=((4096, 4096), (4096, 4096)), steps: int = 4) -> TraceBuilder:
    """GPU-bound steps of fp32 SIMT GEMMs whose shapes are recorded (aten::mm of `dims`), each at 77 % of
    the device's fp32 peak."""
    from gpuadvise.analyzer.model.devices import spec
    from gpuadvise.analyzer.model.trace import Device

    (m, k), (_, n) = dims
    us = 2.0 * m * k * n / (spec(Device(0, device, *compute)).fp32 * 0.77 * 1e6)
    b = TraceBuilder(device=device, compute=compute)
    for _ in range(steps):
        with b.step():
            for _ in range(4):
                with b.op("aten::mm", **{"Input Dims": [list(d) for d in dims], "Input type": ["float", "float"]}):
                    b.kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize256x128x8_stage3_ffma_kernel", us)
            b.sync()
    b.finish()
    return b


@pytest.mark.parametrize("device, compute", [H100, ("NVIDIA A100-SXM4-80GB", (8, 0))])
def test_tf32_and_bf16_predictions_differ_by_the_documented_ratio(load_built, device, compute):
    # large GEMMs with known FLOPs and nothing else on the GPU: what each fix leaves of the step is the GEMMs'
    # time at that dtype's peak × large-GEMM efficiency, so the two remainders stand in that ratio
    from gpuadvise.analyzer.measure.efficiency.precision import LARGE_GEMM_EFFICIENCY as E
    from gpuadvise.analyzer.model.devices import spec
    from gpuadvise.analyzer.model.trace import Device

    f = next(f for f in analyze(_shaped_gemm_loop(device, compute), load_built).findings if f.topic == "no-tensor-cores")
    by_fix = f.evidence.numbers["saving_by_fix_pct"]
    row = spec(Device(0, device, *compute))
    documented = (row.bf16 * E["bf16"]) / (row.tf32 * E["tf32"])  # about 1.93 on both
    assert (100 - by_fix["tf32"]) / (100 - by_fix["bf16"]) == pytest.approx(documented, rel=0.03)
    assert f.evidence.numbers["flops_known_share_pct"] == 100.0
    assert f.evidence.numbers["simt_achieved_tflops"] == pytest.approx(row.fp32 * 0.77, rel=0.01)
    assert f.impact.range_pct == [by_fix["tf32"], by_fix["bf16"]]  # known FLOPs: the range is the fixes


def test_a_skinny_gemm_is_bound_by_its_bytes_on_the_matrix_units(load_built):
    # 8192×8192 times 8192×64: 8.6 GFLOP over 136 MB of bf16 operands (63 FLOP/byte). In fp32 SIMT it is
    # compute-bound (167 µs at 77 % of 66.9 TFLOP/s); on the bf16 Tensor Cores moving its operands takes
    # longer than its math: the prediction is the roofline's (bytes / bandwidth), not the peak ratio's
    from gpuadvise.analyzer.measure.efficiency.roofline import MEMORY_EFFICIENCY

    b = _shaped_gemm_loop(*H100, dims=[[8192, 8192], [8192, 64]])
    f = next(f for f in analyze(b, load_built).findings if f.topic == "no-tensor-cores")
    fp32_us = 2 * 8192 * 8192 * 64 / (66.9 * 0.77 * 1e6)
    bytes_bf16 = (8192 * 8192 + 8192 * 64 + 8192 * 64) * 2
    roofline_us = bytes_bf16 / (3350 * MEMORY_EFFICIENCY * 1e3)
    left = 100 - f.evidence.numbers["saving_by_fix_pct"]["bf16"]
    assert left == pytest.approx(100 * roofline_us / fp32_us, abs=3)  # GPU-bound: only the GEMMs in the step


def test_fp8_is_predicted_only_where_an_fp8_library_is_in_use(load_built):
    plain = _shaped_gemm_loop(*H100)
    f = next(f for f in analyze(plain, load_built).findings if f.topic == "no-tensor-cores")
    assert "fp8" not in f.evidence.numbers["saving_by_fix_pct"]
    with_te = _shaped_gemm_loop(*H100)
    with_te.cpu("transformer_engine::fp8_autocast", 20)  # Transformer Engine's ops show in the trace
    with_te.finish()
    by_fix = next(f for f in analyze(with_te, load_built).findings if f.topic == "no-tensor-cores").evidence.numbers[
        "saving_by_fix_pct"]
    assert by_fix["fp8"] > by_fix["bf16"] > by_fix["tf32"]
    # an A100 has no fp8 path, whatever library the script imports
    a100 = _shaped_gemm_loop("NVIDIA A100-SXM4-80GB", (8, 0))
    a100.cpu("transformer_engine::fp8_autocast", 20)
    a100.finish()
    assert "fp8" not in next(f for f in analyze(a100, load_built).findings
                             if f.topic == "no-tensor-cores").evidence.numbers["saving_by_fix_pct"]


def test_turing_is_never_told_to_turn_on_tf32(load_built):
    for device in ("Tesla T4", "NVIDIA GeForce RTX 2080 Ti"):
        f = next(f for f in analyze(_gemm_trace(device, (7, 5), "turing_sgemm_128x64_nn"), load_built).findings
                 if f.topic == "no-tensor-cores")
        assert set(f.evidence.numbers["saving_by_fix_pct"]) == {"fp16"}
        assert "no TF32" in f.advice and "set_float32_matmul_precision" not in f.advice
        assert "float16" in f.advice


def test_no_tensor_cores_hidden_behind_cpu_work_is_informational(load_built):
    b = TraceBuilder(*H100)
    for _ in range(4):
        with b.step():
            for _ in range(20):
                b.kernel("ampere_sgemm_128x64_nn", 20)
                b.idle(500)  # the Python loop, not the GEMMs, sets the pace
            b.sync()
    b.finish()
    f = next(f for f in analyze(b, load_built).findings if f.topic == "no-tensor-cores")
    assert f.severity == "info" and f.impact.est_step_saving_pct < 1


def _aligned_and_not(n_odd: int, n_even: int) -> TraceBuilder:
    b = TraceBuilder(*H100)
    types = {"Input type": ["c10::BFloat16", "c10::BFloat16"]}
    for _ in range(3):
        with b.step():
            for _ in range(n_odd):
                with b.op("aten::mm", **types, **{"Input Dims": [[4096, 4095], [4095, 4096]]}):
                    b.kernel("cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_tn_align1", 1_000)
            for _ in range(n_even):
                with b.op("aten::mm", **types, **{"Input Dims": [[4096, 4096], [4096, 4096]]}):
                    b.kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", 200)
            b.sync()
    b.finish()
    return b


def test_matmul_alignment_speeds_odd_gemms_to_the_aligned_ones_in_the_trace(load_built):
    # 4 odd GEMMs of 1000 µs and 4 aligned ones of the same size at 200 µs per step: once padded, the odd
    # ones take 200 µs too, and the GPU-bound step falls from 4800 to 1600 µs
    f = next(f for f in analyze(_aligned_and_not(4, 4), load_built).findings if f.topic == "matmul-alignment")
    assert f.evidence.numbers["aligned_tflops"] == pytest.approx(2 * 4096**3 / 200e-6 / 1e12, rel=0.01)
    assert f.impact.est_step_saving_pct == pytest.approx(100 * (1 - 1_600 / 4_800), abs=3)
    assert "in this trace" in f.impact.basis and f.impact.range_pct is None


def test_matmul_alignment_without_aligned_gemms_uses_the_device_peak_with_a_range(load_built):
    f = next(f for f in analyze(_aligned_and_not(4, 0), load_built).findings if f.topic == "matmul-alignment")
    # 137 GFLOP at 75 % of 989 TFLOP/s: 185 µs instead of 1000
    assert f.impact.est_step_saving_pct == pytest.approx(100 * (1 - 185 / 1_000), abs=3)
    low, high = f.impact.range_pct
    assert low < f.impact.est_step_saving_pct <= high
    assert "989" in f.impact.basis


def test_pageable_copies_get_the_bandwidth_of_the_traces_pinned_ones(load_built):
    b = TraceBuilder(*H100)
    for _ in range(4):
        with b.step():
            b.copy("HtoD", "Pageable", "Device", nbytes=50 << 20, dur=5_000)  # 10 GB/s
            b.copy("HtoD", "Pinned", "Device", nbytes=50 << 20, dur=1_000, blocking=False)  # 52 GB/s
            for _ in range(10):
                b.kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", 100)
            b.sync()
    b.finish()
    f = next(f for f in analyze(b, load_built).findings if f.topic == "pageable-memcpy")
    assert f.evidence.numbers["pinned_gbps"] == pytest.approx((50 << 20) / 1_000 / 1e3, rel=0.01)
    assert "measured on 4 pinned copies" in f.impact.basis
    # step: 5000 (blocked CPU + copy) + 1000 + 1000 of GPU work → the copy at 1000 µs: 3000 of ≈ 7000
    assert f.impact.est_step_saving_pct == pytest.approx(100 * 4_000 / 7_000, abs=4)


def test_allocator_churn_range_spans_the_profilers_cpu_slowdown(load_built):
    # per step: cudaMalloc 300 µs, 6 ms of Python, 20 × 200 µs of GPU work, a sync, cudaFree 800 µs
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu("cudaMalloc", 300, cat="cuda_runtime")
            b.idle(6_000)
            for _ in range(20):
                b.kernel(GEMM_TC, 200)
            b.sync()
            b.cpu("cudaFree", 800, cat="cuda_runtime")
    b.finish()
    f = next(f for f in analyze(b, load_built).findings if f.topic == "allocator-churn")
    low, high = f.impact.range_pct
    # as traced: a step of 300 + 6000 + 10 + 4000 + 2 + 800 µs loses its 1100 µs of calls
    assert low == pytest.approx(100 * 1_100 / 11_112, abs=1)
    # the Python and launch work 2.4× faster, the driver calls as they are: 300 + 2500 + ~7 + 4000 + 800
    assert high == pytest.approx(100 * 1_100 / 7_609, abs=1)
    assert f.impact.est_step_saving_pct == high
    assert "typical profiler cost taken off" in f.impact.basis and "2.4×" in f.impact.basis


def test_launch_bound_behind_a_dataloader_is_a_share_of_todays_step(load_built):
    b = TraceBuilder(launch_us=12.0)
    for _ in range(4):
        with b.step():
            b.cpu(SINGLE, 40_000)
            for _ in range(200):
                b.kernel("void at::native::vectorized_elementwise_kernel<4, add>", 3)
                b.idle(8)
            b.sync()
    b.finish()
    report = analyze(b, load_built)
    dl = next(f for f in report.findings if f.topic == "dataloader-stall")
    lb = next(f for f in report.findings if f.topic == "launch-bound")
    assert lb.impact.after == "dataloader-stall"
    after_fix = lb.evidence.numbers["saving_after_loader_fix_pct"]
    # today's step is ≈ 44 ms, 40 of them loading: what the launch fix adds is a small share of it, and the
    # same time is a large share of the ≈ 4 ms step the loader fix leaves
    assert lb.impact.est_step_saving_pct < 10 < after_fix
    assert lb.impact.est_step_saving_pct == pytest.approx(after_fix * (1 - dl.impact.est_step_saving_pct / 100), abs=1)
    assert "once the loader is fixed" in lb.message
    assert report.findings.index(dl) < report.findings.index(lb)


def test_launch_bound_asks_for_a_fused_optimizer_only_where_the_trace_trains(load_built):
    from gpuadvise.rules.launch_bound import tiny_kernels

    trains = next(f for f in analyze(tiny_kernels(optimizer=True), load_built).findings if f.topic == "launch-bound")
    infers = next(f for f in analyze(tiny_kernels(), load_built).findings if f.topic == "launch-bound")
    assert "fused=True" in trains.fix and "fused=True" not in infers.fix
    # no DataLoader in either: no loader fix for the saving to come after
    for f in (trains, infers):
        assert "input pipeline" not in f.impact.basis.split("(CUDA graphs / torch.compile)")[1]
        assert "saving_after_loader_fix_pct" not in f.evidence.numbers


def test_low_utilization_says_what_the_cpu_did_meanwhile(fixture_reports):
    report = fixture_reports(find_rule("dataloader-stall"), "positive")
    f = next(f for f in report.findings if f.topic == "low-gpu-utilization")
    first = f.evidence.numbers["cpu_during_idle"][0]
    # each step: 20 ms in the DataLoader while the GPU waits, then 40 kernels that keep it busy
    assert first["kind"] == "dataloader" and first["ms_per_step"] == pytest.approx(20.0, abs=0.1)
    assert "DataLoader wait" in f.message and "median per step" in f.message and "20.00 ms (" in f.message


def _fragmented_report(facts):
    snap = find_rule("memory-fragmentation").positive().to_dict()
    return analyze_snapshot(snap, facts=facts)


@pytest.mark.parametrize("capacity_gib,retries,severity", [
    (80, 0, "info"),  # 3.75 GiB of an 80 GiB GPU: the holes cost nothing
    (12, 0, "low"),
    (4.5, 0, "medium"),  # 83 %
    (4, 0, "high"),  # 94 %: the holes are memory the run needs
    (80, 2, "high"),  # cudaMalloc retries: memory ran short
    (None, 0, "low"),  # unknown capacity
])
def test_fragmentation_is_graded_by_how_short_memory_is(capacity_gib, retries, severity):
    facts = {"capture": {"memory_stats": {"num_alloc_retries": retries}}}
    if capacity_gib is not None:
        facts["environment"] = {"device": {"name": "GPU", "total_memory": int(capacity_gib * 2**30)}}
    f = next(f for f in _fragmented_report(facts).findings if f.topic == "memory-fragmentation")
    assert f.severity == severity, f.message

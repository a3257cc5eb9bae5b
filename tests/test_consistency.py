"""Consistency: over every trace and snapshot of the shared corpus (`../shared/traces`, or
$GPUADVISE_TRACES; skipped without it) and over every rule's own fixtures, properties a performance
engineer checks at once, never values:

- text, markdown, JSON and HTML state the same figures (headline saving, severity, the message's numbers,
  the device);
- no recommendation prescribes an allocator setting the input records as already set, nor asks for any
  switch (torch.compile, autocast, TF32, pinned memory, workers, a fused optimizer, channels_last, CUDA
  graphs, …) that the input shows on, by run.json or by the trace (analyzer/measure/settings/switches_on.py);
- no recommended fix is advertised at a zero saving;
- a finding that quotes the median step quotes the report's own (the same steps), and dataloader-stall's
  share is its median wait over its median step;
- a step length a finding's message quotes is the header's median step (never a mean step), and figures
  per step agree with the per-step table by the same statistic (no per-step figure above what the steps
  hold, no window total quoted as per step);
- a figure a finding quotes per step is the median over the steps, and its evidence says so (host-sync's
  blocked time per step is the per-step table's median sync time, never a total divided by the steps);
- findings are ordered by severity, then saving;
- a snapshot of several devices reports every one of them;
- one figure, one computation (tests/_figures_support.py): across the text, markdown and JSON reports and the
  TUI's tables, a quantity stated twice has one value, a percent the sign its word says, a ratio the
  verdict it gets, and ranges side by side do not overlap (the job rules' fixtures too).

Each input is analysed once per test process (a corpus file's analysis is shared with test_corpus.py,
tests/_corpus_support.py); the renders are cached with it.
"""

from __future__ import annotations

import html as htmlmod
import json
import re
from pathlib import Path

import pytest

from _cli_support import evidence_parts, library_pointers, python_reprs
from _corpus_support import SNAPSHOT_NAMES, TRACES, XDIST_GROUP, analysed as analysed_path, corpus_files
from _figures_support import problems as figure_problems
from gpuadvise.analyzer.model.findings import SEVERITIES
from gpuadvise.analyzer.run.engine import analyze_paths

pytestmark = pytest.mark.xdist_group(XDIST_GROUP)


def _fixtures() -> list[str]:
    from gpuadvise.rules import all_rules

    return [f"{r.name}:{side}" for r in all_rules() if getattr(r, "requires", ()) != ("ranks",)
            for side in ("positive", "negative")]


CORPUS = corpus_files()
FIXTURES = _fixtures()
_CACHE: dict[str, dict] = {}


def _job_fixtures() -> list[str]:
    """The job rules' positive fixtures (a job of 4 or 8 ranks each: 1.5–2.6 s to analyse, so not their
    negatives too; the end-to-end torchrun tests check real jobs)."""
    from gpuadvise.rules import all_rules

    return [f"{r.name}:positive" for r in all_rules() if getattr(r, "requires", ()) == ("ranks",)]


def _input_path(key: str, tmp_root: Path) -> Path:
    if ":" not in key:
        return TRACES / key
    from gpuadvise.rules import all_rules

    name, side = key.split(":")
    rule = next(r for r in all_rules() if r.name == name)
    builder = getattr(rule, side)()
    if getattr(builder, "facts", None) is not None:  # with its run.json: the run folder `gpuadvise profile` leaves
        return builder.write_run_folder(tmp_root / f"{name}-{side}")
    path = tmp_root / f"{name}-{side}{getattr(builder, 'suffix', '.json')}"
    return builder.write(path) or path


def analysed(key: str, tmp_root: Path) -> dict:
    if key not in _CACHE:
        from gpuadvise.analyzer.report import render

        path = _input_path(key, tmp_root)
        reports = analysed_path(str(path)) if key in CORPUS else analyze_paths([str(path)], jobs=1)
        out = {fmt: render(reports, fmt, top=100) for fmt in ("text", "md", "json", "html")}
        out["doc"] = json.loads(out["json"])
        out["reports"] = list(reports)
        out["analysis"] = reports  # as analyze returns them (a job's view with them)
        out["path"] = path
        _CACHE[key] = out
    return _CACHE[key]


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return tmp_path_factory.mktemp("consistency")


def _marked(keys: list[str]) -> list:
    """The corpus files marked slow (their analyses are the cost of this module); the rules' fixtures quick."""
    return [pytest.param(k, marks=pytest.mark.slow) if k in CORPUS else k for k in keys]


INPUTS = _marked(CORPUS + FIXTURES)  # without the corpus, the rule fixtures alone


def _findings(a: dict) -> list[dict]:
    return a["doc"]["findings"]


NUMBER = re.compile(r"(?<![\w.#])\d+(?:\.\d+)?(?![\w.])")


@pytest.mark.parametrize("key", INPUTS)
def test_formats_state_the_same_figures(key, tmp_root):
    a = analysed(key, tmp_root)
    md, text = a["md"], a["text"]
    page = htmlmod.unescape(re.sub(r"<[^>]+>", "", a["html"]))
    flat_md = md.replace("\\", "")
    for f in _findings(a):
        saving = f"{f['impact']['est_step_saving_pct']:.1f}"
        assert f"**{saving} %" in md or f"**up to {saving} %" in md, (f["topic"], saving)
        assert f"{saving} %" in page, (f["topic"], saving)
        assert f"[{f['severity']}]" in text and f"**{f['severity']}**" in md
        # every figure the message states is in the markdown (and so in the HTML) as well
        for n in NUMBER.findall(f["message"]):
            assert n in flat_md, (f["topic"], n)
    for s in a["doc"].get("traces") or a["doc"].get("reports") or []:
        desc = s.get("device_description") if isinstance(s, dict) else None
        if desc:
            assert desc in text and desc in flat_md and desc in page


@pytest.mark.parametrize("key", INPUTS)
def test_no_recommendation_prescribes_a_recorded_setting(key, tmp_root):
    a = analysed(key, tmp_root)
    for r in a["reports"]:
        mem = r.memory
        if mem is None or not mem.allocator_settings.get("expandable_segments"):
            continue
        for f in r.findings:  # the instance's advice and the rule's general fix alike
            said = f.advice + "\n" + f.fix
            assert "expandable_segments:True" not in said, (f.topic, said)


def _facts_by_trace(path: Path) -> dict:
    from gpuadvise.analyzer.read.sources import resolve

    return {str(s.path): s.facts for s in resolve([str(path)])}


@pytest.mark.parametrize("key", INPUTS)
def test_no_recommendation_asks_for_a_switch_that_is_on(key, tmp_root):
    """Every finding's advice and fix (the instance's words and the rule's general block alike) against the
    switches the same input shows on: asking a user who compiled to compile, or to pin what is pinned, is
    advice they cannot act on."""
    from gpuadvise.analyzer.measure.analysis import Analysis
    from gpuadvise.analyzer.measure.settings.switches_on import asked_for, switches_on

    a = analysed(key, tmp_root)
    facts = _facts_by_trace(a["path"])
    for r in a["reports"]:
        if r.model is None or r.metrics is None:
            continue
        on = switches_on(Analysis(r.model, r.metrics, facts.get(r.source, {}), r.memory))
        for f in r.findings:
            said = f.advice + "\n" + f.fix
            wrong = {k: str(on[k]) for k in asked_for(said) if k in on}
            assert not wrong, (f.topic, wrong, said)


ZERO_FIX = re.compile(r"\(0(?:\.0)? ?% of the step\)|saves about 0(?:\.0)? ?%|saves 0(?:\.0)? ?%")


@pytest.mark.parametrize("key", INPUTS)
def test_no_fix_is_advertised_at_zero(key, tmp_root):
    a = analysed(key, tmp_root)
    for r in a["reports"]:
        for f in r.findings:
            advice = f.advice
            assert not ZERO_FIX.search(advice), (f.topic, advice)


@pytest.mark.parametrize("key", INPUTS)
def test_a_finding_quotes_the_reports_own_steps(key, tmp_root):
    for r, f in _step_findings(analysed(key, tmp_root), skip={"straggler"}):
        n = f.evidence.numbers
        if "median_step_ms" in n:
            assert n["median_step_ms"] == pytest.approx(r.metrics.median_step_us / 1e3, abs=0.02), f.topic
        if f.topic == "dataloader-stall":
            # the headline share is the median step's: its wait over its length (per-step spread aside)
            assert n["statistic"] == ("median step" if r.metrics.steps else "traced window")
            removable = n["median_dataloader_ms_per_step"] - n.get("handover_floor_ms", 0.0)  # beyond the hand-over
            ratio = 100 * removable / max(n["median_step_ms"], 1e-9)
            assert n["dataloader_share_pct"] == pytest.approx(ratio, rel=0.35, abs=1.0)


def _step_findings(a: dict, skip: set[str]):
    """(report, finding) for every finding of a report with step metrics, but those whose topic is in
    `skip` (job findings quote ranks' steps, not this report's)."""
    for r in a["reports"]:
        if r.metrics is None:
            continue
        for f in r.findings:
            if f.topic not in skip:
                yield r, f


@pytest.mark.parametrize("key", INPUTS)
def test_the_evidence_reads_in_words(key, tmp_root):
    """On real traces too (they reach evidence the fixtures do not), every finding's evidence in the
    markdown and HTML reports has labels and units, never a Python repr (_cli_support.python_reprs)."""
    out = analysed(key, tmp_root)
    for fmt in ("md", "html"):
        for part in evidence_parts(out[fmt].split("<body", 1)[-1]):
            assert not python_reprs(part), f"{key} {fmt}: {python_reprs(part)}\n{part[:600]}"


@pytest.mark.parametrize("key", INPUTS)
def test_findings_are_ordered_by_severity_then_saving(key, tmp_root):
    a = analysed(key, tmp_root)
    fs = [f for f in _findings(a)]
    ranks = [SEVERITIES.index(f["severity"]) for f in fs]
    assert ranks == sorted(ranks), [f["severity"] for f in fs]
    for sev in SEVERITIES:
        causes = [f["impact"]["est_step_saving_pct"] for f in fs if f["severity"] == sev and not f["impact"]["upper_bound"]]
        assert causes == sorted(causes, reverse=True), (sev, causes)


@pytest.mark.parametrize("key", _marked([k for k in CORPUS + FIXTURES if k.endswith(SNAPSHOT_NAMES) or "memory" in k]))
def test_every_snapshot_device_is_reported(key, tmp_root):
    from gpuadvise.analyzer.measure.memory import devices
    from gpuadvise.analyzer.read.snapshot import load_snapshot

    a = analysed(key, tmp_root)
    path = a["path"]
    if not path.name.endswith(SNAPSHOT_NAMES):
        pytest.skip("not a snapshot")
    mem = a["reports"][0].memory
    listed = {mem.snapshot.device} | {d["device"] for d in mem.other_devices}
    assert listed == set(devices(load_snapshot(path))) or not devices(load_snapshot(path))


# "mean step 246.1 ms", "each 22.3 ms step", "(5 steps, median 216.3 ms)", "3 step(s) of 4.0 ms (median)"
STEP_QUOTE = re.compile(r"(?:median|mean) step (\d+(?:\.\d+)?) ms|each (\d+(?:\.\d+)?) ms step"
                        r"|steps, median (\d+(?:\.\d+)?) ms|step\(s\) of (\d+(?:\.\d+)?) ms \(median\)")


@pytest.mark.parametrize("key", INPUTS)
def test_a_quoted_step_is_the_headers_median_step(key, tmp_root):
    for r, f in _step_findings(analysed(key, tmp_root), skip={"straggler"}):
        median_ms = r.metrics.median_step_us / 1e3
        assert "mean step" not in f.message, (f.topic, f.message)
        for hit in STEP_QUOTE.finditer(f.message):
            quoted = float(next(g for g in hit.groups() if g))
            assert quoted == pytest.approx(median_ms, abs=0.051), (f.topic, hit.group(0), median_ms)


@pytest.mark.parametrize("key", INPUTS)
def test_per_step_figures_agree_with_the_per_step_table(key, tmp_root):
    a = analysed(key, tmp_root)
    for r in a["reports"]:
        if r.metrics is None or r.figures is None:
            continue
        ps = r.metrics.per_step
        # the median step's idle split is no more than the idlest step holds (a window total would be)
        idle = r.figures.idle_breakdown_ms
        if idle:
            assert sum(idle.values()) <= float(ps["idle_us"].max()) / 1e3 + 0.01, (idle, float(ps["idle_us"].max()))
        for f in r.findings:
            for cause in f.evidence.numbers.get("cpu_during_idle") or []:
                if cause["kind"] == "dataloader":  # idle time inside the waits: at most the wait, step by step
                    assert cause["ms_per_step"] <= float(ps["dataloader_us"].median()) / 1e3 + 0.01, (f.topic, cause)


JOB_TOPICS = {"straggler", "comm-overlap"}  # they quote ranks' steps, by their own statistic


@pytest.mark.parametrize("key", INPUTS)
def test_a_per_step_figure_is_the_median_step(key, tmp_root):
    """A finding that quotes a figure per step names its statistic (the median over the steps, as the header's
    median step), and host-sync's blocked time per step and share agree with the per-step table's sync time
    by that statistic: a total divided by the number of steps sits above the median whenever one step
    blocks longer than the others."""
    import numpy as np

    for r, f in _step_findings(analysed(key, tmp_root), skip=JOB_TOPICS):
        n = f.evidence.numbers
        if "per step" in f.message:
            assert str(n.get("statistic", "")).startswith("median"), (f.topic, f.message)
        if f.topic == "host-sync" and r.metrics.steps:
            ps = r.metrics.per_step
            median_sync_ms = float(np.median(ps["sync_us"])) / 1e3
            assert n["blocked_ms_per_step"] == pytest.approx(median_sync_ms, rel=0.1, abs=0.05), \
                (n["blocked_ms_per_step"], median_sync_ms, float(ps["sync_us"].mean()) / 1e3)
            step_ms = r.metrics.median_step_us / 1e3
            assert n["blocked_share_pct"] == pytest.approx(100 * n["blocked_ms_per_step"] / step_ms, abs=0.15)


@pytest.mark.parametrize("key", INPUTS)
def test_every_pointer_is_into_the_users_code(key, tmp_root):
    """A file:line in a finding (its sources, its items' sites, its message and advice) is the user's frame,
    never a file inside torch, a framework or the standard library."""
    for f in _findings(analysed(key, tmp_root)):
        assert not library_pointers(f), (f["topic"], library_pointers(f))


@pytest.mark.parametrize("key", INPUTS + _job_fixtures())
def test_one_figure_one_computation(key, tmp_root):
    """Each quantity the reports state twice (a trace's median step, a rank's wait and time inside
    collectives, its DataLoader wait, its unprofiled step) has one value in the text, markdown and JSON
    reports and the TUI's tables; every percent has the sign its word says, every ratio the verdict it gets."""
    a = analysed(key, tmp_root)
    found = figure_problems(a["analysis"], {"text": a["text"], "md": a["md"], "json": a["json"]})
    assert not found, "\n".join(found)

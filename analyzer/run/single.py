"""One input, start to finish: a trace (with its run facts and allocator snapshot) or a snapshot on its
own → model → metrics and memory summary → every rule whose inputs exist → a `TraceReport`."""

from __future__ import annotations

import gc
import traceback
from contextlib import contextmanager
from functools import partial

from gpuadvise.analyzer.measure.settings import frameworks
from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.measure.compiled.cudagraphs import captured
from gpuadvise.analyzer.measure.memory import summarize
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.measure.settings.switches_on import (asked_for, conflict_notes, switches_on, with_conflicts_named,
                                                     without_what_is_on)
from gpuadvise.analyzer.model.findings import Finding, order
from gpuadvise.analyzer.model.report import TraceReport
from gpuadvise.analyzer.model.trace import TraceModel
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.read.merged import split_ranks
from gpuadvise.analyzer.read.snapshot import load_snapshot
from gpuadvise.analyzer.read.sources import Source

from . import rulequeue
from .figures import trace_figures


def analyze_model(model: TraceModel, facts: dict | None = None, source: str = "", rank: int | None = None,
                  rules=None, snapshot: dict | None = None) -> TraceReport:
    """One trace, with the allocator snapshot taken in the same run when there is one."""
    with _collecting_only_new_objects():
        return _analyze_model(model, facts, source, rank, rules, snapshot)


@contextmanager
def _collecting_only_new_objects():
    """While a trace is analysed, the objects that were there before (every imported module's, the
    caller's, the model's) are kept out of the cyclic collector's rounds (`gc.freeze`), and put back after
    (`gc.unfreeze`): the analysis makes enough objects to trigger dozens of collections, and each full one
    walked all of those again (about 40 ms per trace). Nothing is changed where something else froze
    objects first (a job's worker, a forking server): its freeze is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _analyze_model(model, facts, source, rank, rules, snapshot) -> TraceReport:
    metrics = compute(model)
    memory = summarize(snapshot, model, metrics, facts)
    analysis = Analysis(model, metrics, facts, memory)
    notes: list[str] = []
    if model.meta.events_skipped:
        notes.append(f"{model.meta.events_skipped} malformed events were skipped")
    if model.meta.unknown_categories:
        total = sum(model.meta.unknown_categories.values())
        notes.append(f"{total} events of unknown categories were ignored: "
                     + ", ".join(sorted(model.meta.unknown_categories)[:5]))
    if not metrics.steps and metrics.has_gpu:
        notes.append("no ProfilerStep annotations: the whole trace is treated as one step")
    if analysis.compiled is not None:  # how much of each step ran compiled
        notes.append(analysis.compiled.describe())
    graphs = captured(model).note()  # kernels CUDA graphs ran: attributed to the ops captured into them, or not
    if graphs:
        notes.append(graphs)
    # a switch run.json records as built that did not act in the recorded steps: the trace decides, and says so
    notes.extend(conflict_notes(analysis))
    rank = model.meta.rank if model.meta.rank is not None else rank
    # the summary figures are one more task beside the rules (the first, the longest: rulequeue.py)
    findings, (figures,) = run_rules(analysis, rules, source, rank, notes,
                                     beside=[lambda: trace_figures(model, metrics, analysis.calibration, facts,
                                                                   analysis.utilization)])
    calibration = analysis.calibration
    if calibration is not None and calibration.unprofiled_step_us is None and metrics.has_gpu:
        notes.append(calibration.describe())
    return TraceReport(source=source, rank=rank, model=model, metrics=metrics, findings=findings, notes=notes,
                       memory=memory, calibration=calibration, figures=figures)


def analyze_snapshot(snapshot: dict, facts: dict | None = None, source: str = "", rank: int | None = None,
                     rules=None) -> TraceReport:
    """A memory snapshot on its own: only the rules that need nothing but memory run."""
    memory = summarize(snapshot, facts=facts)
    notes: list[str] = []
    findings = run_rules(Analysis(None, None, facts, memory), rules, source, rank, notes)
    return TraceReport(source=source, rank=rank, model=None, metrics=None, findings=findings, notes=notes,
                       kind="snapshot", memory=memory)


def run_rules(analysis, rules, source: str | None, rank: int | None, notes: list[str],
              keep_rank: bool = False, beside: list | None = None):
    """Every rule whose inputs `analysis` has (`Rule.requires`); a rule that raises costs only its own
    findings. Job-level rules (`keep_rank`) name the rank and trace themselves.

    On a big trace a forked child takes rules from the same queue as this process (rulequeue.py): the
    findings and notes are the same, in the same order. `beside`: more work (callables) for the same
    queue, ahead of the rules; with it the result is `(findings, [what each returned])`."""
    from gpuadvise.rules import all_rules

    # a rule whose input is not here is left out (a trace rule on a snapshot, a memory rule without memory data)
    chosen = [rule for rule in rules or all_rules()
              if all(analysis.has(need) for need in getattr(rule, "requires", ("trace",)))]
    split = not keep_rank and _worth_splitting(analysis)
    if split:
        _shared_measures(analysis)  # built once, before the fork, for both processes
    extra = list(beside or [])
    tasks = extra + [partial(_run_one, analysis, rule, source, rank, keep_rank) for rule in chosen]
    # the summary figures and the costly rules are taken first (Rule.costly)
    first = list(range(len(extra))) + [len(extra) + i for i, rule in enumerate(chosen) if getattr(rule, "costly", False)]
    results = rulequeue.run_each(tasks, split, first)
    findings: list[Finding] = []
    for found, note in results[len(extra):]:
        if note is not None:
            notes.append(note)
        findings.extend(found)
    return (order(findings), results[:len(extra)]) if beside is not None else order(findings)


def _run_one(analysis, rule, source: str | None, rank: int | None, keep_rank: bool) -> tuple[list[Finding], str | None]:
    """One rule's findings, with the engine's additions, and the note saying it failed (None when it did not)."""
    try:
        found = rule.check(analysis)
    except Exception as exc:  # a rule bug must not cost the user the other findings
        if _debug():
            traceback.print_exc()
        return [], f"rule {rule.code} ({rule.name}) failed: {type(exc).__name__}: {exc}"
    if not keep_rank:
        for f in found:
            f.rank = rank
            f.trace = source
        _for_every_rank(analysis, found)
        _place_ranges(analysis, found)
        _fix_from_what_is_off(analysis, found)
        _fix_for_the_frameworks_used(analysis, found)
        _conflicts_named(analysis, found)
    return found, None


def _worth_splitting(analysis) -> bool:
    model = getattr(analysis, "model", None)
    return (isinstance(analysis, Analysis) and model is not None and analysis.metrics is not None
            and not _debug() and rulequeue.worth_splitting(model.meta.events_total))


def _shared_measures(analysis: Analysis) -> None:
    """What most rules and the report ask for, built before the rules are shared out: each process would
    otherwise build its own."""
    if analysis.replay is not None:
        analysis.calibration


def _place_ranges(analysis, found: list[Finding]) -> None:
    """The step each evidence time range lies in (the ProfilerSteps' CPU spans, those left out of the
    figures included), for the renderers to show the ranges beside their steps."""
    metrics = getattr(analysis, "metrics", None)
    if metrics is None:
        return
    every = list(metrics.steps) + list(getattr(metrics, "left_out_steps", []) or [])
    spans = [(s.number, s.start / 1e3, s.end / 1e3) for s in every]
    if not spans:
        return
    for f in found:
        if f.evidence.time_ranges_ms:
            f.evidence.place_ranges(spans)


def _fix_from_what_is_off(analysis, found: list[Finding]) -> None:
    """No fix block asks for a switch the input shows on (run.json or the trace: measure/settings/switches_on.py):
    its lines that would are left out of the finding's fix."""
    if not found or not isinstance(analysis, Analysis) or not any(asked_for(f.fix) for f in found):
        return  # nothing a fix asks for: the table is not read
    on = switches_on(analysis)
    for f in found:
        f.fix = without_what_is_on(f.fix, on)


def _fix_for_the_frameworks_used(analysis, found: list[Finding]) -> None:
    """A fix's paragraph for a framework's own switch (transformers' Trainer, Lightning, Accelerate) only where
    the run used that framework (run.json or the trace: measure/settings/frameworks.py)."""
    if not any(frameworks.about_a_framework(f.fix) for f in found):
        return
    used = frameworks.used(analysis)
    for f in found:
        f.fix = frameworks.for_frameworks(f.fix, used)


def _conflicts_named(analysis, found: list[Finding]) -> None:
    """A finding that asks for a switch run.json records but the recorded steps did not use (built disabled or
    unused, or not acting in the trace: measure/settings/switches_on.py) names that conflict ahead of its advice."""
    if isinstance(analysis, Analysis):
        for f in found:
            f.advice = with_conflicts_named(f.advice, f.fix, analysis)


def _for_every_rank(analysis, found: list[Finding]) -> None:
    """On one rank of a multi-rank job, what the fix saves when every rank makes it: every rank of an SPMD
    job runs the same steps, so each saves the same own work and the collectives end that much earlier.
    The saving of the rank's own work comes from the same replay as the finding's, with its collectives
    taking only their transfer time (Analysis.predictions); a finding measured otherwise keeps its share.
    measure/job/jobmodel.py replaces this where the other ranks' traces are there too."""
    model = getattr(analysis, "model", None)
    world = model.meta.world_size if model is not None else None
    if not world or world < 2:
        return
    who = f"rank {model.meta.rank}" if model.meta.rank is not None else "this rank"
    for f in found:
        if f.impact.upper_bound or f.impact.est_step_saving_pct <= 0:
            continue
        own = analysis.own_work_saved(f.impact.basis)
        f.impact.job_pct = round(own if own is not None else f.impact.est_step_saving_pct, 1)
        f.impact.job_basis = (f"if every rank of the {world}-rank job has this cause and gets the fix: only {who}'s "
                              "trace was analysed, so this assumes every rank runs the same steps and saves the same "
                              "time of its own work, and the collectives end that much earlier (their waits for "
                              "slower ranks stay as they are)")


def dependency_graph(src: Source):
    """One trace's replay graph (measure/replay/replay_graph.py) as a networkx DiGraph (measure/replay/replay_export.py),
    or None where the trace has no window to replay (no steps and no GPU work)."""
    from gpuadvise.analyzer.measure.replay import replay_graph
    from gpuadvise.analyzer.measure.replay.replay_export import to_networkx

    model = load_trace(src.path)
    replay = replay_graph.build(model, compute(model))
    return None if replay is None else to_networkx(replay)


def analyze_source(src: Source, rules=None, progress=None, cache: bool | None = None) -> list[TraceReport]:
    """Analyse one source: one report, or one per rank for a file that holds several ranks of a job
    (read/merged.py: each rank's events as its own trace, in rank order). `progress(done_bytes,
    total_bytes)` follows the trace decode when given; `cache` as in `read.loader.load_trace`."""
    if src.kind == "snapshot":
        return [analyze_snapshot(load_snapshot(src.path), src.facts, source=str(src.path), rank=src.rank, rules=rules)]
    snapshot = load_snapshot(src.snapshot) if src.snapshot is not None else None
    model = load_trace(src.path, progress=progress, cache=cache)
    meta = model.meta
    split = split_ranks(model)
    if split is None:
        reports = [analyze_model(model, src.facts, source=str(src.path), rank=src.rank, rules=rules, snapshot=snapshot)]
        if src.snapshot is not None:
            reports[0].snapshot = str(src.snapshot)
    else:  # one process's snapshot or run.json never describes every rank of a merged job
        del model
        reports = [analyze_model(part.model, None, source=str(src.path), rank=part.rank, rules=rules)
                   for part in split.parts]
        reports[0].notes[:0] = split.notes()
    if meta.damaged_at is not None:
        reports[0].notes.insert(0, f"the trace is damaged at byte {meta.damaged_at}; analysed the "
                                   f"{meta.events_total} complete events before the damage")
    elif meta.truncated:
        reports[0].notes.insert(0, f"the trace was cut off; analysed the {meta.events_total} complete events before the cut")
    return reports


def _debug() -> bool:
    import os

    return bool(os.environ.get("GPUADVISE_DEBUG"))

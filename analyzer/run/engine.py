"""`analyze_paths`: the one way in for analysis (the analyze CLI, `view`, `compare`, `profile`'s summary
and scripts call it, through `gpuadvise.analyzer.run`). The paths become sources (read/sources);
each is analysed on its own (run/single: in this process, in worker processes or on a Dask cluster,
see run/ranks); with two or more ranks the job view is reduced (measure/job/job) and the job-level rules
(`requires = ("ranks",)`) run once on it; a run folder's step record and windows make the run-level
analysis of a long run (run/longrun), whose rules (`requires = ("run",)`) run once per process.
"""

from __future__ import annotations

from gpuadvise.analyzer.measure.job.job import JobAnalysis, JobReport, build_view, rank_stats
from gpuadvise.analyzer.measure.job.jobmodel import held_by, job_saving_pct
from gpuadvise.analyzer.model.findings import SEVERITIES, severity_for
from gpuadvise.analyzer.model.report import Reports, TraceReport
from gpuadvise.analyzer.read.sources import Sources, resolve

from . import captures, longrun, ranks
from .telemetry import rank_telemetry
from .single import analyze_source, run_rules


def analyze_paths(paths: list[str] | Sources, progress=None, rules=None, bytes_progress=None, jobs: int | None = None,
                  scheduler=None, rank_progress=None, cache: bool | None = None) -> Reports:
    """Analyse every source, then the job when there are ≥2 ranks. `paths` are what the user named, or
    the `Sources` that `resolve` already made of them (so a caller that checked them reads them once).
    `cache`: use the parsed-model cache beside big traces (None: yes unless GPUADVISE_NO_CACHE is set).
    The reports carry each trace's run.json facts (`Reports.facts`, by trace path).

    - one trace, or `jobs=1`: in this process, one source after the other; `progress(i, n, source)`
      before each source and `bytes_progress(done, total)` during each decode;
    - ≥2 traces: in worker processes (`jobs`, default `ranks.default_jobs`), or on the Dask cluster of
      `scheduler` (a `dask.distributed.Client` or a scheduler address); `rank_progress(done, n, nbytes)`
      as ranks finish.
    """
    sources = paths if isinstance(paths, Sources) else resolve(paths)
    longrun.own_regime(sources)  # a window straddling a long run's change: its overhead from its own side
    try:
        codes = ranks.rule_codes(rules)
    except ValueError:  # rules that are not in the catalog cannot travel: run here
        codes, jobs, scheduler = None, 1, None
    workers = ranks.local_workers(sources, jobs, scheduler)
    if scheduler is not None:
        results = ranks.map_dask(sources, codes, scheduler, progress=rank_progress, cache=cache)
    elif workers > 1:
        results = ranks.map_local(sources, codes, workers, progress=rank_progress, cache=cache)
    else:
        results, facts_of = [], []
        for i, src in enumerate(sources):
            if progress:
                progress(i, len(sources), src)
            got = analyze_source(src, rules=rules, progress=bytes_progress, cache=cache)
            results.extend(got)
            facts_of.extend([src.facts] * len(got))
        if _traces(results) >= 2:
            for r, facts in zip(results, facts_of):
                r.rank_stats = rank_stats(r, facts)
    reports = [r if isinstance(r, TraceReport) else _failed(r) for r in results]
    if _traces(reports) >= 2:  # a file that holds several ranks counts as those ranks
        reports.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0))  # stable: rank order
    # one worker captured N times: no job across them; a long run's later windows stay out of its job view
    repeated, later_windows = captures.apply(sources, reports)
    if reports and getattr(sources, "notes", None):
        reports[0].notes[:0] = sources.notes  # files of the folder(s) that are not traces
    facts = {str(s.path): s.facts for s in sources}
    job = None if repeated else analyze_job([r for r in reports if id(r) not in later_windows], rules, facts)
    return Reports(reports, job=job, facts=facts, long_runs=longrun.analyze_runs(sources, reports, rules))


def _traces(results: list) -> int:
    """The traces among the results (a failed rank's result counts: it was one)."""
    return sum(1 for r in results if not isinstance(r, TraceReport) or r.kind == "trace")


def _failed(failure) -> TraceReport:
    """A rank whose worker failed (not bad input: that stops the run): reported as a note on that rank."""
    return TraceReport(source=failure.source, rank=failure.rank, model=None, metrics=None, findings=[],
                       notes=[f"analysis failed: {failure.message}"])


def analyze_job(reports: list[TraceReport], rules=None, facts: dict | None = None):
    """The reduce: the job view of ≥2 ranks and the job-level rules on it (None for fewer ranks). `facts`:
    run.json per source path; the job rules read the first rank's."""
    view = build_view([r.rank_stats for r in reports if r.rank_stats is not None])
    if view is None:
        return None
    _leave_to_the_job(reports)
    by_rank: dict = {}
    for r in reports:
        by_rank.setdefault(r.rank, []).extend(r.findings)
    notes = list(view.notes)
    first = next((r for r in reports if r.rank_stats is not None), None)
    analysis = JobAnalysis(view, by_rank, (facts or {}).get(str(first.source), {}) if first is not None else {})
    analysis.telemetry = rank_telemetry(reports)  # each rank's GPU clocks, where the run sampled them
    findings = run_rules(analysis, rules, source=None, rank=None, notes=notes, keep_rank=True)
    fix_on_every_rank(view, reports)
    return JobReport(view=view, findings=findings, notes=notes)


def _leave_to_the_job(reports: list[TraceReport]) -> None:
    """A rank's findings from rules that read one rank's trace alone (`Rule.job_replaces`: its collectives'
    waits and transfers are one figure there) go once the ranks are lined up: the job's rules say it better."""
    from gpuadvise.rules import all_rules

    alone = {r.code for r in all_rules() if getattr(r, "job_replaces", False)}
    for r in reports:
        if any(f.rule in alone for f in r.findings):
            r.findings = [f for f in r.findings if f.rule not in alone]


def fix_on_every_rank(view, reports: list[TraceReport]) -> None:
    """Each rank's finding also says what its fix saves the job: the ranks replayed side by side with the
    fix on every rank that shows the same finding, each collective ending when its last rank arrives
    (measure/job/jobmodel.py). A rank's own work saved per step is its SPMD figure (run/single.py)."""
    stats = {s.rank: s for s in view.ranks}
    by_rule: dict = {}
    for r in reports:
        for f in r.findings:
            if r.rank in stats and not f.impact.upper_bound and f.impact.est_step_saving_pct > 0:
                by_rule.setdefault(f.rule, []).append((r.rank, f))
    for rule, found in by_rule.items():
        saved, dropped = {}, set()
        for rank, f in found:
            if f.impact.removes:  # the fix takes collectives away: they stop holding the ranks together
                dropped.update(map(tuple, f.impact.removes))
                saved.setdefault(rank, 0.0)
                continue
            own = f.impact.job_pct if f.impact.job_pct is not None else f.impact.est_step_saving_pct
            saved[rank] = saved.get(rank, 0.0) + own / 100.0 * stats[rank].median_step_us
        pct = job_saving_pct(view, saved, dropped)
        if pct is None:
            continue
        ranks = sorted(saved)
        which = "every rank" if len(ranks) == len(stats) else f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        basis = (f"the {len(stats)} traced ranks replayed side by side with the fix on {which} (where the finding is), "
                 "each collective ending when its last rank arrives")
        for rank, f in found:
            f.impact.job_pct, f.impact.job_basis = round(pct, 1), basis
            _severity_for_the_job(view, rank, f)


def _severity_for_the_job(view, rank: int, f) -> None:
    """In a job's report a rank's finding is as severe as what its fix saves the job, never more than
    the rule judged it on its rank; when that lowers it, the message says why the job gains little (the
    rank's own figure stays in its evidence and its `est_step_saving_pct`)."""
    pct = f.impact.job_pct
    if f.severity not in SEVERITIES[:3]:
        return
    job_level = severity_for(pct)
    if SEVERITIES.index(job_level) <= SEVERITIES.index(f.severity):
        return
    own_us = f.impact.est_step_saving_pct / 100.0 * next(s.median_step_us for s in view.ranks if s.rank == rank)
    f.evidence.numbers["rank_step_saving_pct"] = round(f.impact.est_step_saving_pct, 1)
    f.evidence.numbers["job_step_saving_pct"] = pct
    f.message = (f"{f.message.rstrip()} For the job the fix saves ~{pct:.1f} % of the step, "
                 f"against ~{f.impact.est_step_saving_pct:.1f} % of rank {rank}'s own: {held_by(view, rank, own_us)}.")
    f.severity = job_level

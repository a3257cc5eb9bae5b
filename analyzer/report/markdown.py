"""Markdown report: what a user pastes into a PR or an issue."""

from __future__ import annotations

from gpuadvise.analyzer.model.report import TraceReport, overhead_words, per_gpu_words
from gpuadvise.analyzer.model.summary import TraceSummary, one_per_rule, summarize
from . import evidence, flops
from .finding import finding_lines, rank_list, saving
from .longrun import markdown_section as run_section, shown
from .safe import md, md_cell, md_code, md_text, short


def render(reports: list[TraceReport], charts: dict | None = None) -> str:
    """`charts`: markdown lines to add after the summary table ("findings") and after report i's
    steps table (i), e.g. links to chart files (see report_charts.py)."""
    charts = charts or {}
    summary = summarize(reports)
    out = ["# gpuadvise report", ""]
    findings, ranks_of = one_per_rule(summary.findings, summary.job is not None)  # a job: once, its ranks named
    for t in summary.traces:
        out += _trace_header(t)
    out += ["## Summary", ""]
    if findings:
        same = "; a finding on several ranks is listed once" if any(len(v) > 1 for v in ranks_of.values()) else ""
        out += [f"{len(findings)} finding{'s' if len(findings) != 1 else ''}, ordered by the step time a fix is predicted "
                f"to save{same}.", ""]
        multi = len(reports) > 1
        out += ["| # | Finding | Topic | Severity | Est. saving" + (" | Rank |" if multi else " |"),
                "|---|---|---|---|---" + ("|---|" if multi else "|")]
        for i, f in enumerate(findings, 1):
            row = f"| {i} | {md(f.title)} | `{f.topic}` | {f.severity} | {saving(f)}"
            out.append(row + (f" | {rank_list(ranks_of[id(f)]) if f.rank is not None else '–'} |" if multi else " |"))
        out.append("")
        out += charts.get("findings", [])
    else:
        out += ["No findings: nothing in this trace points at a slowdown gpuadvise knows how to fix.", ""]
    job = summary.job
    if job is not None:
        out += _job_section(job)
        job_mfu = flops.job_line(summary.figures)
        if job_mfu:
            out += [f"The {md_text(job_mfu)}.", ""]
    runs = summary.long_runs
    for i, run in enumerate(runs):
        if shown(run):
            out += run_section(run, len(runs) > 1) + charts.get(f"run-{i}", [])
    for i, r in enumerate(reports):
        steps = _steps_table(r, len(reports) > 1)
        out += steps + (charts.get(i, []) if steps else [])
    for t in summary.traces:
        out += _flops_section(t, len(reports) > 1)
    for t in summary.traces:
        out += _memory_section(t, len(reports) > 1)
    if findings:
        out += ["## Findings", ""]
        for i, f in enumerate(findings, 1):
            out += finding_lines(f, f"{i}. ", level=3, ranks=ranks_of[id(f)])
    for r in reports:
        out += _kernels_table(r, len(reports) > 1)
    notes = [(t, n) for t in summary.traces for n in t.notes]
    job_notes = job.notes if job is not None else []
    run_notes = [n for run in runs for n in run.notes]
    if notes or job_notes or run_notes:
        out += ["## Notes", ""]
        out += [f"- {md(n)}" + (f" ({md(t.source)})" if len(reports) > 1 else "") for t, n in notes]
        out += [f"- {md(n)} (job)" for n in job_notes]
        out += [f"- {md(n)} (step record)" for n in run_notes]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _job_section(job) -> list[str]:
    """Two or more ranks: each rank's step time, work, wait and communication, the rank the job waited for
    per step, and the waits per collective."""
    v = job.view
    steps = (f", {len(v.steps)} step{'s' if len(v.steps) != 1 else ''} compared (ProfilerStep#{v.steps[0]}"
             + (f"–#{v.steps[-1]})" if len(v.steps) > 1 else ")") if v.steps else ", no common steps")
    if v.whole_trace:
        steps = ", no ProfilerStep: each rank's trace compared as one step"
    world = f" of {v.world_size}" if v.world_size and v.world_size != len(v.ranks) else ""
    out = ["## Job", "", f"{len(v.ranks)}{world} ranks{steps}.", "",
           "| Rank | Median step (ms) | Work (ms) | Wait (ms) | Others waited for it (ms) | GPU busy | Comm (ms) | "
           "Exposed comm (ms) | Comm/compute overlap |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in v.per_rank():
        out.append(f"| {row['rank']} | {row['median_step_ms']:.2f} | {_opt(row.get('work_ms'), '.2f')} | "
                   f"{_opt(row.get('wait_ms'), '.2f')} | {_opt(row.get('caused_wait_ms'), '.2f')} | "
                   f"{_opt(row['gpu_busy_pct'], '.1f', ' %')} | {row['comm_ms']:.2f} | "
                   f"{row['exposed_comm_ms']:.2f} | {_opt(row['comm_overlap_pct'], '.1f', ' %')} |")
    out += ["", "Per step medians. Wait is the time a rank spent inside collectives waiting for the last rank to arrive "
                "(collectives lined up across the ranks, clocks aligned by them) with nothing else to do; work is the "
                "step time minus that wait; others waited for it is the wait it caused by arriving last; comm is the time "
                "inside collectives (their kernels, or a CPU backend's from the call that issued each). Comm/compute overlap is HTA's (communication-kernel time that overlaps compute kernels, over the "
                "whole trace).", ""]
    if v.stragglers:
        out += ["**The rank the job waited for, per step**", "",
                "| Step | Rank | Others waited for it (ms) | Work (ms) | Median of the other ranks (ms) | Work vs the others |",
                "|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {v.step_label(s.step)} | {s.rank} | {s.caused_us / 1e3:.2f} | {s.work_us / 1e3:.2f} | "
                f"{s.others_median_us / 1e3:.2f} | {_signed_pct(s.slower_pct)} |" for s in v.stragglers]
        out.append("")
    if v.collectives:
        ids = v.rank_ids
        out += ["**Waits per collective** (ms per step: wait / transfer)", "",
                "| Collective | Group | Per step | " + " | ".join(f"Rank {r}" for r in ids[:16]) + " |",
                "|---|---|---:|" + "---:|" * len(ids[:16])]
        for c in v.collectives:
            by_rank = {x["rank"]: x for x in c["ranks"]}
            cells = " | ".join(f"{by_rank[r]['wait_ms']:.2f} / {by_rank[r]['transfer_ms']:.2f}" if r in by_rank else "–"
                               for r in ids[:16])
            out.append(f"| {c['collective']} | {c['group'] or '–'} | {c['per_step']:g} | {cells} |")
        out.append("")
    return out + _group_section(v)


def _group_section(v) -> list[str]:
    """The job's communication by process group and phase, and the mesh where the trace or run.json says it."""
    if not v.shows_groups:
        return []
    out = ["**Communication by process group and phase** (ms per step, the median over the group's ranks)", ""]
    if v.mesh:
        out += [f"Device mesh {md(v.mesh_words())}" + (" (run.json)." if v.mesh.get("source") == "run.json" else "."), ""]
    out += ["| Process group | Phase | Per step | Inside | Exposed | Wait | Transfer |", "|---|---|---:|---:|---:|---:|---:|"]
    for g in v.groups:
        who = f"{md(g['shown'])} " + " ".join(str(x["ranks"]) for x in g["groups"])
        out.append(f"| {who} | all | {g['per_step']:g} | {g['inside_ms']:.2f} | {g['exposed_ms']:.2f} | "
                   f"{g['wait_ms']:.2f} | {g['transfer_ms']:.2f} |")
        for p in g["phases"]:
            out.append(f"| | {p['where']} | {p['per_step']:g} | {p['inside_ms']:.2f} | {p['exposed_ms']:.2f} | "
                       f"{p['wait_ms']:.2f} | {p['transfer_ms']:.2f} |")
    out += ["", "Inside: the time a rank spends inside the group's collectives; exposed: the part with nothing of its "
                "own beside it, split into its wait for the group's last rank and the transfer.", ""]
    return out


def _signed_pct(v: float) -> str:
    """+2.9 % / −2.2 %: a difference whose sign is the direction (a rank the others waited for may have had
    less work than they: it arrived late)."""
    return "0.0 %" if round(v, 1) == 0 else f"{v:+.1f} %".replace("-", "−")


def _opt(v, spec: str, unit: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{unit}"


def _trace_header(t: TraceSummary) -> list[str]:
    what = "Snapshot" if t.kind == "snapshot" else "Trace"
    lines = [f"- **{what}:** {md_code(t.source)}" + (f" (rank {t.rank})" if t.rank is not None else "")]
    if t.snapshot:
        lines.append(f"- **Memory snapshot:** {md_code(t.snapshot)}")
    if not t.timed:
        return lines + [""]
    s = t.figures
    if s.device_description:
        lines.append(f"- **Device:** {md(s.device_description)}")
    else:
        cc = f" (sm {s.compute_capability})" if s.compute_capability else ""
        lines.append(f"- **Device:** {md(s.device or 'not recorded')}{cc}, {s.platform}")
    if s.steps:
        nums = s.step_numbers
        one = s.steps == 1
        spans = "its CPU span takes" if one else "their CPU spans take"
        ahead = (f" on the GPU timeline; {spans} {s.median_step_cpu_ms:.2f} ms (the CPU runs ahead of the GPU)"
                 if s.median_step_ms > 1.1 * s.median_step_cpu_ms else "")
        which = f"ProfilerStep#{nums[0]}" if one or nums[0] == nums[-1] else f"ProfilerStep#{nums[0]}–#{nums[-1]}"
        lines.append(f"- **Steps:** {s.steps} ({which}), {'' if one else 'median '}{s.median_step_ms:.2f} ms{ahead}")
    else:
        lines.append(f"- **Steps:** none recorded; the whole trace ({s.window_ms:.2f} ms) is one window")
    if s.one_time_note:
        lines.append(f"- **One-time costs:** {md_text(s.one_time_note)}")
    if s.unprofiled_median_step_ms:
        lines.append(f"- **Unprofiled step:** {s.unprofiled_median_step_ms:.2f} ms median, measured by `gpuadvise profile` "
                     f"outside the window: {overhead_words(s.profiler_overhead_x)} "
                     f"({md_text(s.profiler_calibration or '')})")
    if s.gpu_busy_pct is not None:
        in_steps = f", {s.gpu_busy_in_steps_pct:.1f} % inside the steps" if s.steps else ""
        which = f"the average of its {len(s.gpus)} GPUs: " if s.gpus else ""
        lines.append(f"- **GPU busy:** {which}{s.gpu_busy_pct:.1f} % of the GPU's active span{in_steps}")
        if s.gpus:
            lines.append(f"- **Per GPU:** {md_text(per_gpu_words(s))}")
    else:
        lines.append("- **GPU busy:** no GPU activity recorded")
    mfu = flops.labelled(s.flops)
    if mfu:
        lines.append(f"- **{mfu[0]}:** {md_text(mfu[1])}")
    return lines + [""]


def _flops_section(t: TraceSummary, multi: bool) -> list[str]:
    """The MFU's arithmetic: FLOPs per step by op family and pass, the dtype and peak each is measured
    against, the kernels' time and rate, each step's MFU, and what qualifies it."""
    f = t.figures.flops if t.timed else None
    rows = flops.table(f)
    if not rows:
        return []
    title = "## FLOPs and MFU" + (f" — {md(t.source)}" if multi else "")
    out = [title, "", md_text(f.basis) + ".", "",
           "| " + " | ".join(flops.TABLE_HEADER) + " |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    out += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in rows]
    out.append("")
    out.append("FLOPs as PyTorch's FlopCounterMode counts them (2 per multiply-add), from the shapes the trace recorded. "
               "Model FLOPs are the forward and backward without recompute, hardware FLOPs what the kernels computed, "
               "recompute included (\"=\": the same; PaLM's MFU and HFU); a kernel's rate is its hardware FLOPs over "
               "its time; the peak is the device's dense peak of the dtype each op ran in.")
    step = flops.per_step(f)
    extra = ([step] if step else []) + flops.qualifiers(f)
    if extra:
        out.append("")
        out += [f"- {md_text(x)}" for x in extra]
    return out + [""]


def _steps_table(r: TraceReport, multi: bool) -> list[str]:
    m = r.metrics
    if m is None or m.per_step.empty:
        return []
    title = "## Steps" + (f" — {md(r.source)}" if multi else "")
    if r.figures is not None and r.figures.cpu_steps:
        return _cpu_steps_table(title, r.figures.cpu_steps)
    out = [title, "", "| Step | Time (ms) | CPU span | GPU busy | Compute | Comm | Memcpy | DataLoader | Sync wait | GPU idle |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in m.per_step.itertuples():
        step = f"#{row.step}" if row.step >= 0 else "all"
        out.append(f"| {step} | {row.dur_us / 1e3:.2f} | {row.cpu_dur_us / 1e3:.2f} | {row.gpu_busy_pct:.1f} % | "
                   f"{row.kernel_us / 1e3:.2f} | {row.comm_us / 1e3:.2f} | {row.memcpy_us / 1e3:.2f} | "
                   f"{row.dataloader_us / 1e3:.2f} | {row.sync_us / 1e3:.2f} | {row.idle_us / 1e3:.2f} |")
    return out + ["", "Times in ms. A step's time is the slower of its CPU span (ProfilerStep) and its GPU time (from "
                      "the first GPU activity it launched to the next step's); GPU columns are the union of GPU activity "
                      "in that window, DataLoader and sync columns are measured in the CPU span.", ""]


def _cpu_steps_table(title: str, steps) -> list[str]:
    """A run without a GPU timeline: each step's CPU time, where the training thread spent it."""
    out = [title, "", "| Step | Time (ms) | In ops | DataLoader wait | Collective wait | Outside ops |",
           "|---:|---:|---:|---:|---:|---:|"]
    for s in steps:
        out.append(f"| {f'#{s.step}' if s.step >= 0 else 'all'} | {s.ms:.2f} | {s.in_ops_ms:.2f} | {s.loader_wait_ms:.2f} | "
                   f"{s.collective_wait_ms:.2f} | {s.outside_ops_ms:.2f} |")
    return out + ["", "Times in ms, of the training thread: no GPU timeline was recorded, so a step is CPU time, in four "
                      "parts that add up to it. In ops: inside recorded torch ops (forward, backward, optimizer, a "
                      "single-process loader's collate), not those that wait in a collective; DataLoader wait: waiting "
                      "for the next batch outside any op; collective wait: inside a CPU backend's (gloo's) collectives, "
                      "their calls and the ops that wait for them (a functional collective's wait, a hook's "
                      "reduce-scatter), outside both; outside ops: none of these (Python between ops).", ""]


def _memory_section(t: TraceSummary, multi: bool) -> list[str]:
    """The memory figures, whatever their sources: snapshot state, its history, [memory] events, memory_stats."""
    mem = t.memory
    if mem is None:
        return []
    rows: list[tuple[str, str]] = []
    cap = mem.capacity
    if cap:
        rows.append(("Device memory", _gib(cap) + (f" ({md(mem.device_name)})" if mem.device_name else "")))
    for label, value in (("Peak allocated", mem.peak_allocated), ("Peak reserved", mem.peak_reserved)):
        if value is not None:
            pct = mem.pct_of_capacity(value)
            rows.append((label, _gib(value) + (f" ({pct:.1f} % of the device)" if pct is not None else "")))
    s = mem.snapshot
    if s is not None:
        rows += [
            ("Snapshot: reserved / allocated", f"{_gib(s.reserved)} / {_gib(s.allocated)} ({s.slack_pct:.1f} % unallocated)"),
            ("Stranded in partly used segments", f"{_gib(s.stranded)} ({s.stranded_pct:.1f} % of reserved) in "
                                                 f"{s.stranded_blocks} free blocks of {s.partly_used_segments} segments"),
            ("Cached in empty segments", _gib(s.empty_segment_bytes)),
            ("Rounding inside live blocks", _gib(s.internal_free)),
            ("Largest free block / largest live request", f"{_mib(s.largest_free_block)} / {_mib(s.largest_request)}"),
            ("Segments", str(s.segments)),
        ]
        if mem.other_devices:
            at = next(i for i, (label, _) in enumerate(rows) if label.startswith("Snapshot:"))
            rows.insert(at, ("Snapshot device", f"{s.device} (the figures below); the snapshot covers "
                                                           f"{len(mem.other_devices) + 1} devices"))
            for d in mem.other_devices:
                rows.append((f"Device {d['device']}: reserved / allocated",
                             f"{_gib(d['reserved'])} / {_gib(d['allocated'])}"
                             + (f", {d['ooms']} out-of-memory" if d["ooms"] else "")))
    h = mem.history
    if h is not None:
        span = f" over {h.span_s:.1f} s" if h.timed and h.span_s is not None else " (no timestamps)"
        rows.append(("History", f"{h.entries} entries{span}"))
        if h.reserved_at_peak:
            rows.append(("At the allocation peak", f"{_gib(h.peak_allocated)} allocated of {_gib(h.reserved_at_peak)} "
                                                   f"reserved ({h.unused_at_peak_pct:.1f} % unused)"))
        rows.append(("Segment allocations / releases", f"{h.segment_allocs} / {h.segment_frees} "
                                                       f"({h.release_cycles} release-then-reallocate cycles)"))
        if h.ooms:
            o = h.ooms[0]
            rows.append(("Out-of-memory events", f"{len(h.ooms)}; first request {_gib(o['requested_bytes'])}"))
    t = mem.trace
    if t is not None:
        if t.events:
            rows.append(("`[memory]` events", f"{t.events} on device {t.device}: reserved {_gib(t.reserved_at_peak)} at the "
                                               f"allocation peak, largest reserved − allocated gap {_gib(t.max_gap)}"))
        if t.mallocs or t.frees:
            where = (f", {t.mallocs_in_iterations} / {t.frees_in_iterations} inside {t.iterations} iterations "
                     f"({t.allocator_ms_in_iterations:.1f} ms)" if t.iterations else ", no iterations to place them in")
            rows.append(("cudaMalloc / cudaFree calls", f"{t.mallocs} / {t.frees}{where}"))
    c = mem.counters
    if c is not None:
        rows.append(("memory_stats(): alloc retries / OOMs", f"{_num(c.num_alloc_retries)} / {_num(c.num_ooms)}"))
    if mem.allocator_settings:
        rows.append(("Allocator settings", ", ".join(md_code(f"{k}={v}") for k, v in mem.allocator_settings.items())))
    out = ["## Memory" + (f" — {md(t.source)}" if multi else ""), "", "| | |", "|---|---|"]
    out += [f"| {label} | {value} |" for label, value in rows]
    out.append("")
    sites = (h.top_sites if h is not None else []) or (s.top_sites if s is not None else [])
    if sites:
        keys = list(sites[0].keys())
        out += ["Top allocation sites" + (" (by memory live at the allocation peak)" if h is not None and h.top_sites else "")
                + ":", "", "| " + " | ".join(md(evidence.column(k)) for k in keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(md_cell(short(str(v), 80)) if k == "name" else md(evidence.cell(k, v)) for k, v in row.items()) + " |"
                for row in sites]
        out.append("")
    return out


def _gib(n) -> str:
    return "–" if n is None else f"{n / 2**30:.2f} GiB"


def _mib(n) -> str:
    return "–" if n is None else f"{n / 2**20:.0f} MiB"


def _num(v) -> str:
    return "–" if v is None else str(v)


def _kernels_table(r: TraceReport, multi: bool) -> list[str]:
    m = r.metrics
    if m is None or m.kernels.empty:
        return []
    out = ["## Top kernels" + (f" — {md(r.source)}" if multi else ""), "",
           "| Kernel | Count | Total (ms) | Mean (µs) | Share |", "|---|---:|---:|---:|---:|"]
    for row in m.kernels.head(10).itertuples():
        out.append(f"| {md_cell(short(row.name, 80))} | {row.count} | {row.total_us / 1e3:.2f} | {row.mean_us:.1f} | {row.share_pct:.1f} % |")
    return out + [""]

"""Terminal summary: the headline numbers and the top findings, nothing more."""

from __future__ import annotations

import textwrap

from gpuadvise.analyzer.model.report import overhead_words, per_gpu_words
from gpuadvise.analyzer.model.summary import TraceSummary, one_per_rule, summarize
from . import flops
from .finding import rank_list
from .longrun import shown, text_lines as run_lines
from .safe import short, terminal


def render(reports, top: int = 5, prefix: str = "") -> str:
    summary = summarize(reports)
    out = []
    for t in summary.traces:
        head = f"{terminal(t.source)}" + (f" (rank {t.rank})" if t.rank is not None else "")
        s = t.figures
        if s is None:
            out.append(head)
            out += _memory_line(t)
            out += [f"  {terminal(n)}" for n in t.notes]
            continue
        busy = s.gpu_busy_in_steps_pct if s.steps else s.gpu_busy_pct
        busy_txt = f"GPU busy {busy:.1f}%" if busy is not None else "no GPU activity recorded"
        if s.gpus and busy is not None:  # one process, several GPUs: the average device, then each one
            busy_txt = f"{len(s.gpus)} GPUs, busy {busy:.1f}% on average"
        if s.steps == 1:  # one step has no median to speak of
            steps = f"1 step, {s.median_step_ms:.1f} ms"
        else:
            steps = f"{s.steps} steps, median {s.median_step_ms:.1f} ms" if s.steps else f"no steps, {s.window_ms:.1f} ms traced"
        if s.steps and s.median_step_ms > 1.1 * s.median_step_cpu_ms:
            steps += f" on the GPU timeline (CPU spans {s.median_step_cpu_ms:.1f} ms: the CPU runs ahead)"
        if s.unprofiled_median_step_ms:
            steps += f" (unprofiled {s.unprofiled_median_step_ms:.1f} ms: {overhead_words(s.profiler_overhead_x)})"
        dev = terminal(s.device_description or s.device or "device not recorded")
        out.append(f"{head}\n  {dev} · {steps} · {busy_txt}")
        if s.gpus:
            out += [f"  {line}" for line in textwrap.wrap(per_gpu_words(s), 98)]
        mfu = flops.headline(s.flops)
        if mfu:
            out += [f"  {line}" for line in textwrap.wrap(terminal(mfu), 98, subsequent_indent="  ")]
            if len(summary.traces) == 1 or t is summary.head:  # what qualifies it: once, for the heading trace
                out += [f"    {line}" for q in flops.qualifiers(s.flops) for line in textwrap.wrap(terminal(q), 96)]
        if s.one_time_note:
            out += [f"  {line}" for line in textwrap.wrap(terminal(s.one_time_note), 98)]
        out += _memory_line(t)
    job = summary.job
    if job is not None:
        out += _job_lines(job)
        job_mfu = flops.job_line(summary.figures)
        if job_mfu:
            out += [f"  {line}" for line in textwrap.wrap(terminal(job_mfu), 98, subsequent_indent="  ")]
    for run in summary.long_runs:
        if shown(run):
            out += run_lines(run, len(summary.long_runs) > 1)
    findings, ranks_of = one_per_rule(summary.findings, job is not None)
    if not findings:
        out.append("\nNo findings.")
    else:
        same = "; a finding on several ranks is shown once" if any(len(v) > 1 for v in ranks_of.values()) else ""
        out.append(f"\n{len(findings)} finding{'s' if len(findings) != 1 else ''} (by severity, then predicted saving{same}):")
        for i, f in enumerate(findings[:top], 1):
            on = ranks_of.get(id(f), [f.rank])
            rank = (f" [rank {f.rank}]" if len(on) == 1 else f" [ranks {rank_list(on)}]") \
                if f.rank is not None and len(summary.traces) > 1 else ""
            pct = f.impact.est_step_saving_pct
            est = f"up to {pct:.1f}%" if f.impact.upper_bound else f"~{pct:.1f}%"
            if f.impact.range_pct and f.impact.range_pct[1] - f.impact.range_pct[0] >= 1:
                est += f", {f.impact.range_pct[0]:.0f}–{f.impact.range_pct[1]:.0f}%"
            est = f"  ({est} of step time)" if pct > 0 else ""
            out.append(f"\n{i}. [{f.severity}] {terminal(f.title)}{est}{rank}")
            out.append(f"   {f.rule} {f.topic}")
            for line in textwrap.wrap(terminal(f.message), 96):
                out.append(f"   {line}")
            if f.evidence.sources:
                out.append(f"   at {terminal(short(', '.join(map(str, f.evidence.sources[:3])), 90))}")
            if f.impact.job_pct is not None:
                out.append(f"   on every rank that shows it: ~{f.impact.job_pct:.1f}% of the job's step")
            first = terminal(f.recommendation.split("\n", 1)[0])
            out.append(f"   → {first}")
        if len(findings) > top:
            out.append(f"\n… and {len(findings) - top} more (use --format md for the full report).")
    notes = [n for t in summary.traces for n in t.notes] + (job.notes if job is not None else []) + \
        [n for run in summary.long_runs for n in run.notes]
    if notes:
        out.append("")
        out += [f"note: {terminal(n)}" for n in notes]
    text = "\n".join(out) + "\n"
    if prefix:
        text = "".join(prefix + line + "\n" for line in text.splitlines())
    return text


def _job_lines(job, max_ranks: int = 16) -> list[str]:
    v = job.view
    steps = f", {len(v.steps)} step{'s' if len(v.steps) != 1 else ''} compared" if v.steps else ", no common steps"
    if v.whole_trace:
        steps = ", no ProfilerStep: each rank's trace compared as one step"
    out = [f"\njob: {len(v.ranks)} ranks{steps}",
           "  rank  step ms  work ms  wait ms  others waited  GPU busy  comm ms  overlap"]
    rows = v.per_rank()
    for row in rows[:max_ranks]:
        busy = f"{row['gpu_busy_pct']:.1f}%" if row["gpu_busy_pct"] is not None else "–"
        overlap = f"{row['comm_overlap_pct']:.1f}%" if row["comm_overlap_pct"] is not None else "–"
        work = f"{row['work_ms']:.2f}" if "work_ms" in row else "–"
        wait = f"{row['wait_ms']:.2f}" if "wait_ms" in row else "–"
        caused = f"{row['caused_wait_ms']:.2f}" if "caused_wait_ms" in row else "–"
        out.append(f"  {row['rank']:>4}  {row['median_step_ms']:>7.2f}  {work:>7}  {wait:>7}  {caused:>13}  {busy:>8}  "
                   f"{row['comm_ms']:>7.2f}  {overlap:>7}")
    if len(rows) > max_ranks:
        out.append(f"  … and {len(rows) - max_ranks} more ranks (--format md lists them all)")
    if v.stragglers and max(s.slower_pct for s in v.stragglers) < 1.0 and max(s.caused_us for s in v.stragglers) <= 0:
        out.append("  balanced: in every step the slowest rank is less than 1% slower than the others")
    elif v.stragglers:
        per_step = ", ".join(f"{v.step_label(s.step)} rank {s.rank} ({_waited(s)})" for s in v.stragglers[:8])
        more = " …" if len(v.stragglers) > 8 else ""
        if v.whole_trace:
            per_step = ", ".join(f"rank {s.rank} ({_waited(s)})" for s in v.stragglers)
        out.append(f"  the rank the job waited for{'' if v.whole_trace else ', per step'}: {per_step}{more}")
    for c in v.collectives[:4]:
        waits = ", ".join(f"rank {x['rank']} {x['wait_ms']:.2f}" for x in c["ranks"][:8])
        out.append(f"  {c['collective']}{' (group ' + c['group'] + ')' if c['group'] else ''}, "
                   f"{c['per_step']:g} per step: wait ms per step {waits}")
    return out + _group_lines(v)


def _group_lines(v) -> list[str]:
    """The job's communication by process group and phase (a device mesh's, FSDP's phases)."""
    if not v.shows_groups:
        return []
    out = []
    if v.mesh:
        out.append(f"  mesh {v.mesh_words()}" + (" (run.json)" if v.mesh.get("source") == "run.json" else ""))
    out.append(f"  {'by process group and phase, ms per step (rank median)':<58}{'count':>6}{'inside':>9}{'exposed':>9}"
               f"{'wait':>8}{'transfer':>9}")
    for g in v.groups[:6]:
        who = f"{g['shown']} " + " ".join(str(x["ranks"]) for x in g["groups"][:4])
        out.append(f"  {_cut(who, 56):<58}{g['per_step']:>6g}{g['inside_ms']:>9.2f}{g['exposed_ms']:>9.2f}"
                   f"{g['wait_ms']:>8.2f}{g['transfer_ms']:>9.2f}")
        for p in g["phases"][:6]:
            out.append(f"    {_cut(p['where'], 54):<56}{p['per_step']:>6g}"
                       f"{p['inside_ms']:>9.2f}{p['exposed_ms']:>9.2f}{p['wait_ms']:>8.2f}{p['transfer_ms']:>9.2f}")
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _waited(s) -> str:
    """How much the others waited for the straggler of a step, else how much more work it had."""
    return f"others waited {s.caused_us / 1e3:.2f} ms" if s.caused_us > 0 else f"+{s.slower_pct:.0f}% work"


def _memory_line(t: TraceSummary) -> list[str]:
    mem = t.memory
    if mem is None or (mem.peak_allocated is None and mem.peak_reserved is None and mem.snapshot is None):
        return []
    g = 2**30
    parts = []
    peaks = [(v, what) for v, what in ((mem.peak_allocated, "allocated"), (mem.peak_reserved, "reserved")) if v is not None]
    if peaks:
        # each figure with its own share of the device, at the precision the findings quote
        parts.append("peak " + ", ".join(
            f"{v / g:.2f} GiB {what}" + (f" ({mem.pct_of_capacity(v):.1f} % of the device)" if mem.capacity else "")
            for v, what in peaks))
    s = mem.snapshot
    if s is not None:
        dev = f" (device {s.device})" if mem.other_devices else ""
        parts.append(f"snapshot{dev} {s.reserved / g:.2f} GiB reserved, {s.slack_pct:.1f}% unallocated, "
                     f"{s.stranded / g:.2f} GiB stranded")
        for d in mem.other_devices:
            parts.append(f"device {d['device']} {d['reserved'] / g:.2f} GiB reserved, {d['allocated'] / g:.2f} GiB allocated"
                         + (f", {d['ooms']} out-of-memory" if d["ooms"] else ""))
    return ["  memory: " + " · ".join(parts)]

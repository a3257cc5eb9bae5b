"""Several captures of one process: never the ranks of a job (no straggler or overlap verdicts across them).

- Repeated captures of one worker (`schedule(repeat=N)` with `tensorboard_trace_handler`): each capture
  is analysed on its own, and the notes say what changed from one to the next: the median step time
  and the findings that came or went. There is no job view.
- The windows of a `gpuadvise profile` run folder (a long run: `--on-signal`, `--when-slower`, `--every`):
  each window is analysed on its own (`TraceReport.window`); window 1 stays its rank's trace in a job
  view, the later windows stay out of it; the run-level analysis (run/longrun.py) compares them.
"""

from __future__ import annotations


def apply(sources, reports: list) -> tuple[bool, set[int]]:
    """Mark the reports of captures and add the comparison notes. Returns (whether the input held repeated
    handler captures: then there is no job view, the ids of the reports a job view leaves out)."""
    by_path = {str(s.path): s.capture for s in sources if getattr(s, "capture", None) is not None}
    if not by_path:
        return False, set()
    groups: dict[str, list[tuple[int, object]]] = {}
    windows: dict[str, list[tuple[int, object]]] = {}
    left_out: set[int] = set()
    for r in reports:
        cap = by_path.get(str(r.source))
        if cap is None:
            continue
        if cap.window:
            r.window = cap.index
            if cap.index > 1:  # the same process later: its job view is window 1's
                r.rank_stats = None
                left_out.add(id(r))
            windows.setdefault(cap.worker, []).append((cap.index, r))
            continue
        r.rank, r.rank_stats = None, None  # a capture is the same process again, not another rank
        for f in r.findings:
            f.rank = None
        groups.setdefault(cap.worker, []).append((cap.index, r))
    notes: list[str] = []
    for worker, members in groups.items():
        members.sort(key=lambda m: m[0])
        notes += compare(worker, [r for _, r in members])
    for worker, members in windows.items():
        notes.append(f"{len(members)} windows of one process ({worker}), recorded at different steps of the run: "
                     "each analysed on its own, not as ranks; the run-level section compares them")
    reports[0].notes[:0] = notes
    return bool(groups), left_out


def _median_ms(r) -> float | None:
    m = r.metrics
    return m.median_step_us / 1e3 if m is not None and len(m.per_step) else None


def compare(worker: str, captures: list) -> list[str]:
    notes = [f"{len(captures)} captures of one worker {worker!r} (torch.profiler schedule repeat), in the order "
             "they were recorded: each analysed on its own, not as ranks of a job"]
    for i in range(1, len(captures)):
        a, b = captures[i - 1], captures[i]
        parts = []
        ma, mb = _median_ms(a), _median_ms(b)
        if ma and mb:
            parts.append(f"median step {ma:.2f} → {mb:.2f} ms ({100 * (mb - ma) / ma:+.0f} %)")
        ra, rb = {f.rule for f in a.findings}, {f.rule for f in b.findings}
        if rb - ra:
            parts.append(f"new in capture {i + 1}: {', '.join(sorted(rb - ra))}")
        if ra - rb:
            parts.append(f"gone in capture {i + 1}: {', '.join(sorted(ra - rb))}")
        if ra == rb:
            parts.append("the same findings")
        notes.append(f"capture {i} → {i + 1}: " + "; ".join(parts))
    return notes

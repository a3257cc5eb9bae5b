"""One figure, one computation: what a reader checks across every report of one run, the text, markdown
and JSON reports and the TUI's tables alike. `problems(reports)` lists, in words, where

- the same quantity is stated twice with different values (beyond the rounding each statement prints):
  a trace's median step (its header, the job table, the Steps table, the JSON, the TUI), a rank's wait
  inside collectives (the job table, the waits per collective when the rank has one kind, the text
  line, the TUI), its time inside collectives (the job table and the Steps table's Comm), its DataLoader
  wait (the Steps table, the JSON's step split, dataloader-stall's figure), its unprofiled step and the
  profiler's overhead (the header, the calibration note, the JSON), and a median over a range of steps
  (the run's early level in its headline and in the drift finding);
- a percent has the wrong sign for its word ("slower by -42.7 %", "a step up … (−20 %)", a "Slower"
  column holding a negative number), or a ratio below one is called slower or faster;
- a ratio and its verdict disagree ("1.67× slower … no correction needed", "no measurable profiler
  overhead" beside "(1.67×)", an early median above the late one and "the step got faster");
- two ranges stated side by side overlap ("early (steps 6–292), late (steps 282–301)") or run backwards;
- a single-process loader's build of a batch is quoted above its own wait (a part above its whole).

`wording(text, where)` runs the word checks on any text (compare's reports too). Tests call these on the
reports they already have (tests/test_consistency.py on the corpus and every rule's fixtures, the
end-to-end tests on their runs): nothing here analyses or starts anything.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass

from gpuadvise.analyzer.measure.replay.calibration import NOISE

NUM = r"(\d+(?:\.\d+)?)"


@dataclass(frozen=True)
class Said:
    """One statement of a quantity: `key` names the quantity, `decimals` how it was printed."""

    key: tuple
    value: float
    decimals: int
    where: str


def _said(key: tuple, text: str, where: str) -> Said:
    text = text.strip().replace("−", "-")
    return Said(key, float(text), len(text.split(".")[1]) if "." in text else 0, where)


def _json_said(key: tuple, value, where: str) -> Said | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    text = repr(float(value))
    return Said(key, float(value), min(len(text.split(".")[1]), 3) if "." in text else 0, where)


def _median_said(key: tuple, cells: list[str], where: str) -> Said | None:
    values = [c.strip() for c in cells if re.fullmatch(r"-?\d+(?:\.\d+)?", c.strip())]
    if not values:
        return None
    decimals = max(len(v.split(".")[1]) if "." in v else 0 for v in values)
    # the median of rounded values: within the rounding of the values (an even count averages two)
    return Said(key, statistics.median(float(v) for v in values), decimals, where)


def agree(a: Said, b: Said) -> bool:
    tolerance = 0.5 * 10 ** -a.decimals + 0.5 * 10 ** -b.decimals + 1e-9
    return abs(a.value - b.value) <= tolerance


def disagreements(said: list[Said]) -> list[str]:
    by_key: dict = {}
    for s in said:
        by_key.setdefault(s.key, []).append(s)
    out = []
    for key, group in by_key.items():
        first = group[0]
        for other in group[1:]:
            if not agree(first, other):
                out.append(f"{key}: {first.value:g} ({first.where}) vs {other.value:g} ({other.where})")
    return out


# -- where each report states each quantity ------------------------------------------------------------
def _ranks(doc: dict) -> dict:
    """rank → trace source, from the JSON report (the job's ranks, or the traces' own ranks)."""
    out = {}
    for t in doc.get("traces") or []:
        if isinstance(t, dict) and t.get("rank") is not None and t.get("trace"):
            out.setdefault(int(t["rank"]), t["trace"])
    return out


def from_json(doc: dict) -> list[Said]:
    out: list[Said | None] = []
    for t in doc.get("traces") or []:
        if not isinstance(t, dict) or not t.get("trace"):
            continue
        src = t["trace"]
        out.append(_json_said(("median step ms", src), t.get("median_step_ms"), "JSON trace"))
        out.append(_json_said(("unprofiled step ms", src), t.get("unprofiled_median_step_ms"), "JSON trace"))
        split = t.get("step_breakdown_ms") or {}
        if t.get("steps"):
            out.append(_json_said(("median step ms", src), split.get("dur"), "JSON step split"))
            out.append(_json_said(("comm ms per step", src), split.get("comm"), "JSON step split"))
            out.append(_json_said(("DataLoader ms per step", src), split.get("dataloader"), "JSON step split"))
    ranks = _ranks(doc)
    job = doc.get("job") or {}
    if job.get("steps") and job["steps"] != [-1]:
        for row in job.get("per_rank") or []:
            src = row.get("trace") or ranks.get(row.get("rank"))
            out.append(_json_said(("median step ms", src), row.get("median_step_ms"), "JSON job"))
            out.append(_json_said(("comm ms per step", src), row.get("comm_ms"), "JSON job"))
            out.append(_json_said(("wait ms per step", src), row.get("wait_ms"), "JSON job"))
        out += _one_kind_waits(job.get("collectives") or [], ranks, "JSON waits per collective")
        groups = job.get("groups") or []
        if len(groups) == 1:  # one kind of process group: a rank's wait in it is its wait per step
            out += [_json_said(("wait ms per step", ranks.get(x["rank"])), x.get("wait_ms"), "JSON groups")
                    for x in groups[0].get("per_rank") or [] if ranks.get(x["rank"])]
    for f in doc.get("findings") or []:
        n = (f.get("evidence") or {}).get("numbers") or {}
        src = f.get("trace")
        if not src or f.get("topic") in ("straggler", "comm-overlap") and f.get("rule") != "GA136":
            continue
        if str(n.get("statistic", "")).startswith("median step"):
            out.append(_json_said(("median step ms", src), n.get("median_step_ms"), f"{f['topic']} evidence"))
            if f.get("topic") == "dataloader-stall":
                out.append(_json_said(("DataLoader ms per step", src), n.get("median_dataloader_ms_per_step"),
                                      "dataloader-stall evidence"))
    return [s for s in out if s is not None and s.key[1]]


def _one_kind_waits(collectives: list[dict], ranks: dict, where: str) -> list[Said | None]:
    """A rank with one kind of collective: its wait there is its wait per step (one computation)."""
    if len(collectives) != 1:
        return []
    return [_json_said(("wait ms per step", ranks.get(x["rank"])), x.get("wait_ms"), where)
            for x in collectives[0]["ranks"] if ranks.get(x["rank"])]


def md_tables(md: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """(the heading above it, header cells, body rows) of every markdown table."""
    out, heading, lines = [], "", md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") or (line.startswith("**") and line.rstrip().endswith("**") or line.startswith("**W")):
            heading = line.strip("#* ").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[i + 1].strip()):
            head = [c.strip() for c in line.strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append((heading, head, rows))
            continue
        i += 1
    return out


def from_markdown(md: str, doc: dict) -> list[Said]:
    ranks = _ranks(doc)
    out: list[Said | None] = []
    sources = [t["trace"] for t in doc.get("traces") or [] if isinstance(t, dict) and t.get("trace")]
    # the trace headers: "- **Trace:** `src` (rank N)" then its Steps and Unprofiled step lines
    current = None
    for line in md.splitlines():
        m = re.match(r"^- \*\*(?:Trace|Snapshot):\*\* `([^`]+)`", line)
        if m:
            current = m.group(1)
            continue
        if current is None:
            continue
        m = re.match(r"^- \*\*Steps:\*\* \d+ .*median " + NUM + " ms", line)
        if m:
            out.append(_said(("median step ms", current), m.group(1), "markdown header"))
        m = re.match(r"^- \*\*Unprofiled step:\*\* " + NUM + " ms median", line)
        if m:
            out.append(_said(("unprofiled step ms", current), m.group(1), "markdown header"))
            c = re.search(r"traced step " + NUM + " ms vs " + NUM + r" ms unprofiled \(" + NUM + "×\\)", line)
            if c:
                out.append(_said(("median step ms", current), c.group(1), "markdown calibration note"))
                out.append(_said(("unprofiled step ms", current), c.group(2), "markdown calibration note"))
                ratio = float(c.group(1)) / max(float(c.group(2)), 1e-9)
                x = float(c.group(3))
                if abs(ratio - x) > 0.05 * x + 0.02:
                    out.append(None)
    for heading, head, rows in md_tables(md):
        if head[:2] == ["Rank", "Median step (ms)"]:
            col = {h: i for i, h in enumerate(head)}
            for r in rows:
                src = ranks.get(int(r[0])) if r[0].isdigit() else None
                for name, key in (("Median step (ms)", "median step ms"), ("Wait (ms)", "wait ms per step"),
                                  ("Comm (ms)", "comm ms per step")):
                    if src and name in col and re.fullmatch(r"\d+(?:\.\d+)?", r[col[name]]):
                        out.append(_said((key, src), r[col[name]], "markdown job table"))
        elif head[:3] == ["Collective", "Group", "Per step"] and len(rows) == 1:
            for h, cell in zip(head[3:], rows[0][3:]):
                rank = int(h.split()[-1])
                if ranks.get(rank) and "/" in cell:
                    out.append(_said(("wait ms per step", ranks[rank]), cell.split("/")[0], "markdown waits per collective"))
        elif head[:2] == ["Step", "Time (ms)"]:
            src = _steps_source(heading, sources)
            if src:
                col = {h: i for i, h in enumerate(head)}
                for name, key in (("Time (ms)", "median step ms"), ("Comm", "comm ms per step"),
                                  ("DataLoader", "DataLoader ms per step")):
                    if name in col:
                        out.append(_median_said((key, src), [r[col[name]] for r in rows if r[0] != "all"],
                                                f"markdown Steps table ({name})"))
    return [s for s in out if s is not None and s.key[1]]


def _steps_source(heading: str, sources: list[str]) -> str | None:
    """The trace a Steps table is of: named in its heading, or the one trace."""
    if heading.startswith("Steps — "):
        named = heading[len("Steps — "):].strip()
        return next((s for s in sources if s == named or s.endswith(named) or named.endswith(s)), None)
    return sources[0] if heading == "Steps" and len(sources) == 1 else None


def from_text(text: str, doc: dict) -> list[Said]:
    ranks = _ranks(doc)
    sources = [t["trace"] for t in doc.get("traces") or [] if isinstance(t, dict) and t.get("trace")]
    out: list[Said | None] = []
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        src = next((s for s in sources if line == s or line.startswith(s + " (rank")), None)
        if src is None:
            continue
        m = re.search(r"\d+ steps?, median " + NUM + r" ms(?: \(unprofiled " + NUM + " ms)?", lines[i + 1])
        if m:
            out.append(_said(("median step ms", src), m.group(1), "text header"))
            if m.group(2):
                out.append(_said(("unprofiled step ms", src), m.group(2), "text header"))
    head = next((i for i, line in enumerate(lines) if re.match(r"^\s*rank\s+step ms\s+work ms\s+wait ms", line)), None)
    if head is not None:
        names = ["rank", "step", "work", "wait", "caused", "busy", "comm"]
        for line in lines[head + 1:]:
            cells = line.split()
            if not cells or not cells[0].isdigit():
                break
            src = ranks.get(int(cells[0]))
            row = dict(zip(names, cells))
            for name, key in (("step", "median step ms"), ("wait", "wait ms per step"), ("comm", "comm ms per step")):
                if src and re.fullmatch(r"\d+(?:\.\d+)?", row.get(name, "")):
                    out.append(_said((key, src), row[name], "text job table"))
    per_kind = [line for line in lines if ": wait ms per step rank " in line]
    if len(per_kind) == 1:
        for rank, value in re.findall(r"rank (\d+) " + NUM, per_kind[0].split(": wait ms per step", 1)[1]):
            if ranks.get(int(rank)):
                out.append(_said(("wait ms per step", ranks[int(rank)]), value, "text waits per collective"))
    return [s for s in out if s is not None and s.key[1]]


def tui_tables(reports) -> dict[str, list[dict[str, str]]]:
    """The TUI's tables as it shows them (each cell through the column's own format), without an app: the
    job's ranks and waits per collective, and each trace's steps."""
    from gpuadvise.tui.screens import job as job_screen
    from gpuadvise.tui.screens import overview

    def cells(columns, frame) -> list[dict[str, str]]:
        rows = []
        for _, r in frame.iterrows():
            row = {}
            for c in columns:
                if c.key not in r:
                    continue
                v = c.fmt(r[c.key]) if c.fmt is not None else str(r[c.key])
                row[c.title] = v.plain if hasattr(v, "plain") else str(v)
            rows.append(row)
        return rows

    out = {}
    job = getattr(reports, "job", None)
    if job is not None and job.view is not None:
        import pandas as pd

        v = job.view
        frame = pd.DataFrame(v.per_rank()).reindex(columns=[c.key for c in job_screen.RANK_COLUMNS])
        out["job ranks"] = cells(job_screen.RANK_COLUMNS, frame)
        if v.collectives:
            out["job collectives"] = cells(job_screen.COLLECTIVE_COLUMNS, job_screen._collectives(v))
    for r in reports:
        if r.metrics is not None and not r.metrics.per_step.empty:
            out[f"steps {r.source}"] = cells(overview._step_columns(), overview._step_frame(r.metrics.per_step))
    return out


def from_tui(tables: dict[str, list[dict[str, str]]], doc: dict) -> list[Said]:
    ranks = _ranks(doc)
    out: list[Said | None] = []
    if doc.get("job") and doc["job"].get("steps") and doc["job"]["steps"] != [-1]:
        for row in tables.get("job ranks", []):
            src = row.get("Trace") or ranks.get(int(row.get("Rank", "-1")))
            for title, key in (("Step ms", "median step ms"), ("Wait ms", "wait ms per step"), ("Comm ms", "comm ms per step")):
                if src and re.fullmatch(r"\d+(?:\.\d+)?", row.get(title, "")):
                    out.append(_said((key, src), row[title], f"TUI job table ({title})"))
        kinds = {row.get("Collective") for row in tables.get("job collectives", [])}
        if len(kinds) == 1:
            for row in tables.get("job collectives", []):
                src = ranks.get(int(row["Rank"]))
                if src and re.fullmatch(r"\d+(?:\.\d+)?", row.get("Wait ms/step", "")):
                    out.append(_said(("wait ms per step", src), row["Wait ms/step"], "TUI waits per collective"))
    for name, rows in tables.items():
        if not name.startswith("steps "):
            continue
        src = name[len("steps "):]
        rows = [r for r in rows if r.get("Step") != "all"]
        for title, key in (("Time ms", "median step ms"), ("Comm", "comm ms per step"), ("Loader", "DataLoader ms per step")):
            out.append(_median_said((key, src), [r.get(title, "") for r in rows], f"TUI Steps table ({title})"))
    return [s for s in out if s is not None and s.key[1]]


# -- words against their numbers -----------------------------------------------------------------------
UP = r"(?:slower|longer|larger|higher|more|up|worse|grew|rose)"
DOWN = r"(?:faster|shorter|smaller|lower|less|down|better|fell|dropped|saves?|saving)"
SIGNED_WORD = re.compile(r"\b(" + UP[3:-1] + "|" + DOWN[3:-1] + r")\s+by\s+[-−]\s?\d", re.I)
RATIO_WORD = re.compile(NUM + r"\s?×\s+(slower|faster|longer|shorter|larger|smaller)\b")
CALIBRATION = re.compile(r"\(" + NUM + r"×\): no correction needed")
OVERHEAD = re.compile(r"made the traced steps " + NUM + r"× slower")
# "a step up from step 70 … to 2.74 ms (+67 %", "a steady climb …", "a rise …": the run got slower, so +
STEP_CHANGE = re.compile(r"\b(?:a|an) (step up|steady climb|ever faster climb|rise|step down|drop|fall)\b[^;()]*?"
                         r"\(([+\-−]\d+(?:\.\d+)?) ?%")
RANGE = re.compile(r"\bsteps (\d+)–(\d+)")
EARLY_LATE = re.compile(r"median step " + NUM + r" ms early \(steps (\d+)–(\d+)\), " + NUM
                        + r" ms late \(steps (\d+)–(\d+)\)([^.]*)")
BUILD_WAIT = re.compile(r"a median " + NUM + r" ms of each [\d.]+ ms step is spent waiting[^.]*\.[^.]*?"
                        r"Building each batch takes " + NUM + " ms of that wait")


def wording(text: str, where: str) -> list[str]:
    """The word checks on one text (a report, a TUI pane, a comparison)."""
    out = []
    flat = re.sub(r"\s+", " ", text.replace("\\", ""))
    for m in SIGNED_WORD.finditer(flat):
        out.append(f"{where}: a signed figure after its direction word: {m.group(0)!r}")
    for m in RATIO_WORD.finditer(flat):
        if float(m.group(1)) < 1.0:
            out.append(f"{where}: a ratio below one called {m.group(2)}: {m.group(0)!r}")
    for m in CALIBRATION.finditer(flat):
        if float(m.group(1)) > NOISE:
            out.append(f"{where}: {m.group(1)}× slower, yet 'no correction needed': {m.group(0)!r}")
    for m in OVERHEAD.finditer(flat):
        if float(m.group(1)) <= NOISE:
            out.append(f"{where}: an overhead within noise called slower: {m.group(0)!r}")
    for sentence in (x for line in text.replace("\\", "").splitlines() for x in re.split(r"(?<=[.;])\s", line)):
        if "no measurable profiler overhead" in sentence:
            for x in re.findall(NUM + r"×", sentence):
                if float(x) > NOISE:
                    out.append(f"{where}: 'no measurable profiler overhead' beside {x}×: {sentence[:160]!r}")
    for m in STEP_CHANGE.finditer(flat):
        up = m.group(1) not in ("step down", "drop", "fall")
        pct = float(m.group(2).replace("−", "-"))
        if up and pct < 0 or not up and pct > 0:
            out.append(f"{where}: {m.group(1)} with {m.group(2)} %: {m.group(0)!r}")
    for m in RANGE.finditer(flat):
        if int(m.group(1)) > int(m.group(2)):
            out.append(f"{where}: a range of steps that runs backwards: {m.group(0)!r}")
    for m in EARLY_LATE.finditer(flat):
        early, e_hi, late, l_lo = float(m.group(1)), int(m.group(3)), float(m.group(4)), int(m.group(5))
        if e_hi >= l_lo:
            out.append(f"{where}: the early and late ranges overlap: {m.group(0)[:120]!r}")
        verdict = m.group(7)
        if "got faster" in verdict and late >= early or "got slower" in verdict and late <= early:
            out.append(f"{where}: early {early} ms, late {late} ms, and {verdict.strip()!r}")
    for m in BUILD_WAIT.finditer(flat):
        if float(m.group(2)) > float(m.group(1)) + 0.05:
            out.append(f"{where}: a batch's build ({m.group(2)} ms) above its own wait ({m.group(1)} ms)")
    return out


def signed_columns(md: str, where: str) -> list[str]:
    """A column whose title is a direction ("Slower by", "Faster by", "Saving") holds no negative number."""
    out = []
    for heading, head, rows in md_tables(md):
        for i, title in enumerate(head):
            if re.search(r"\b(slower|faster|saving|saves|gain)\b", title, re.I) and not re.search(r"\bvs\b", title):
                for r in rows:
                    if i < len(r) and re.match(r"^[-−]\s?\d", r[i]):
                        out.append(f"{where} '{heading}' table: {title!r} holds {r[i]!r}")
    return out


def problems(reports, renders: dict[str, str] | None = None, tui: bool = True) -> list[str]:
    """Every disagreement among the reports of one analysis (`reports`, as analyze returns them): the text,
    markdown and JSON reports (made here unless `renders` has them) and the TUI's tables."""
    from gpuadvise.analyzer.report import render

    r = dict(renders or {})
    for fmt in ("text", "md", "json"):
        if fmt not in r:
            r[fmt] = render(reports, fmt, top=100)
    doc = json.loads(r["json"])
    said = from_json(doc) + from_markdown(r["md"], doc) + from_text(r["text"], doc)
    found = []
    if tui:
        tables = tui_tables(reports)
        said += from_tui(tables, doc)
        for name, rows in tables.items():
            found += wording(" ".join(" ".join(row.values()) for row in rows), f"TUI {name}")
    found += disagreements(said)
    for fmt in ("text", "md"):
        found += wording(r[fmt], fmt)
    found += signed_columns(r["md"], "markdown")
    return found

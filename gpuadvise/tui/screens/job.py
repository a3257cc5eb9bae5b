"""Job: the ranks of a multi-rank run side by side (step, work, wait, the wait each caused), the rank the
job waited for in each step, the communication by process group and phase with the mesh (a device mesh's
groups, FSDP's phases), and the waits per collective; enter on a rank opens its findings."""

from __future__ import annotations

import pandas as pd
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..text import clean
from ..widgets.table_view import Column, TableView
from .base import ViewScreen


def _ms(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{float(v):.2f}"


def _pct(v) -> str:
    return "–" if v is None or pd.isna(v) else f"{float(v):.1f} %"


RANK_COLUMNS = [
    Column("rank", "Rank", 6),
    Column("median_step_ms", "Step ms", 9, fmt=_ms),
    Column("work_ms", "Work ms", 9, fmt=_ms),
    Column("wait_ms", "Wait ms", 9, fmt=_ms),
    Column("caused_wait_ms", "Others waited ms", 17, fmt=_ms),
    Column("gpu_busy_pct", "GPU busy", 9, fmt=_pct),
    Column("comm_ms", "Comm ms", 9, fmt=_ms),
    Column("findings", "Findings", 9),
    Column("trace", "Trace", 0, align="left"),
]
GROUP_COLUMNS = [
    Column("group", "Process group", 28, align="left"),
    Column("phase", "Phase", 28, align="left"),
    Column("per_step", "Per step", 9),
    Column("inside_ms", "Inside ms", 10, fmt=_ms),
    Column("exposed_ms", "Exposed ms", 11, fmt=_ms),
    Column("wait_ms", "Wait ms", 9, fmt=_ms),
    Column("transfer_ms", "Transfer ms", 0, fmt=_ms),
]
COLLECTIVE_COLUMNS = [
    Column("collective", "Collective", 15, align="left"),
    Column("group", "Group", 8, align="left"),
    Column("per_step", "Per step", 9),
    Column("rank", "Rank", 6),
    Column("wait_ms", "Wait ms/step", 13, fmt=_ms),
    Column("transfer_ms", "Transfer ms/step", 17, fmt=_ms),
    Column("last_arrivals", "Arrived last", 0),
]


class JobScreen(ViewScreen):
    MODE = "job"
    HELP = """\
**Job** — the ranks of a multi-rank run side by side. Every collective is lined up across the ranks
(clocks aligned by the collectives); a rank's *wait* is the time it spent inside collectives waiting for
the last rank to arrive with nothing else to do, its *work* the step without that wait, and *others
waited* the wait it caused by arriving last. Below: the rank the job waited for in each step; on a device
mesh (or with FSDP's phases) the communication by process group and phase: each kind of group (a mesh
dimension's), its ranks, and per phase the time inside its collectives, the part with nothing else to do
(*exposed*), split into the wait for the group's last rank and the transfer (ms per step, the median over
the group's ranks); and the waits per collective and rank (median per step).

| key | does |
|---|---|
| ↑ ↓ | move in a table; tab: the other table |
| s / r | sort by the next column / reverse |
| enter | on a rank: its findings |
"""
    DEFAULT_CSS = """
    JobScreen #job-facts { padding: 0 1; height: auto; }
    JobScreen .caption { padding: 0 1; color: $text-muted; margin-top: 1; }
    JobScreen #ranks { min-height: 5; }
    JobScreen #collectives { min-height: 5; }
    JobScreen #groups { min-height: 5; }
    """

    def compose_body(self) -> ComposeResult:
        job = getattr(self.data.reports, "job", None)
        with Vertical():
            if job is None:
                yield Static(Text("One trace: there is no job to show. Open a folder of rank traces (a run folder "
                                  "`gpuadvise profile` wrote under torchrun) to see the ranks side by side."),
                             id="job-facts")
                return
            v = job.view
            yield Static(self._facts(job), id="job-facts")
            yield Static("Ranks — enter: that rank's findings", classes="caption")
            yield TableView(RANK_COLUMNS, self._ranks(v), title="ranks", filter_keys=(), sort="rank",
                            descending=False, id="ranks")
            if v.shows_groups:
                yield Static("Communication by process group and phase (ms per step, the median over the group's "
                             "ranks)", classes="caption")
                yield TableView(GROUP_COLUMNS, _groups(v), title="groups", filter_keys=(), sort=None, id="groups")
            if v.collectives:
                yield Static("Waits per collective (median per step)", classes="caption")
                yield TableView(COLLECTIVE_COLUMNS, _collectives(v), title="collectives", filter_keys=(),
                                sort="wait_ms", id="collectives")

    @staticmethod
    def _facts(job) -> Text:
        v = job.view
        t = Text(no_wrap=False, end="")
        world = f" of {v.world_size}" if v.world_size and v.world_size != len(v.ranks) else ""
        t.append("Job ", style="bold")
        t.append(f"{len(v.ranks)}{world} ranks, " + ("each rank's trace compared as one step (no ProfilerStep)"
                                                      if v.whole_trace else f"{len(v.steps)} steps compared"))
        if v.mesh:
            t.append("\nMesh ", style="bold")
            t.append(v.mesh_words())
        if v.stragglers:
            t.append("\nWaited for ", style="bold")
            at = (lambda s: "") if v.whole_trace else (lambda s: f"#{s.step}: ")  # one step: the whole trace
            t.append(", ".join(f"{at(s)}rank {s.rank} ({s.caused_us / 1e3:.2f} ms)" if s.caused_us > 0
                               else f"{at(s)}rank {s.rank} (+{s.slower_pct:.0f} % work)" for s in v.stragglers[:12]))
        for f in job.findings[:3]:
            t.append(f"\n{f.severity:<6} ", style="bold")
            t.append(clean(f.message.split(". ")[0]) + ".")
        for note in job.notes:
            t.append("\nNote   ", style="bold")
            t.append(clean(note))
        return t

    def _ranks(self, v) -> pd.DataFrame:
        counts = {r.rank: len(r.findings) for r in self.data.reports}
        rows = [dict(row, findings=counts.get(row["rank"], 0)) for row in v.per_rank()]
        return pd.DataFrame(rows).reindex(columns=[c.key for c in RANK_COLUMNS])

    def focus_main(self) -> None:
        tables = self.query(TableView)
        if tables:
            tables.first().focus()

    def on_table_view_selected(self, event: TableView.Selected) -> None:
        event.stop()
        if event.table.id != "ranks" or event.row is None:
            return
        rank = int(event.row["rank"])
        for i, r in enumerate(self.data.reports):
            if r.rank == rank:
                self.data.current = i
                break
        # after this key is handled: the findings screen must not take the same enter as its own
        self.app.call_after_refresh(self._open_findings, rank)

    def _open_findings(self, rank: int) -> None:
        self.app.switch_mode("findings")
        screen = self.app.screen
        if hasattr(screen, "show_rank"):
            screen.show_rank(rank)


def _groups(v) -> pd.DataFrame:
    """A row per kind of process group (its ranks, all its phases), then one per phase."""
    rows = []
    for g in v.groups:
        who = f"{g['shown']} " + " ".join(str(x["ranks"]) for x in g["groups"])
        rows.append({"group": who, "phase": "all", **{k: g[k] for k in ("per_step", "inside_ms", "exposed_ms",
                                                                        "wait_ms", "transfer_ms")}})
        rows += [{"group": "", "phase": p["where"], **{k: p[k] for k in ("per_step", "inside_ms", "exposed_ms", "wait_ms",
                                                                         "transfer_ms")}} for p in g["phases"]]
    return pd.DataFrame(rows).reindex(columns=[c.key for c in GROUP_COLUMNS])


def _collectives(v) -> pd.DataFrame:
    rows = [{"collective": c["collective"], "group": c["group"] or "–", "per_step": c["per_step"], **x}
            for c in v.collectives for x in c["ranks"]]
    return pd.DataFrame(rows).reindex(columns=[c.key for c in COLLECTIVE_COLUMNS])

"""Findings: ordered by the step time a fix is predicted to save; the selected one in full on the
right (message, evidence, fix, the rule's docs); enter shows its evidence in the timeline."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Markdown, OptionList, Static
from textual.widgets.option_list import Option

from gpuadvise.rules import find_rule

from ..finding_markdown import finding_markdown
from ..text import clean
from .base import FILTER_BINDING, ViewScreen

SEVERITY_STYLE = {"high": "bold red", "medium": "bold yellow", "low": "cyan", "info": "dim"}


class FindingList(OptionList):
    """The findings, one two-line option each; enter jumps to the evidence."""

    BINDINGS = [Binding("enter", "select", "Show in timeline")]
    DEFAULT_CSS = "FindingList { text-wrap: nowrap; text-overflow: ellipsis; }"


class FindingsScreen(ViewScreen):
    MODE = "findings"
    FILTERABLE = True
    FILTER_PLACEHOLDER = "filter findings by title, rule or topic"
    HELP = """\
**Findings** — what makes the steps slow, biggest predicted saving first. The right pane shows the
selected finding: its numbers, the evidence, the fix with code, and the rule's documentation.

| key | does |
|---|---|
| ↑ ↓ | select a finding |
| enter / t | show its evidence in the timeline (then `n` visits the next evidence range) |
| tab | move to the detail pane (scroll it with ↑ ↓) |
| / | filter findings |
"""
    BINDINGS = [
        Binding("enter", "show_in_timeline", "Show in timeline"),
        Binding("t", "show_in_timeline", "Show in timeline", show=False),
        FILTER_BINDING,
    ]
    DEFAULT_CSS = """
    FindingsScreen #finding-list { width: 44%; min-width: 30; height: 1fr; border: round $primary 50%; }
    FindingsScreen #finding-list:focus { border: round $accent; }
    FindingsScreen #finding-detail-scroll { width: 1fr; height: 1fr; border: round $primary 50%; padding: 0 1; }
    FindingsScreen #finding-detail-scroll:focus { border: round $accent; }
    FindingsScreen #no-findings { padding: 1 2; }
    """

    DETAIL_DELAY = 0.08  # s: render the detail once the selection rests (Markdown is costly to build)

    def __init__(self):
        super().__init__()
        self.shown: list[int] = []  # positions in data.findings currently listed
        self.query_text = ""
        self.rank_only: int | None = None  # the job screen opened one rank's findings
        self.detail_of: int | None = None  # the finding the detail pane shows
        self._detail_timer = None

    def compose_body(self) -> ComposeResult:
        if not self.data.findings:
            yield Static(self._no_findings(), id="no-findings")
            return
        with Horizontal():
            yield FindingList(id="finding-list")
            with VerticalScroll(id="finding-detail-scroll"):
                yield Markdown("", id="finding-detail")

    def on_mount(self) -> None:
        self._fill()

    def after_recompose(self) -> None:
        self.detail_of = None
        self._fill()

    def focus_main(self) -> None:
        lists = self.query(OptionList)
        if lists:
            lists.first().focus()

    def _no_findings(self) -> Text:
        t = Text("No findings.\n\n", style="bold")
        t.append("Nothing in this trace points at a slowdown gpuadvise knows how to fix. ")
        t.append("The Overview (1) and Timeline (3) show where the step time goes.")
        for r in self.data.reports:
            for note in r.notes:
                t.append("\n• " + clean(note), style="yellow")
        return t

    def _fill(self, keep: int | None = None) -> None:
        lists = self.query(OptionList)
        if not lists:
            return
        ol = lists.first()
        q = self.query_text.lower()
        multi = len(self.data.reports) > 1
        self.shown = [i for i, f in enumerate(self.data.findings)
                      if (not q or q in f"{f.title} {f.rule} {f.topic} {f.severity}".lower())
                      and (self.rank_only is None or f.rank == self.rank_only)]
        ol.clear_options()
        ol.add_options([Option(self._prompt(self.data.findings[i], multi), id=str(i)) for i in self.shown])
        of_rank = f" of rank {self.rank_only} (/ and enter: all)" if self.rank_only is not None else ""
        ol.border_title = (f"{len(self.shown)} of {len(self.data.findings)} findings{of_rank}" if q or of_rank
                           else f"{len(self.data.findings)} findings · by est. saving")
        if self.shown:
            target = self.shown.index(keep) if keep in self.shown else 0
            ol.highlighted = target
            self._show(self.shown[target])
        else:
            self.detail_of = None
            self.query_one("#finding-detail", Markdown).update(f"*No finding matches “{_escape(self.query_text)}”.*")

    def _prompt(self, f, multi: bool) -> Text:
        saving = f"{'≤' if f.impact.upper_bound else ''}{f.impact.est_step_saving_pct:.1f} %"
        t = Text(no_wrap=True, overflow="ellipsis", end="")
        t.append(f"{saving:>8} ", style=SEVERITY_STYLE.get(f.severity, ""))
        t.append(clean(f.title))
        t.append(f"\n         {f.rule} · {f.topic} · {f.severity}", style="dim")
        if multi:
            where = self.data.label(self.data.report_of(f))
            t.append(f" · {clean(where)}", style="dim")
        return t

    def _show(self, i: int, now: bool = False) -> None:
        """Show finding i in the detail pane; while the user scrolls through the list, only the
        finding the cursor rests on gets rendered."""
        if self._detail_timer is not None:
            self._detail_timer.stop()
            self._detail_timer = None
        if i == self.detail_of:
            return
        if now or self.detail_of is None:
            self._render_detail(i)
        else:
            self._detail_timer = self.set_timer(self.DETAIL_DELAY, lambda: self._render_detail(i))

    def _render_detail(self, i: int) -> None:
        self._detail_timer = None
        self.detail_of = i
        f = self.data.findings[i]
        self.query_one("#finding-detail", Markdown).update(finding_markdown(f, find_rule(f.rule)))
        self.query_one("#finding-detail-scroll").scroll_home(animate=False)

    @property
    def selected(self) -> int | None:
        ol = self.query(OptionList)
        if not ol or ol.first().highlighted is None or not self.shown:
            return None
        return self.shown[ol.first().highlighted]

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_index is not None and event.option_index < len(self.shown):
            self._show(self.shown[event.option_index])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_show_in_timeline()

    def action_show_in_timeline(self) -> None:
        i = self.selected
        if i is None:
            return
        f = self.data.findings[i]
        r = self.data.reports[self.data.report_of(f)]
        if r.model is None:
            self.notify("This finding comes from a file without a timeline.", severity="warning")
            return
        self.app.jump_to(self.data.jump_for(f))

    def select_finding(self, i: int) -> None:
        """Select finding i of data.findings (used by the command palette)."""
        if i not in self.shown:
            self.query_text = ""
            self._fill(keep=i)
        else:
            self.query_one(OptionList).highlighted = self.shown.index(i)

    def apply_filter(self, text: str) -> None:
        self.query_text = text.strip()
        self.rank_only = None
        self._fill(keep=self.selected)

    def show_rank(self, rank: int | None) -> None:
        """List only the findings on `rank` (the job screen's enter on a rank); None: all of them."""
        self.rank_only = rank
        self._fill()


def _escape(text: str) -> str:
    from gpuadvise.analyzer.report.safe import md

    return md(text)

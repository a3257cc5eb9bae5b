"""The command palette (ctrl+p): screens, export, help, the steps of the trace, the findings, and the
other traces when several were opened."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content

from .text import clean
from .widgets.chrome import SCREENS

MAX_STEP_COMMANDS = 5000


class ViewCommands(Provider):
    def _commands(self) -> list[tuple[str, str, object, bool]]:
        """(title, help, callback, trusted): untrusted titles carry trace text and are never parsed as markup."""
        app = self.app
        out: list[tuple[str, str, object, bool]] = []
        for mode, title, key in SCREENS:
            out.append((f"Show {title}", f"switch to the {title} screen (key {key})", partial(app.action_show, mode), True))
        out.append(("Export the markdown report", "write findings, steps and top kernels to a .md file (key e)",
                    app.action_export, True))
        out.append(("Help: keys", "what each screen shows and its keys (key ?)", app.action_help, True))
        data = getattr(app, "data", None)
        if data is None:
            return out
        from .data import Jump

        for i, f in enumerate(data.findings):
            out.append((f"Finding: {clean(f.title)}", f"{f.rule} · est. saving {f.impact.est_step_saving_pct:.1f} %",
                        partial(app.open_finding, i), False))
        if data.has_trace:
            steps = data.report.metrics.steps[:MAX_STEP_COMMANDS]
            for s in steps:
                out.append((f"Timeline: step #{s.number}", f"{s.dur / 1e3:.2f} ms",
                            partial(app.jump_to, Jump(report=data.current, step=s.number)), True))
        if len(data.reports) > 1:
            for i in range(len(data.reports)):
                out.append((f"Trace: {clean(data.label(i))}", "show this trace in every screen",
                            partial(app.select_report, i), False))
        return out

    async def discover(self) -> Hits:
        for title, help_text, callback, trusted in self._commands()[: len(SCREENS) + 2]:
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback, trusted in self._commands():
            score = matcher.match(title)
            if score > 0:
                display = matcher.highlight(title) if trusted else Content(title)
                yield Hit(score, display, callback, text=title, help=help_text)

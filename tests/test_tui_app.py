"""`gpuadvise view` driven with Textual's Pilot on synthetic traces (the rules' positive fixtures and
a few built here): every screen, navigation, sort, filter, the jump from a finding to the timeline,
export, the palette, loading in a worker and bad input. No torch, no GPU.

Plus unit tests of the parts that must stay fast on huge traces (the timeline index, the table) and
of the safety of trace names on screen.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("textual")

from rich.text import Text  # noqa: E402

from _cli_support import tui_trace  # noqa: E402
from _tui_support import press, run, settle  # noqa: E402
from gpuadvise.analyzer.report import render  # noqa: E402
from gpuadvise.analyzer.run.engine import analyze_paths  # noqa: E402
from gpuadvise.fixtures.builder import TraceBuilder  # noqa: E402
from gpuadvise.rules import all_rules, find_rule  # noqa: E402
from gpuadvise.tui import timeline_index as ti  # noqa: E402
from gpuadvise.tui.app import GpuadviseApp  # noqa: E402
from gpuadvise.tui.screens.dialogs import ExportScreen, HelpScreen  # noqa: E402
from gpuadvise.tui.screens.findings import FindingsScreen  # noqa: E402
from gpuadvise.tui.screens.job import JobScreen  # noqa: E402
from gpuadvise.tui.screens.loading import LoadingScreen  # noqa: E402
from gpuadvise.tui.screens.memory import MemoryScreen  # noqa: E402
from gpuadvise.tui.screens.overview import OverviewScreen  # noqa: E402
from gpuadvise.tui.screens.tables import CopiesScreen, KernelsScreen  # noqa: E402
from gpuadvise.tui.screens.timeline import StepPicker, TimelineScreen  # noqa: E402
from gpuadvise.tui.widgets.table_view import Column, TableView  # noqa: E402
from gpuadvise.tui.widgets.timeline_view import TimelineView  # noqa: E402

SIZE = (120, 36)


def memory_builder() -> TraceBuilder:
    """Four steps that allocate and free, with the allocator's totals (profile_memory=True)."""
    b = TraceBuilder()
    allocated = 1 << 30
    for _ in range(4):
        with b.step():
            b.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 200)
            for k in range(3):
                allocated += 256 << 20
                b.memory(256 << 20, allocated, 3 << 30)
                with b.op("aten::linear"):
                    b.kernel("ampere_sgemm_128x64_tn", 900)
            for k in range(3):
                allocated -= 256 << 20
                b.memory(-(256 << 20), allocated, 3 << 30)
                b.kernel("ampere_sgemm_64x64_nt", 500)
            b.sync()
    b.finish()
    return b


class Positives(dict):
    """Rules' positive fixtures, written to disk and analysed on first use: {rule name: [report]}.
    Only what a test asks for is analysed (each costs a replay); "memory" is `memory_builder()`."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str) -> list:
        builder = memory_builder() if name == "memory" else find_rule(name).positive()
        # memory rules build allocator snapshots (pickles); the rest build traces
        suffix = ".json.gz" if isinstance(builder, TraceBuilder) else ".pickle"
        self[name] = analyze_paths([str(builder.write(self.folder / f"{name}{suffix}"))])
        return self[name]


# the trace rules whose findings the findings test lists (one trace each)
LISTED = ("dataloader-stall", "pageable-memcpy", "host-sync", "launch-bound", "no-tensor-cores", "low-gpu-utilization")


@pytest.fixture(scope="module")
def positives(tmp_path_factory) -> Positives:
    return Positives(tmp_path_factory.mktemp("positives"))


@pytest.fixture
def stall(positives):
    return positives["dataloader-stall"]


def _positive_or_none(rule):
    try:
        return rule.positive()
    except NotImplementedError:
        return None


def make_app(reports, tmp_path=None, **kw) -> GpuadviseApp:
    return GpuadviseApp(reports=reports, export_dir=tmp_path, cursor_blink=False, **kw)


# ----------------------------------------------------------------------------------------------------
# Screens


def test_opens_on_findings_then_every_screen_by_key_and_help(stall):
    async def go():
        app = make_app(stall)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert isinstance(app.screen, FindingsScreen)
            for key, cls in (("1", OverviewScreen), ("3", TimelineScreen), ("4", KernelsScreen),
                             ("5", CopiesScreen), ("6", MemoryScreen), ("2", FindingsScreen)):
                assert isinstance(await press(pilot, key), cls), key
            # help: the current screen's keys, then the global ones; escape closes, F1 opens too
            assert isinstance(await press(pilot, "3", "question_mark"), HelpScreen) and "zoom in" in app.screen.screen_help
            assert isinstance(await press(pilot, "escape"), TimelineScreen)
            assert isinstance(await press(pilot, "f1"), HelpScreen)

    run(go())


def test_overview_of_a_long_run_draws_its_step_time(tmp_path):
    folder = find_rule("step-time-drift").positive().write(tmp_path / "run")
    reports = analyze_paths([str(folder)], jobs=1)

    async def go():
        app = make_app(reports, first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            facts = str(app.screen.query_one("#facts").render())
            assert "a step up from step 60" in facts and "Window     1 of 2: schedule" in facts
            bars = next(x for x in facts.splitlines() if x.startswith("Step time")).split()[2]
            # 2 ms steps, then 6 ms from step 60: on one scale from 0, the end's bars stand far higher
            assert len(set(bars[:20])) == len(set(bars[-20:])) == 1 and "▁▂▃▄▅▆▇█".index(bars[-1]) >= 2 * "▁▂▃▄▅▆▇█".index(bars[0])
    run(go())


def test_memory_snapshot_opens_on_every_screen(positives):
    """An allocator snapshot has findings but no timeline: every screen says so instead of failing."""
    snapshot_rules = [r.name for r in all_rules() if not isinstance(_positive_or_none(r), (TraceBuilder, type(None)))]
    if not snapshot_rules:
        pytest.skip("no rule builds a memory snapshot fixture")
    snaps = positives[snapshot_rules[0]]

    async def go():
        app = make_app(snaps[:1], first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert "memory snapshot" in str(app.screen.query_one("#facts").render())
            await pilot.press("3")
            await pilot.pause()
            assert "no timeline" in str(app.screen.query_one("#timeline-info").render())
            for key in "456":
                await pilot.press(key)
                await pilot.pause()
            assert "No memory data" in str(app.screen.query_one("#no-memory").render())

    run(go())


def test_overview_shows_facts_steps_and_busy_chart(stall):
    async def go():
        app = make_app(stall, first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            screen = app.screen
            facts = str(screen.query_one("#facts").render())
            assert "NVIDIA A100-SXM4-80GB" in facts and "sm 8.0" in facts
            assert "median step" in facts
            steps = screen.query_one("#steps", TableView)
            assert len(steps.view) == len(stall[0].metrics.steps) == 4
            assert screen.query_one("#busy-chart")
            # the breakdown bar is as wide as its column and shows the data-loader share
            bar = steps.frame["bar"].iloc[0]
            assert isinstance(bar, Text) and bar.cell_len == 30
            assert any(span.style == "#ff8700" for span in bar.spans)
            # enter on a step opens it in the timeline
            await pilot.press("down", "enter")
            await settle(pilot)
            assert isinstance(app.screen, TimelineScreen)
            assert app.screen.view.step[0] == stall[0].metrics.steps[1].number

    run(go())


def test_overview_quotes_the_figures_the_reports_print(tmp_path):
    """One summary for every output: the overview's step count, median step and GPU busy shares are the
    markdown report's, digit for digit, also where the busy share (61.552 %, 61.55 in the summary) sits on
    a rounding edge."""
    tui_trace().write(tmp_path / "train.json.gz")
    reports = analyze_paths([str(tmp_path / "train.json.gz")])
    md = render(reports, "md")
    steps = re.search(r"\*\*Steps:\*\* (\d+) \(ProfilerStep#\d+–#\d+\), median ([\d.]+) ms", md)
    busy = re.search(r"\*\*GPU busy:\*\* ([\d.]+) % of the GPU's active span, ([\d.]+) % inside the steps", md)
    assert steps and busy, md

    async def go():
        app = make_app(reports, first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            facts = str(app.screen.query_one("#facts").render())
            assert f"Steps      {steps[1]} (#" in facts and f"median step {steps[2]} ms" in facts
            assert f"busy {busy[2]} % inside the steps, {busy[1]} % of its active span" in facts

    run(go())


def test_findings_sorted_by_saving_with_markdown_detail(positives):
    reports = [r for name in LISTED for r in positives[name]]

    async def go():
        app = make_app(reports)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            screen = app.screen
            findings = app.data.findings
            assert len(findings) >= 5
            assert screen.shown == list(range(len(findings)))
            causes = [f.impact.est_step_saving_pct for f in findings if not f.impact.upper_bound]
            assert causes == sorted(causes, reverse=True)
            # the detail pane: message, evidence, fix, and the rule's docs
            await pilot.press("down")
            await pilot.pause()
            f = findings[screen.selected]
            md = screen.query_one("#finding-detail").source
            assert f.message.split(":")[0][:30] in md.replace("\\", "")
            assert "## Evidence" in md and "## Fix" in md
            assert "### What it detects" in md and find_rule(f.rule).name in md
            # filter by rule code
            await pilot.press("slash", *"103", "enter")
            await pilot.pause()
            assert [findings[i].rule for i in screen.shown] == ["GA103"] * len(screen.shown)
            assert screen.shown
            await pilot.press("slash", "escape")
            await pilot.pause()
            assert len(screen.shown) == len(findings)

    run(go())


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.name)
def test_every_rule_renders_in_the_detail_pane(rule):
    from gpuadvise.analyzer.model.findings import Evidence, Finding, Impact
    from gpuadvise.tui.finding_markdown import finding_markdown

    f = Finding(rule=rule.code, topic=rule.topic, severity="high", title=rule.title, message="42 ms lost [x](y)",
                evidence=Evidence(items=[{"name": "k|[a]", "count": 3}]), impact=Impact(12.5, "replay"),
                advice="", fix=rule.fix)
    md = finding_markdown(f, rule)
    assert md.count("## Fix") == 1  # the docs' own Fix section is not repeated under "About"
    assert "### What it detects" in md and "### Thresholds" in md
    assert "\\[x\\](y)" in md  # a link in a message stays text
    assert "`k\\|[a]`" in md  # a name in the items table: code, pipe escaped


def test_enter_on_finding_jumps_to_its_evidence_in_the_timeline(stall):
    finding = stall[0].findings[0]
    assert finding.rule == "GA102"
    ranges = sorted(finding.evidence.time_ranges_ms)

    async def go():
        app = make_app(stall)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.press("enter")
            await settle(pilot)
            assert isinstance(app.screen, TimelineScreen)
            view = app.screen.view
            start, end = finding.evidence.time_ranges_ms[0]
            assert view.cursor_t == pytest.approx(start * 1e3)
            assert view.t0 <= start * 1e3 and end * 1e3 <= view.t0 + view.span
            assert view.index.lanes[view.lane].kind == "dataloader"
            assert view.marks is not None and len(view.marks) == len(ranges)
            # the detail pane names the DataLoader wait under the cursor
            details = str(app.screen.query_one("#timeline-details").render())
            assert "DataLoader" in details
            # n visits the evidence ranges in time order
            later = [a for a, _ in ranges if a * 1e3 > view.cursor_t]
            await pilot.press("n")
            await pilot.pause()
            assert view.cursor_t == pytest.approx((later[0] if later else ranges[0][0]) * 1e3)

    run(go())


def test_timeline_zoom_pan_steps_and_lanes(stall):
    async def go():
        app = make_app(stall, first_screen="timeline")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            view = app.screen.query_one(TimelineView)
            assert view.index is not None and view.step_pos == 0
            kinds = [lane.kind for lane in view.index.lanes]
            assert "dataloader" in kinds and "runtime" in kinds and "gpu" in kinds
            full = view.span
            await pilot.press("plus", "plus")
            assert view.span == pytest.approx(full / 4)
            t0 = view.t0
            await pilot.press("shift+right")
            assert view.t0 == pytest.approx(t0 + view.span / 4)
            await pilot.press("minus")
            assert view.span == pytest.approx(full / 2)
            await pilot.press("0")
            assert view.span == pytest.approx(full)
            await pilot.press("right_square_bracket")
            assert view.step_pos == 1
            await pilot.press("left_square_bracket")
            assert view.step_pos == 0
            lane = view.lane
            await pilot.press("down")
            assert view.lane == lane + 1
            # the step picker
            assert isinstance(await press(pilot, "s"), StepPicker)
            assert isinstance(await press(pilot, "down", "down", "enter"), TimelineScreen) and view.step_pos == 2
            # every visible line renders to the widget's width
            width = view.scrollable_content_region.width
            for y in range(view.scrollable_content_region.height):
                assert view.render_line(y).cell_length == width

    run(go())


def test_timeline_next_event_and_zoom_to_item(stall):
    async def go():
        app = make_app(stall, first_screen="timeline")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            view = app.screen.view
            view.select_lane_kind("gpu")
            await pilot.press("full_stop")
            lane, i, _ = view.item_at_cursor()
            assert lane.kind == "gpu" and view.cursor_t == pytest.approx(lane.starts[i])
            await pilot.press("enter")
            assert view.span == pytest.approx(max(lane.ends[i] - lane.starts[i], 0.01 * view.bar_width) * 2)

    run(go())


def test_timeline_highlight_by_name(stall):
    async def go():
        app = make_app(stall, first_screen="timeline")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            view = app.screen.view
            await pilot.press("slash", *"s1688gemm", "enter")
            await pilot.pause()
            assert view.highlight is not None
            gpu = view.index.lane_of_kind("gpu")
            assert len(view.highlight[gpu]) == len(view.index.lanes[gpu])  # every kernel matches
            dl = view.index.lane_of_kind("dataloader")
            assert len(view.highlight[dl]) == 0
            assert "s1688gemm" in str(app.screen.query_one("#timeline-info").render())
            await pilot.press("escape")
            await pilot.pause()
            assert view.highlight is None

    run(go())


def test_kernels_and_ops_sort_and_filter(positives):
    reports = positives["no-tensor-cores"]

    async def go():
        app = make_app(reports, first_screen="kernels")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            kernels = app.screen.query_one("#kernels", TableView)
            ops = app.screen.query_one("#ops", TableView)
            assert kernels.has_focus and kernels.sort_key == "total_us"
            totals = kernels.frame["total_us"].to_numpy()[kernels.view]
            assert list(totals) == sorted(totals, reverse=True)
            await pilot.press("s")  # next sortable column after total: mean
            assert kernels.sort_key == "mean_us"
            await pilot.press("r")
            means = kernels.frame["mean_us"].to_numpy()[kernels.view]
            assert list(means) == sorted(means)
            name = str(kernels.frame["name"].iloc[0])
            word = name[:6]
            await pilot.press("slash", *word, "enter")
            await pilot.pause()
            shown = kernels.frame["name"].iloc[kernels.view]
            assert len(shown) and all(word.lower() in n.lower() for n in shown)
            assert word in kernels.border_title
            assert ops.query_text == word  # one filter for both tables
            await pilot.press("slash", "escape")
            await pilot.pause()
            assert len(kernels.view) == len(kernels.frame)
            await pilot.press("tab")
            assert ops.has_focus
            # enter on a kernel: the timeline highlights where it runs
            kernels.focus()
            await pilot.press("home", "enter")
            await settle(pilot)
            assert isinstance(app.screen, TimelineScreen)
            assert app.screen.view.highlight is not None

    run(go())


def test_copies_and_syncs(positives):
    reports = positives["pageable-memcpy"]

    async def go():
        app = make_app(reports, first_screen="copies")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            copies = app.screen.query_one("#copies", TableView)
            syncs = app.screen.query_one("#syncs", TableView)
            routes = set(copies.frame["route"])
            assert any("Pageable" in r for r in routes)
            assert (copies.frame["gbps"] > 0).all()
            assert len(syncs.frame) >= 1
            assert {"name", "op", "source", "count"} <= set(syncs.frame.columns)
            detail = str(app.screen.query_one("#row-detail").render())
            assert "GB/s" in detail
            # enter on a copy kind: the timeline at its first copy
            await pilot.press("enter")
            await settle(pilot)
            assert isinstance(app.screen, TimelineScreen)
            row = copies.frame.iloc[int(copies.view[0])]
            assert app.screen.view.cursor_t == pytest.approx(row["first_ts"])

    run(go())


def test_memory_chart_and_no_memory_message(positives, stall):
    async def go():
        app = make_app(positives["memory"], first_screen="memory")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            stats = str(app.screen.query_one("#memory-stats").render())
            assert "GPU 0" in stats and "peak allocated 1.8 GiB" in stats and "peak reserved 3.0 GiB" in stats
            chart = app.screen.query_one("#memory-chart")
            lines = [chart.render_line(y).text for y in range(chart.size.height)]
            assert "3.0 GiB" in lines[0] and any("█" in line for line in lines)
        app = make_app(stall, first_screen="memory")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert "No memory data" in str(app.screen.query_one("#no-memory").render())

    run(go())


# ----------------------------------------------------------------------------------------------------
# Keys everywhere: help, export, palette, traces


def test_export_writes_the_markdown_report_atomically(stall, tmp_path):
    from gpuadvise.analyzer.report.markdown import render

    async def go():
        app = make_app(stall, tmp_path, first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert isinstance(await press(pilot, "e"), ExportScreen)
            await pilot.press("enter")
            await pilot.pause()
            target = tmp_path / "gpuadvise-report.md"
            assert app.last_export == target
            assert target.read_text() == render(stall)
            assert [p.name for p in tmp_path.iterdir()] == ["gpuadvise-report.md"]  # no temp file left
            assert any(str(target) in n.message for n in app._notifications)
            # into a folder that does not exist: an error, nothing written
            await pilot.press("e")
            await pilot.pause()
            field = app.screen.query_one("#export-path")
            field.value = str(tmp_path / "missing" / "r.md")
            await pilot.press("enter")
            await pilot.pause()
            assert app.last_export == target
            assert any(n.severity == "error" for n in app._notifications)

    run(go())


def test_command_palette_switches_screens_and_steps(stall):
    async def go():
        app = make_app(stall, first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*"memory")
            await pilot.pause(0.1)
            await pilot.press("enter")
            await settle(pilot)
            assert isinstance(app.screen, MemoryScreen)
            step = stall[0].metrics.steps[2].number
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*f"#{step}")
            await pilot.pause(0.1)
            await pilot.press("enter")
            await settle(pilot)
            assert isinstance(app.screen, TimelineScreen)
            assert app.screen.view.step[0] == step

    run(go())


def test_several_traces_switch_with_angle_brackets(positives):
    reports = positives["dataloader-stall"] + positives["pageable-memcpy"]

    async def go():
        app = make_app(reports, first_screen="overview")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert "dataloader-stall.json.gz" in str(app.screen.query_one("#facts").render())
            await pilot.press("greater_than_sign")
            await pilot.pause()
            assert app.data.current == 1
            assert "pageable-memcpy.json.gz" in str(app.screen.query_one("#facts").render())
            await pilot.press("3")  # the timeline follows the current trace
            await settle(pilot)
            assert app.screen.view.index is app.data.timeline(1)
            # a finding of the first trace jumps back to it
            await pilot.press("2")
            await pilot.pause()
            first = next(i for i, f in enumerate(app.data.findings) if app.data.report_of(f) == 0)
            app.screen.select_finding(first)
            await pilot.press("enter")
            await settle(pilot)
            assert app.data.current == 0 and app.screen.view.index is app.data.timeline(0)

    run(go())


# ----------------------------------------------------------------------------------------------------
# Loading in a worker, bad input, the CLI


def test_loads_paths_in_a_worker_with_progress(tmp_path, monkeypatch):
    from gpuadvise.tui.data import ViewData

    path = find_rule("dataloader-stall").positive().write(tmp_path / "stall.json.gz")
    # the timeline index is built in the background once the findings are up, not beside their drawing
    screens_when_indexed = []
    build = ViewData.timeline
    monkeypatch.setattr(ViewData, "timeline", lambda data, i=None: (screens_when_indexed.append(type(app.screen)),
                                                                    build(data, i))[1])

    async def go():
        nonlocal app
        app = GpuadviseApp(paths=[str(path)], cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            assert isinstance(app.screen, LoadingScreen)  # painted before the analysis is done
            await settle(pilot)
            assert isinstance(app.screen, FindingsScreen)
            assert app.data.findings[0].rule == "GA102"
            assert not app.loading and app.data.timeline_ready(0)

    app = None
    run(go())
    assert screens_when_indexed and set(screens_when_indexed) == {FindingsScreen}


def test_view_shows_the_same_findings_as_analyze_on_a_rank_folder(tmp_path, capsys):
    """Job-level findings (a straggler: GA130) come with the reports in `view` as in `analyze`."""
    import json

    from gpuadvise.analyzer.run.cli import main as analyze_main
    from gpuadvise.fixtures.builder import job_folder

    folder = job_folder(ranks=2, straggler=1, slowdown=1.5).write(tmp_path / "job")
    assert analyze_main([str(folder), "--format", "json", "-q"]) == 0
    expected = [(f["rule"], f["rank"], f["title"]) for f in json.loads(capsys.readouterr().out)["findings"]]
    assert ("GA130", 1) in [(rule, rank) for rule, rank, _ in expected]

    async def go():
        app = GpuadviseApp(paths=[str(folder)], cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            screen = app.screen
            assert isinstance(screen, FindingsScreen)
            shown = [app.data.findings[i] for i in screen.shown]
            assert [(f.rule, f.rank, f.title) for f in shown] == expected
            await pilot.press("slash", *"130", "enter")
            await pilot.pause()
            assert [app.data.findings[i].rule for i in screen.shown] == ["GA130"]
            assert "rank 1" in screen.query_one("#finding-detail").source

    run(go())


def test_job_screen_shows_the_ranks_and_opens_a_ranks_findings(tmp_path):
    """A 4-rank job whose rank 2 computes 1.5× longer: the job screen lists the ranks with their waits, the
    rank the job waited for per step and the waits per collective; enter on rank 2 shows its findings."""
    from gpuadvise.fixtures.builder import job_folder

    folder = job_folder(ranks=4, straggler=2, slowdown=1.5).write(tmp_path / "job")
    reports = analyze_paths([str(folder)], jobs=1)

    async def go():
        app = make_app(reports, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.press("7")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, JobScreen)
            facts = str(screen.query_one("#job-facts").render())
            assert "4 ranks, 4 steps compared" in facts and "#0: rank 2" in facts
            ranks = screen.query_one("#ranks", TableView)
            frame = ranks.frame
            assert list(frame["rank"]) == [0, 1, 2, 3]
            waits = dict(zip(frame["rank"], frame["wait_ms"]))
            assert waits[2] < 0.1 and all(waits[r] > 4.0 for r in (0, 1, 3)), waits  # the others wait ~5 ms for rank 2
            collectives = screen.query_one("#collectives", TableView).frame
            assert set(collectives["collective"]) == {"all_reduce"} and len(collectives) == 4
            ranks.focus()
            await pilot.press("down", "down", "enter")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, FindingsScreen) and app.data.report.rank == 2
            assert screen.shown and {app.data.findings[i].rank for i in screen.shown} == {2}

    run(go())


def test_job_screen_shows_the_mesh_and_the_communication_by_group_and_phase(tmp_path):
    """A 2 × 2 mesh (FSDP2 over dp, tensor parallel over tp): the job screen says the mesh and has a row per
    kind of process group with its ranks, then one per phase."""
    from gpuadvise.fixtures.meshjob import mesh_job

    folder = mesh_job(dp=2, tp=2, slow={3: 1.5}).write(tmp_path / "mesh")
    reports = analyze_paths([str(folder)], jobs=1)

    async def go():
        app = make_app(reports, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.press("7")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, JobScreen)
            assert "dp × tp = 2 × 2: dp [0, 2] [1, 3]; tp [0, 1] [2, 3]" in str(screen.query_one("#job-facts").render())
            rows = screen.query_one("#groups", TableView).frame
            heads = rows[rows["phase"] == "all"]["group"].tolist()
            assert sorted(heads) == ["mesh_dp (FSDP) [0, 2] [1, 3]", "mesh_tp (tensor parallel) [0, 1] [2, 3]"]
            assert set(rows["phase"]) == {"all", "all-gather in forward", "all-gather in backward",
                                          "reduce-scatter in backward", "all-reduce in forward", "all-reduce in backward"}
            assert (rows["exposed_ms"] >= 0).all() and (rows["inside_ms"] >= rows["exposed_ms"] - 1e-6).all()

    run(go())


def test_progress_follows_the_bytes_when_the_engine_reports_them(tmp_path, monkeypatch):
    """The decode's `progress(done, total)` callback of the analysis moves the bar."""
    import gpuadvise.analyzer.run.engine as engine

    real = engine.analyze_source
    seen = []

    def reporting(src, rules=None, progress=None, cache=None):
        for done in (25, 50, 100):
            progress(done, 100)
            seen.append(done)
        return real(src, rules=rules, cache=cache)

    monkeypatch.setattr(engine, "analyze_source", reporting)
    path = find_rule("dataloader-stall").positive().write(tmp_path / "stall.json.gz")

    async def go():
        app = GpuadviseApp(paths=[str(path)], cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            loading = app.screen
            await settle(pilot)
            assert seen == [25, 50, 100]
            assert loading.counts == (1.0, 1)  # the last report: all bytes of file 1 of 1
            assert isinstance(app.screen, FindingsScreen)

    run(go())


def test_bad_input_shows_the_error_and_quits_with_2(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": "this is not a trace"}')

    async def go():
        app = GpuadviseApp(paths=[str(bad)], cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            screen = app.screen
            assert isinstance(screen, LoadingScreen) and screen.has_class("-failed")
            message = str(screen.query_one("#loading-error").render())
            assert "notes.json" in message and "press q" in message.lower()
            await pilot.press("1")  # screens need data: nothing happens
            assert isinstance(app.screen, LoadingScreen)
            await pilot.press("q")
        assert app.return_code == 2

    run(go())


def test_cli_missing_file_exits_2_with_one_line(capsys, tmp_path):
    from gpuadvise.cli import main

    assert main(["view", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.json" in err[0] and err[0].startswith("gpuadvise: error:")


# ----------------------------------------------------------------------------------------------------
# Untrusted names, and speed on big data


def test_trace_names_cannot_inject_markup_or_escape_sequences(tmp_path):
    evil = "evil[bold red]kernel[/] \x1b]8;;http://x\x07link\x1b[2J"
    b = TraceBuilder()
    for _ in range(2):
        with b.step():
            with b.op("aten::mm"):
                b.kernel(evil, 50)
            b.sync()
    b.finish()
    reports = analyze_paths([str(b.write(tmp_path / "evil.json.gz"))])

    async def go():
        app = make_app(reports, first_screen="kernels")
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            table = app.screen.query_one("#kernels", TableView)
            text = "".join(table.render_line(y).text for y in range(1, 4))
            assert "evil[bold red]kernel[/] link" in text  # literal brackets, no escapes
            assert "\x1b" not in text and "\x07" not in text
            # a typed filter with brackets is text in the table's title too
            table.set_filter("[bold red]")
            assert "[bold red]" in str(table.border_title) and len(table.view) == 1
            await pilot.press("3")
            await settle(pilot)
            view = app.screen.view
            view.select_lane_kind("gpu")
            await pilot.press("full_stop")
            details = app.screen.query_one("#timeline-details").render()
            assert "evil[bold red]kernel[/] link" in str(details) and "\x1b" not in str(details)

    run(go())


def test_table_view_pages_100k_rows_quickly():
    n = 100_000
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"name": [f"kernel_{i}_{'gemm' if i % 3 else 'elementwise'}" for i in range(n)],
                          "total_us": rng.random(n) * 1e3, "count": rng.integers(1, 100, n)})
    from textual.app import App

    class One(App):
        def compose(self):
            yield TableView([Column("name", "Kernel", 0, align="left"), Column("count", "Count", 8),
                             Column("total_us", "Total", 10, fmt=lambda v: f"{v:.1f}")], frame, sort="total_us", id="t")

    async def go():
        app = One()
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.query_one(TableView)
            t = time.perf_counter()
            table.set_filter("gemm")
            table.sort_by("name", descending=False)
            table.set_filter("")
            table.sort_by("total_us", descending=True)
            await pilot.press("end")
            await pilot.pause()
            elapsed = time.perf_counter() - t
            assert len(table.view) == n and table.cursor == n - 1
            assert elapsed < 2.0, elapsed  # DataTable needs ~12 s just to add 100k rows
            last = table.frame.iloc[int(table.view[-1])]
            assert last["total_us"] == frame["total_us"].min()
            screen_text = "".join(table.render_line(y).text for y in range(table.scrollable_content_region.height))
            assert last["name"] in screen_text

    run(go())


def _random_lane(n: int, seed: int = 0, nested: bool = False) -> ti.Lane:
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.random(n) * 1e6)
    durs = rng.exponential(50.0 if not nested else 400.0, n)
    ends = starts + durs
    return ti.Lane("lane", "gpu", "", np.arange(n), starts, ends, np.full(n, ti.KERNEL, np.uint8),
                   np.zeros(n, np.int32), pd.Index(["k"]))


@pytest.mark.parametrize("nested", [False, True])
def test_lane_hit_and_busy_match_brute_force(nested):
    lane = _random_lane(3000, seed=1, nested=nested)
    edges = np.linspace(-100, 1.01e6, 301)
    a, b = edges[:-1], edges[1:]
    hit = lane.hit(a, b)
    busy = lane.busy(a, b)
    for k in range(len(a)):
        overlapping = np.flatnonzero((lane.starts < b[k]) & (lane.ends > a[k]))
        assert (hit[k] >= 0) == bool(overlapping.size), k
        if hit[k] >= 0:
            assert lane.starts[hit[k]] < b[k] and lane.ends[hit[k]] > a[k]
        s, e = np.clip(lane.starts[overlapping], a[k], b[k]), np.clip(lane.ends[overlapping], a[k], b[k])
        from gpuadvise.analyzer.measure.basics import intervals as iv

        assert busy[k] == pytest.approx(iv.total(*iv.union(s, e)) / (b[k] - a[k]), abs=1e-9)


def test_drawing_a_lane_costs_the_same_for_a_million_events():
    small, big = _random_lane(1_000), _random_lane(1_000_000, seed=2)
    edges = np.linspace(0, 1e6, 201)

    def cost(lane):
        t = time.perf_counter()
        for _ in range(50):
            lane.hit(edges[:-1], edges[1:])
            lane.busy(edges[:-1], edges[1:])
        return (time.perf_counter() - t) / 50

    assert cost(big) < 0.005  # a few µs per column, whatever the event count
    assert cost(big) < 20 * cost(small)


def test_breakdown_bar_adds_up_to_the_step():
    from gpuadvise.tui.widgets.charts import breakdown_bar, breakdown_parts

    row = {"dur_us": 1000.0, "kernel_us": 300.0, "comm_us": 100.0, "memcpy_us": 50.0, "memset_us": 0.0,
           "dataloader_us": 700.0, "idle_us": 550.0}
    parts = breakdown_parts(row)
    assert parts == [300.0, 100.0, 50.0, 550.0, 0.0]  # the loader wait is capped at the GPU idle time
    bar = breakdown_bar(row, 20)
    assert bar.cell_len == 20 and bar.plain == "█" * 20


def test_memory_buckets_keep_peaks_and_hold_levels():
    from gpuadvise.tui.widgets.charts import bucket_max

    x = np.array([1.0, 2.0, 2.5, 7.0])
    y = np.array([10.0, 50.0, 20.0, 5.0])
    out = bucket_max(x, y, 0.0, 10.0, 10)
    assert np.isnan(out[0])  # before the first sample
    assert out[1] == 10 and out[2] == 50  # the peak inside a bucket survives
    assert list(out[3:7]) == [50] * 4 and list(out[7:]) == [5] * 3  # a level holds until the next sample


def test_stall_detail_pane_shows_where_loading_time_goes(tmp_path):
    # a run folder whose run.json holds the DataLoader sampling (`gpuadvise profile`'s `loader`)
    b = find_rule("dataloader-stall").positive()
    b.facts = {"environment": {"machine": {"cpu": {"logical": 8, "usable": 8, "cgroup_limit": None}}},
               "capture": {"loader": {"num_workers": 0, "build_ms_per_batch": 20.0, "between_batches_ms": 4.0,
                          "fetch_ms_per_sample": 0.6, "collate_ms_per_batch": 0.4, "wait_ms_per_batch": 20.0,
                          "functions": [{"function": "__getitem__", "file": "data/ds.py", "line": 30, "share_pct": 98.0,
                                         "ms_per_batch": 19.6},
                                        {"function": "decode_image", "file": "data/ds.py", "line": 41,
                                         "share_pct": 71.0, "ms_per_batch": 14.2}]}}}
    reports = analyze_paths([str(b.write_run_folder(tmp_path / "run"))])

    async def go():
        app = make_app(reports)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            screen = app.screen
            i = next(i for i, f in enumerate(app.data.findings) if f.topic == "dataloader-stall")
            while screen.selected != i:
                await pilot.press("down")
                await pilot.pause()
            md = screen.query_one("#finding-detail").source.replace("\\", "")
            assert "decode_image" in md and "data/ds.py:41" in md  # the hot function, in the evidence table
            assert "build per batch: 20 ms" in md
            # 20 ms per batch, one used every 12 ms (the median step less its wait), 7 free cores: 2 keep up
            assert "suggested num workers: 2" in md

    run(go())

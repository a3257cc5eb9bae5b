"""SVG snapshots of every screen of `gpuadvise view` (pytest-textual-snapshot).

The data is one synthetic trace built here (a DataLoader stall, pageable copies, a host sync and
memory events), analysed by a fixed set of rules, opened from a fixed relative file name, so nothing
on screen depends on the machine, the clock or rules added later. Input cursors do not blink
(`cursor_blink=False`). Update after an intended change with `pytest tests/test_tui_snapshots.py
--snapshot-update` and review the SVGs.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("textual")
pytest.importorskip("pytest_textual_snapshot")

from _cli_support import tui_trace  # noqa: E402
from gpuadvise.analyzer.run.engine import analyze_paths  # noqa: E402
from gpuadvise.rules import find_rule  # noqa: E402
from gpuadvise.tui.app import GpuadviseApp  # noqa: E402

SIZE = (120, 36)
RULES = ("GA102", "GA103", "GA104")  # the findings on screen come from these rules only


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    folder = tmp_path_factory.mktemp("snap")
    tui_trace().write(folder / "train.json.gz")
    cwd = os.getcwd()
    os.chdir(folder)  # a relative path: the name on screen is the same on every machine
    try:
        return analyze_paths(["train.json.gz"], rules=[find_rule(code) for code in RULES])
    finally:
        os.chdir(cwd)


def app_for(reports, first: str = "findings") -> GpuadviseApp:
    return GpuadviseApp(reports=reports, cursor_blink=False, first_screen=first)


async def ready(pilot) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def test_findings_screen(snap_compare, reports):
    assert snap_compare(app_for(reports), terminal_size=SIZE, run_before=ready)


def test_overview_screen(snap_compare, reports):
    assert snap_compare(app_for(reports, "overview"), terminal_size=SIZE, run_before=ready)


def test_timeline_after_jump_from_finding(snap_compare, reports):
    async def jump(pilot):
        await ready(pilot)
        await pilot.press("enter")
        await ready(pilot)

    assert snap_compare(app_for(reports), terminal_size=SIZE, run_before=jump)


def test_timeline_zoomed_on_gpu_lane(snap_compare, reports):
    async def zoom(pilot):
        await ready(pilot)
        view = pilot.app.screen.view
        view.select_lane_kind("gpu")
        await pilot.press("full_stop", "plus", "plus", "plus", "plus")

    assert snap_compare(app_for(reports, "timeline"), terminal_size=SIZE, run_before=zoom)


def test_kernels_screen_filtered(snap_compare, reports):
    async def sort_filter(pilot):
        await ready(pilot)
        await pilot.press("slash", *"sgemm", "enter")

    assert snap_compare(app_for(reports, "kernels"), terminal_size=SIZE, run_before=sort_filter)


def test_copies_screen(snap_compare, reports):
    assert snap_compare(app_for(reports, "copies"), terminal_size=SIZE, run_before=ready)


def test_memory_screen(snap_compare, reports):
    assert snap_compare(app_for(reports, "memory"), terminal_size=SIZE, run_before=ready)


def test_help_screen(snap_compare, reports):
    async def help_(pilot):
        await ready(pilot)
        await pilot.press("question_mark")

    assert snap_compare(app_for(reports, "timeline"), terminal_size=SIZE, run_before=help_)


def test_error_screen(snap_compare, tmp_path, monkeypatch):
    (tmp_path / "notes.json").write_text('{"not": "a trace"}')
    monkeypatch.chdir(tmp_path)
    app = GpuadviseApp(paths=["notes.json"], cursor_blink=False)
    assert snap_compare(app, terminal_size=(100, 24), run_before=ready)

"""`gpuadvise view BEFORE AFTER --compare`, driven with Textual's Pilot on builder run folders: the
compare screen shows what `gpuadvise compare` reports, loads in a worker from paths, exports the
markdown with its charts, and bad input exits 2. No torch, no GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from _compare_support import run_folder  # noqa: E402
from _tui_support import press, run, settle, shown  # noqa: E402
from gpuadvise.analyzer.compare import diff as cm  # noqa: E402
from gpuadvise.analyzer.compare.load import load_side  # noqa: E402
from gpuadvise.analyzer.report import compare as rc  # noqa: E402
from gpuadvise.tui.compare_app import CompareApp, CompareHelp  # noqa: E402
from gpuadvise.tui.screens.compare import CompareScreen  # noqa: E402
from gpuadvise.tui.screens.dialogs import ExportScreen  # noqa: E402
from gpuadvise.tui.screens.loading import LoadingScreen  # noqa: E402

SIZE = (120, 40)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tui-runs")
    return {v: run_folder(root, v) for v in ("stall", "fixed")}


@pytest.fixture(scope="module")
def result(runs):
    return cm.compare(load_side(str(runs["stall"])), load_side(str(runs["fixed"])))


def test_compare_screen_shows_the_comparison(result):
    async def go():
        app = CompareApp(result=result, cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            screen = app.screen
            assert isinstance(screen, CompareScreen)
            verdict = shown(screen, "#verdict")
            assert rc.measured(result["step_time"]) in verdict.lower()
            steps = shown(screen, "#steps")
            for what, before, after, _ in rc.headline(result):
                line = next(ln for ln in steps.splitlines() if ln.startswith(what))
                assert before in line and after in line
            findings = shown(screen, "#findings")
            for e in result["findings"]["resolved"]:
                assert any(ln.split()[:2] == ["resolved", e["rule"]] for ln in findings.splitlines())
            for e in result["findings"]["still_there"]:
                assert any(ln.split()[:3] == ["still", "there", e["rule"]] for ln in findings.splitlines())
            predictions = shown(screen, "#predictions")
            for p in result["predictions"]:
                assert rc.prediction_sentence(p, result["step_time"]) in predictions
            env = shown(screen, "#environment")
            assert "dataloader[0].num_workers" in env
            breakdown = shown(screen, "#breakdown")
            assert f"{rc.ms(result['before']['median_step_ms'])} ms" in breakdown
            await pilot.press("q")
        assert app.return_code == 0

    run(go())


def test_loads_both_runs_in_a_worker_from_paths(runs, result):
    async def go():
        app = CompareApp(paths=[str(runs["stall"]), str(runs["fixed"])], cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert isinstance(app.screen, CompareScreen)
            assert app.result["step_time"] == result["step_time"]
            assert app.result["findings"] == result["findings"]

    run(go())


def test_export_writes_markdown_and_charts(result, tmp_path):
    async def go():
        app = CompareApp(result=result, export_dir=tmp_path, cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert isinstance(await press(pilot, "e"), ExportScreen)
            assert isinstance(await press(pilot, "enter"), CompareScreen)
        return app.last_export

    path = run(go())
    assert path == tmp_path / "gpuadvise-compare.md"
    assert path.read_text() == rc.render_markdown(result, {c.section: [f"![{c.alt}](gpuadvise-compare-{c.name}.svg)", ""]
                                                           for c in rc.charts(result)})
    assert sorted(p.name for p in tmp_path.glob("*.svg")) == sorted(f"gpuadvise-compare-{c.name}.svg" for c in rc.charts(result))


def test_help_lists_the_compare_keys(result):
    async def go():
        app = CompareApp(result=result, cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert isinstance(await press(pilot, "question_mark"), CompareHelp)
            assert isinstance(await press(pilot, "escape"), CompareScreen)

    run(go())


def test_a_run_folder_without_a_trace_fails_with_exit_2(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "run.json").write_text("{}")

    async def go():
        app = CompareApp(paths=[str(runs["stall"]), str(empty)], cursor_blink=False)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            assert isinstance(app.screen, LoadingScreen) and app.screen.error
            await pilot.press("q")
        return app

    app = run(go())
    assert app.return_code == 2 and "run folder has no trace" in app.failure


@pytest.mark.parametrize("paths", [1, 3])
def test_view_compare_needs_two_paths(capsys, runs, paths):
    from gpuadvise.tui.cli import main

    rc_ = main([str(runs["stall"])] * paths + ["--compare"])
    err = capsys.readouterr().err
    assert rc_ == 2
    assert "two runs" in err and len(err.strip().splitlines()) == 1


def test_compare_screen_snapshot(snap_compare, tmp_path_factory, monkeypatch):
    pytest.importorskip("pytest_textual_snapshot")
    root = tmp_path_factory.mktemp("snap-runs")
    run_folder(root, "stall", name="before")
    run_folder(root, "fixed", name="after")
    monkeypatch.chdir(root)  # relative labels: the screen is the same on every machine
    result = cm.compare(load_side("before"), load_side("after"))
    assert snap_compare(CompareApp(result=result, cursor_blink=False), terminal_size=SIZE, run_before=settle)

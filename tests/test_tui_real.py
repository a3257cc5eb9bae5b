"""`gpuadvise view` on a real trace of the shared corpus: the kineto ResNet-50 `num_workers=0` run
(V100). Loaded through the worker exactly as the CLI does; every screen is driven. Skipped without
the corpus (`../shared/traces`, or $GPUADVISE_TRACES)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

pytest.importorskip("textual")

from _tui_support import settle  # noqa: E402
from gpuadvise.tui.app import GpuadviseApp  # noqa: E402
from gpuadvise.tui.screens.findings import FindingsScreen  # noqa: E402
from gpuadvise.tui.screens.memory import MemoryScreen  # noqa: E402
from gpuadvise.tui.screens.overview import OverviewScreen  # noqa: E402
from gpuadvise.tui.screens.tables import CopiesScreen, KernelsScreen  # noqa: E402
from gpuadvise.tui.screens.timeline import TimelineScreen  # noqa: E402
from gpuadvise.tui.widgets.table_view import TableView  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
NW0 = TRACES / "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"

if not NW0.is_file():
    pytest.skip(f"real trace not found at {NW0} (set GPUADVISE_TRACES to the corpus folder)", allow_module_level=True)
pytestmark = pytest.mark.slow  # a real ResNet-50 trace on every screen


def test_resnet50_num_workers_0_every_screen(tmp_path):
    async def go():
        app = GpuadviseApp(paths=[str(NW0)], export_dir=tmp_path, cursor_blink=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            # Findings first, the data-loader stall on top, with its fix and docs beside it
            assert isinstance(app.screen, FindingsScreen)
            top = app.data.findings[0]
            assert top.rule == "GA102" and top.topic == "dataloader-stall"
            detail = app.screen.query_one("#finding-detail").source
            assert "num_workers" in detail and "### What it detects" in detail

            # ... and enter shows the worst DataLoader wait in the timeline
            await pilot.press("enter")
            await settle(pilot)
            assert isinstance(app.screen, TimelineScreen)
            view = app.screen.view
            lane = view.index.lanes[view.lane]
            assert lane.kind == "dataloader"
            start, end = top.evidence.time_ranges_ms[0]
            assert view.cursor_t == pytest.approx(start * 1e3)
            details = str(app.screen.query_one("#timeline-details").render())
            assert "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" in details
            await pilot.press("n", "plus", "down", "full_stop", "right_square_bracket", "0")
            assert view.step_pos >= 1

            await pilot.press("1")
            await pilot.pause()
            assert isinstance(app.screen, OverviewScreen)
            facts = str(app.screen.query_one("#facts").render())
            assert "Tesla V100-DGXS-32GB" in facts and "6 (#5–#10)" in facts
            assert len(app.screen.query_one("#steps", TableView).view) == 6

            await pilot.press("4")
            await pilot.pause()
            assert isinstance(app.screen, KernelsScreen)
            kernels = app.screen.query_one("#kernels", TableView)
            assert len(kernels.view) == len(app.data.report.metrics.kernels)
            await pilot.press("slash", *"cudnn", "enter")
            await pilot.pause()
            names = kernels.frame["name"].iloc[kernels.view]
            assert len(names) and all("cudnn" in n.lower() for n in names)

            await pilot.press("5")
            await pilot.pause()
            assert isinstance(app.screen, CopiesScreen)
            copies = app.screen.query_one("#copies", TableView).frame
            assert "Pageable → Device" in set(copies["route"])
            syncs = app.screen.query_one("#syncs", TableView).frame
            assert "resnet50_profiler_api.py(44): <module>" in set(syncs["source"])

            await pilot.press("6")
            await pilot.pause()
            assert isinstance(app.screen, MemoryScreen)
            stats = str(app.screen.query_one("#memory-stats").render())
            assert "GPU 0" in stats and "no totals" in stats  # this 2021 trace records sizes only

            await pilot.press("e", "enter")
            await pilot.pause()
            report = (tmp_path / "gpuadvise-report.md").read_text()
            assert "Training waits on the DataLoader" in report

    asyncio.run(go())

"""Helpers shared by the TUI tests (test_tui_app.py, test_tui_compare.py, test_tui_real.py): Pilot tests are
coroutines run each in its own event loop (no pytest-asyncio needed), settled once the app's workers are
done. Plain imports, not a conftest."""

from __future__ import annotations

import asyncio
import io


def run(coro):
    """Run a Pilot test's coroutine in its own event loop."""
    return asyncio.run(coro)


async def settle(pilot) -> None:
    """Let the app finish what a key press or a load started: its workers, then the screens they update."""
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


async def press(pilot, *keys: str):
    """Press `keys`, let the app draw, and return the screen that is up then."""
    await pilot.press(*keys)
    await pilot.pause()
    return pilot.app.screen


def shown(screen, selector: str) -> str:
    """The plain text a Static shows (a rich Text, Table or Group), as it renders 200 columns wide."""
    from rich.console import Console

    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(screen.query_one(selector).content)
    return console.file.getvalue()

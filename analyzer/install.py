"""The pip command that adds an optional extra (`tui`, `dask`, `profile`) the way gpuadvise itself
was installed: code running from a checkout (`pip install -e .`, or the tree on sys.path) gets
`pip install -e '<checkout>[tui]'` (the package is not on PyPI); an installed wheel or sdist gets its
distribution name.
"""

from __future__ import annotations

import shlex
from importlib import metadata
from pathlib import Path

DIST = "gpuadvise"


def _checkout() -> Path | None:
    # this file is <checkout>/analyzer/install.py in a checkout (package-dir mapping), and
    # site-packages/gpuadvise/analyzer/install.py when installed: only a checkout has pyproject.toml
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def _shown(folder: Path) -> str:
    """The checkout as the user would type it: `.` from inside it, else its path."""
    try:
        if folder == Path.cwd().resolve():
            return "."
    except OSError:
        pass
    return str(folder)


def install_command(extra: str) -> str:
    root = _checkout()
    if root is not None:
        return f"pip install -e {shlex.quote(_shown(root) + f'[{extra}]')}"
    try:
        name = metadata.distribution(DIST).metadata.get("Name") or DIST
    except metadata.PackageNotFoundError:
        name = DIST
    return f"pip install {shlex.quote(f'{name}[{extra}]')}"

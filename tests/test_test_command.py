"""The README's test command is the one CI runs (`.ci/run`), and both run the suite in parallel."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pytest_args(line: str) -> list[str]:
    words = shlex.split(line.split("&&")[-1].split("#")[0])
    return words[words.index("pytest") + 1:]


def test_ci_runs_the_readme_test_command():
    readme = REPO.joinpath("README.md").read_text(encoding="utf-8")
    quick_start = readme[readme.index("## Quick start"):readme.index("\n## ", readme.index("## Quick start") + 1)]
    (readme_line,) = [line for line in quick_start.splitlines() if "-m pytest" in line]
    (ci_line,) = [line for line in REPO.joinpath(".ci", "run").read_text().splitlines()
                  if re.match(r"\s*python3? -m pytest", line)]
    assert _pytest_args(readme_line) == _pytest_args(ci_line)
    args = _pytest_args(ci_line)
    assert "-n" in args and "--dist" in args and args[args.index("--dist") + 1] == "loadgroup"
    assert args[-1] == "tests" and "-m" not in args  # the whole suite, nothing deselected

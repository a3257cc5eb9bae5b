"""Golden-file tests: the markdown and JSON reports of three deterministic builder traces, word for word.

A change to the wording, layout, numbers or JSON shape of a report shows up here as a diff. When the
change is intended, rewrite the golden files and review the diff before committing it:

    GPUADVISE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py

The traces are written under tmp_path with fixed names; the tmp folder (raw, and as the markdown
renderer escapes it) becomes `<TMP>` and the package version `<VERSION>`, so the files do not change
between machines, runs or releases.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import pytest

from _cli_support import call_main, write_rank_folder, write_rule_positive
from gpuadvise import __version__
from gpuadvise.analyzer.report.safe import md

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("GPUADVISE_UPDATE_GOLDEN") == "1"
PLACEHOLDER = "<TMP>"


def _dataloader_stall(tmp: Path) -> Path:
    return write_rule_positive("dataloader-stall", tmp / "dataloader_stall.json")


def _launch_bound(tmp: Path) -> Path:
    return write_rule_positive("launch-bound", tmp / "launch_bound.json.gz")


def _two_ranks(tmp: Path) -> Path:
    # rank 1 is the straggler: a 4 ms single-process DataLoader wait at the start of every step
    return write_rank_folder(tmp / "job", names=("rank0.trace.json", "rank1.trace.json"), stall_us=(0.0, 4_000.0))


CASES = {"dataloader_stall": _dataloader_stall, "launch_bound": _launch_bound, "two_ranks": _two_ranks}
SUFFIX = {"md": ".md", "json": ".json"}


def normalise(text: str, tmp: Path, fmt: str) -> str:
    for form in {str(tmp), md(str(tmp))}:
        text = text.replace(form, PLACEHOLDER)
    if fmt == "json":
        assert json.loads(text)["version"] == __version__
        version = f'"version": {json.dumps(__version__)},'
        assert version in text
        text = text.replace(version, '"version": "<VERSION>",', 1)
    return text


@pytest.mark.parametrize("fmt", ["md", "json"])
@pytest.mark.parametrize("case", list(CASES))
def test_golden(capsys, tmp_path, case, fmt):
    path = CASES[case](tmp_path)
    rc, out, err = call_main(capsys, "analyze", path, "--format", fmt)
    assert rc == 0, err
    got = normalise(out, tmp_path, fmt)
    assert tmp_path.name not in got, "the tmp path leaked into the report past the placeholder"

    golden = GOLDEN / f"{case}{SUFFIX[fmt]}"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(got, encoding="utf-8")
        return
    if not golden.is_file():
        pytest.fail(f"no golden file {golden.name}; create it with GPUADVISE_UPDATE_GOLDEN=1 and review it")
    want = golden.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), got.splitlines(keepends=True),
                                            fromfile=f"golden/{golden.name}", tofile="now", n=2))
        lines = diff.splitlines()
        if len(lines) > 200:
            diff = "\n".join(lines[:200]) + f"\n… {len(lines) - 200} more diff lines"
        pytest.fail(f"{case} {fmt} report differs from golden/{golden.name} "
                    f"(intended? rerun with GPUADVISE_UPDATE_GOLDEN=1 and review the diff):\n{diff}", pytrace=False)


def test_golden_files_have_cases():
    """No stale golden file lingers after a case is renamed or dropped."""
    if not GOLDEN.is_dir():
        pytest.skip("no golden folder yet")
    expected = {f"{c}{s}" for c in CASES for s in SUFFIX.values()}
    stale = sorted(p.name for p in GOLDEN.iterdir() if p.name not in expected)
    assert not stale, f"golden files without a case: {stale}"

#!/usr/bin/env python3
"""The JSON report of every open-corpus trace, written to a folder, to check a reader change by hand:

    python bench/reader_reports.py OUT_DIR            # `gpuadvise analyze F --format json --no-cache` per file
    python bench/reader_reports.py OUT_DIR --fixtures # … and per rule fixture (each rule's positive and negative)
    python bench/reader_reports.py --compare A B      # byte-identical? lists the files that differ

The reports run in one process (the CLI's own `main`), so the whole corpus takes about a minute. The
reports are not kept as goldens in the suite (rules change every day); the reader's contract in the suite
is the model digest (tests/_model_digest.py, tests/test_reader_golden.py).
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def write_reports(out: Path, fixtures: bool = False) -> None:
    from _corpus_support import TRACES, corpus_files

    out.mkdir(parents=True, exist_ok=True)
    for rel in corpus_files():
        if rel.endswith((".pickle", ".pkl")):
            continue
        _report(TRACES / rel, out / (rel.replace("/", "__") + ".report.json"))
    print(f"wrote reports of the corpus to {out}")
    if fixtures:
        from gpuadvise.rules import all_rules

        # the inputs at the same path on every run: a report names its input
        tmp = Path(tempfile.gettempdir()) / "gpuadvise-rule-fixtures"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            for rule in all_rules():
                for side in ("positive", "negative"):
                    fx = getattr(rule, side)()
                    name = f"fixture__{rule.name}.{side}"
                    if getattr(fx, "facts", None):  # its run.json facts travel in a run folder
                        path = fx.write_run_folder(tmp / name)
                    else:
                        path = fx.write(tmp / (name + getattr(fx, "suffix", ".json")))
                    _report(path, out / (name + ".report.json"))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"wrote reports of the rule fixtures to {out}")


def _report(path: Path, target: Path) -> None:
    from gpuadvise.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["analyze", str(path), "--format", "json", "--no-cache", "-o", str(target)])
    (target.parent / (target.name + ".rc")).write_text(f"{rc}\n{err.getvalue()}")


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    differ = [n for n in names if not (a / n).exists() or not (b / n).exists()
              or (a / n).read_bytes() != (b / n).read_bytes()]
    print(f"{len(names)} files, {len(differ)} differ" + "".join(f"\n  {n}" for n in differ))
    return 1 if differ else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    write_reports(Path(sys.argv[1]), fixtures="--fixtures" in sys.argv[2:])

#!/usr/bin/env python3
"""The JSON report of every open-corpus trace, written to a folder, to check a reader change by hand:

    python bench/reader_reports.py OUT_DIR            # `gpuadvise analyze F --format json --no-cache` per file
    python bench/reader_reports.py --compare A B      # byte-identical? lists the files that differ

The reports run in one process (the CLI's own `main`), so the whole corpus takes about a minute. The
reports are not kept as goldens in the suite (rules change every day); the reader's contract in the suite
is the model digest (tests/_model_digest.py, tests/test_reader_golden.py).
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def write_reports(out: Path) -> None:
    from _corpus_support import TRACES, corpus_files

    from gpuadvise.cli import main

    out.mkdir(parents=True, exist_ok=True)
    for rel in corpus_files():
        if rel.endswith((".pickle", ".pkl")):
            continue
        target = out / (rel.replace("/", "__") + ".report.json")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["analyze", str(TRACES / rel), "--format", "json", "--no-cache", "-o", str(target)])
        (out / (target.name + ".rc")).write_text(f"{rc}\n{err.getvalue()}")
    print(f"wrote reports of the corpus to {out}")


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
    write_reports(Path(sys.argv[1]))

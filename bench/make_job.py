#!/usr/bin/env python3
"""Make an N-rank job folder from one real rank trace, for benchmarks:

    python bench/make_job.py [SRC.json[.gz]] OUT_DIR --ranks 16

Rank r is the source trace with `distributedInfo` saying rank r of N (world_size N) and every `ts` moved
by r µs (so the ranks are not byte-identical); nothing else changes, so each rank is as big as the source
once written compactly. The default source is the V100 rank trace of HTA's trace_diff test
(`hta/tests/data/trace_diff/test/test.json.gz`: rank 1 of 2, NCCL, 105 k events, 32.8 MB of JSON).
Files are written as `rank<r>.trace.json` (plain JSON: the bench times reading, not inflating).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grow_trace import REPO_ROOT, load_trace  # noqa: E402  (sibling script)

DEFAULT_SRC = REPO_ROOT.parent / "shared/traces/hta/tests/data/trace_diff/test/test.json.gz"


def make_job(src: Path, out: Path, ranks: int) -> list[Path]:
    doc = load_trace(src)
    info = dict(doc.get("distributedInfo") or {"backend": "nccl"})
    out.mkdir(parents=True, exist_ok=True)
    events = doc.pop("traceEvents")
    written = []
    for r in range(ranks):
        info.update(rank=r, world_size=ranks)
        doc["distributedInfo"] = info
        moved = [dict(e, ts=e["ts"] + r) if isinstance(e.get("ts"), (int, float)) else e for e in events]
        path = out / f"rank{r}.trace.json"
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({**doc, "traceEvents": moved}, f, separators=(",", ":"))
        tmp.replace(path)
        written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", nargs="?", type=Path, default=DEFAULT_SRC)
    p.add_argument("out", type=Path)
    p.add_argument("--ranks", type=int, default=16)
    a = p.parse_args()
    files = make_job(a.src, a.out, a.ranks)
    total = sum(f.stat().st_size for f in files)
    print(f"wrote {len(files)} ranks to {a.out}: {total / 1e6:.0f} MB")


if __name__ == "__main__":
    main()

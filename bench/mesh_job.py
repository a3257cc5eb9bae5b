#!/usr/bin/env python3
"""The 2 × 2 mesh job (FSDP2 over "dp" × tensor parallel over "tp", gloo, 4 ranks on this CPU), recorded the
two ways a user does: under `gpuadvise profile`, and with plain torch.profiler in the script (one trace per
rank, record_shapes). For each: the head of `gpuadvise analyze` (the job's groups, phases, exposed times
and the advice), and per rank and group the exposed time gpuadvise reports beside a hand count over the
raw trace JSON (tests/_mesh_handcount.py).

    python bench/mesh_job.py [--steps 6] [-o OUT]      # OUT keeps both runs (default: a temporary folder)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]
PROBE = REPO / "tests" / "probes" / "mesh_job.py"


def torchrun(args: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    if proc.returncode:
        sys.exit(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def show(label: str, folder: Path, traces: list[Path]) -> None:
    from _mesh_handcount import exposed_ms
    from gpuadvise.analyzer.model.report import all_findings
    from gpuadvise.analyzer.report import render
    from gpuadvise.analyzer.run.engine import analyze_paths

    reports = analyze_paths([str(folder)], jobs=1)
    text = render(reports, "text")
    head = text[text.index("job:"):]
    print(f"== {label}: gpuadvise analyze {folder}\n")
    print(head[:head.index("\n\n")] if "\n\n" in head else head)
    for f in all_findings(reports):
        if f.rule in ("GA137", "GA131"):
            print(f"\n{f.rule} [{f.severity}] ~{f.impact.est_step_saving_pct:.1f} %: "
                  f"{f.message}\n→ {f.advice}")
    hand = {}
    for path in traces:
        rank = int(next(p for p in path.name.split(".") if p.startswith("rank"))[4:])
        hand[rank] = exposed_ms(path)
    print("\nexposed ms per step (median over steps): gpuadvise | hand count | difference")
    for g in reports.job.view.groups:
        for row in g["per_rank"]:
            counted = hand[row["rank"]][g["dim"] or ("dp" if g["scheme"] == "fsdp" else "tp")]
            diff = 100.0 * (row["exposed_ms"] - counted) / counted if counted else 0.0
            print(f"  {g['shown']:<28} rank {row['rank']}: {row['exposed_ms']:8.2f} | {counted:8.2f} | {diff:+.1f} %")
    print()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("-o", "--out", default="")
    a = p.parse_args()
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mesh-job-"))
    out.mkdir(parents=True, exist_ok=True)
    profiled = out / "profiled"
    torchrun(["-m", "gpuadvise", "profile", "--wait", "1", "--warmup", "1", "--active", str(a.steps - 3), "-o",
              str(profiled), str(PROBE), "--steps", str(a.steps)], out)
    show("under gpuadvise profile", profiled, sorted(profiled.glob("trace.rank*.pt.trace.json.gz")))
    plain = out / "torch-profiler"
    torchrun([str(PROBE), "--steps", str(a.steps), "--trace-dir", str(plain)], out)
    show("plain torch.profiler", plain, sorted(plain.glob("rank*.json")))
    print(f"runs kept in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

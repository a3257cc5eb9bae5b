#!/usr/bin/env python3
"""What each profiler option costs the recorded steps: traced step time / unprofiled step time.

    python bench/bench_capture.py [--rounds 12] [--seg 6] [--examples a.py,b.py] [--threads 1] [--e2e 3]

Part 1, side by side in one process per example: the example runs with a step hook (the optimizer
post-hook `gpuadvise profile` uses) that switches torch.profiler on and off every `--seg` steps,
cycling through the modes for `--rounds` rounds:
- plain: no profiler;
- CPU activity only (plus CUDA activity on a GPU): the leanest recording;
- + shapes / + stacks / + profile_memory: one option on top;
- old defaults: what `gpuadvise profile` recorded before the lean defaults (shapes on; on a GPU also CUDA
  memory history, which ran through the window);
- new defaults: the window `gpuadvise profile` records now (no shapes: the matmul shapes come from
  a probe step outside the window; CUDA memory history runs after it);
- new defaults + loader sampling: the same with the DataLoader sampler on (harness/loaderprobe.py:
  pyinstrument inside each batch build, the waits timed), as `gpuadvise profile` records the window
  with DataLoader sampling. Its cost is on the training thread only with `num_workers=0` (train_stall.py);
  with workers it is paid in the workers.
Each step's wall time and thread CPU time are taken at the hook, outside the profiler's start/stop;
the first step of every segment, and a step without profiler between segments, are dropped (for
every mode alike). On a GPU this times the CPU side of each step (no synchronize is added); part 2's
run.json times the GPU side with CUDA events. A mode's ratio is its median step over the median
plain step: plain segments are interleaved with the others, so a machine that gets
busier or quieter during the run moves both. The thread CPU time ratio is printed too: it ignores
the time the process waits for a core on a shared machine.

Part 2 (`--e2e N`): the whole `gpuadvise profile` command, old and new defaults, N runs each: the
ratio it writes into run.json (`steps.overhead_x`, recorded steps over the same run's unprofiled
ones) and the wall time of the run.

Part 3 (`--compiled N`): the torch.compile recorder (gpuadvise/harness/facts/compiled.py) on its own: an
uncompiled loop (train_healthy.py) and a compiled one (train_compiled.py, `--backend`), each run N
times in fresh processes with the recorder installed and without, alternating: the first step
(compilation) and the median of steps 10+ (steady state), in thread CPU time at the optimizer hook.

Part 4 (`--long N`): what every step pays after the window, where a run spends almost all its steps:
the step timing as it was before the whole-run record ("timing only"), the timing plus the step record
(harness/steps/record.py: the sidecar appended every second, a memory sample every 5 steps; what every `gpuadvise
profile` run does now), and that plus the long-run triggers (`--on-signal --when-slower --every`: the
slowdown watch, the request file stat'ed every 4 steps). Side by side in one process per example, the
modes cycling every `--seg` steps for N rounds, thread CPU time per step at the optimizer hook (the
boundary's own work included), and the same boundary work alone in a tight loop (µs per step).

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
DEFAULT_EXAMPLES = ["train_small_ops.py", "train_healthy.py", "train_stall.py"]
MODES = ["plain", "CPU activity only", "+ shapes", "+ stacks", "+ profile_memory", "old defaults", "new defaults",
         "new defaults + loader sampling"]


# -- part 1: the child process that runs one example with the modes interleaved ------------------------
def child(example: str, rounds: int, seg: int) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    options = {"CPU activity only": {}, "+ shapes": {"record_shapes": True}, "+ stacks": {"with_stack": True},
               "+ profile_memory": {"profile_memory": True}, "old defaults": {"record_shapes": True},
               "new defaults": {}, "new defaults + loader sampling": {}}
    sys.path.insert(0, str(REPO))
    from gpuadvise.harness import loaderprobe

    probe_dir = tempfile.mkdtemp(prefix="bench-loader-")
    probe = loaderprobe.Probe(probe_dir)
    probe.install(torch)  # off until a segment switches it on: the other modes pay one flag check per batch
    try:  # what gpuadvise profile passes on torch >= 2.10: no Python event objects built at stop
        from torch.profiler import _ExperimentalConfig
        trace_only = {"experimental_config": _ExperimentalConfig(trace_only=True)}
    except Exception:
        trace_only = {}
    plan = [m for _ in range(rounds) for m in MODES]
    # Segment k: a gap step (no profiler), a first step (dropped), then `seg` timed steps. The gap is
    # there because torch crashes when one profiler stops and another starts inside one open
    # record_function, and this hook runs inside `Optimizer.step#…`.
    state = {"seg": -1, "i": 0, "prof": None, "mem": False, "t": None, "rows": []}

    def stop():
        if state["prof"] is not None:
            state["prof"].stop()
            state["prof"] = None
        probe.window(False)
        if state["mem"]:
            torch.cuda.memory._record_memory_history(enabled=None)
            state["mem"] = False

    def start(mode):
        if mode in options:
            kw = dict(options[mode])
            if mode.startswith("new defaults"):
                kw.update(trace_only)
            state["prof"] = profile(activities=activities, **kw)
            state["prof"].start()
        if mode == "new defaults + loader sampling":
            probe.window(True)
        if mode == "old defaults" and cuda:
            torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
            state["mem"] = True

    def hook(opt, args, kwargs):
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        k, i = state["seg"], state["i"]
        if 0 <= k < len(plan) and i >= 2:  # i 0: the gap, i 1: the segment's first step
            state["rows"].append((plan[k], (wall - state["t"][0]) / 1e6, (cpu - state["t"][1]) / 1e6))
        if k < 0 or i == seg + 1:  # the segment is over: stop, and leave one step without a profiler
            stop()
            state["seg"], state["i"] = k + 1, 0
        else:
            state["i"] = i + 1
            if state["i"] == 1 and state["seg"] < len(plan):
                start(plan[state["seg"]])
        state["t"] = (time.perf_counter_ns(), time.thread_time_ns())

    register_optimizer_step_post_hook(hook)
    steps = len(plan) * (seg + 2) + 3
    sys.argv = [example, "--steps", str(steps)]
    with open(os.devnull, "w") as null:
        old = sys.stdout
        sys.stdout = null
        try:
            runpy.run_path(example, run_name="__main__")
        finally:
            sys.stdout = old
    stop()
    print(json.dumps({"rows": state["rows"], "torch": torch.__version__,
                      "device": torch.cuda.get_device_name() if cuda else "CPU"}))


def part1(args, examples) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    print(f"## Side by side in one process ({args.rounds} rounds × {len(MODES)} modes × {args.seg} steps, "
          f"{args.threads} thread(s))\n")
    tables = []
    for e in examples:
        proc = subprocess.run([sys.executable, __file__, "--child", str(EXAMPLES / e), "--rounds", str(args.rounds),
                               "--seg", str(args.seg)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{e} failed:\n{proc.stderr}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        by = {m: ([w for mm, w, _ in res["rows"] if mm == m], [c for mm, _, c in res["rows"] if mm == m]) for m in MODES}
        base_w, base_c = statistics.median(by["plain"][0]), statistics.median(by["plain"][1])
        tables.append((e, base_w, base_c, {m: (statistics.median(w) / base_w, statistics.median(c) / base_c,
                                              statistics.median(w), len(w)) for m, (w, c) in by.items()}))
        print(f"{e}: {len(res['rows'])} steps timed, torch {res['torch']}, {res['device']}", file=sys.stderr)
    cols = MODES[1:]
    print("| loop | plain step (ms) | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for e, base_w, _, r in tables:
        print(f"| `{Path(e).stem}` | {base_w:.2f} | " + " | ".join(f"{r[m][2]:.2f} ({r[m][0]:.2f}×)" for m in cols) + " |")
    print("\nCell: median recorded step in ms (ratio to the median plain step), wall clock.\n")
    print("| loop | plain step, thread CPU (ms) | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for e, _, base_c, r in tables:
        print(f"| `{Path(e).stem}` | {base_c:.2f} | " + " | ".join(f"{r[m][1]:.2f}×" for m in cols) + " |")
    print("\nCell: ratio of the median thread CPU time per step to plain's (insensitive to waiting for a core).\n")


# -- part 2: the whole command -------------------------------------------------------------------------
E2E = {"old defaults": ["--wait", "1", "--record-shapes", "--no-shapes-probe"], "new defaults": []}


def part2(args, examples) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    results = {(e, m): [] for e in examples for m in E2E}
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as tmp:
        for r in range(args.e2e):
            for e in examples:
                for m, opts in E2E.items():
                    out = Path(tmp) / f"{Path(e).stem}-{m.replace(' ', '_')}-{r}"
                    cmd = [sys.executable, "-m", "gpuadvise", "profile", "-q", "-o", str(out), *opts,
                           str(EXAMPLES / e), "--steps", "60"]
                    t0 = time.perf_counter()
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
                    wall = time.perf_counter() - t0
                    if proc.returncode != 0:
                        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
                    steps = json.loads((out / "run.json").read_text())["steps"]
                    results[(e, m)].append((steps["overhead_x"], steps["unprofiled_median_ms"],
                                            steps["profiled_median_ms"], wall))
    print(f"## `gpuadvise profile` itself (median of {args.e2e} runs, 60 steps each)\n")
    print("| loop | " + " | ".join(f"{m}: unprofiled → recorded (run.json overhead_x) | {m}: run (s)" for m in E2E) + " |")
    print("|---|" + "---:|---:|" * len(E2E))
    for e in examples:
        cells = []
        for m in E2E:
            rs = results[(e, m)]
            x, u, p, w = (statistics.median(v[i] for v in rs) for i in range(4))
            cells += [f"{u:.2f} → {p:.2f} ms ({x:.2f}×)", f"{w:.1f}"]
        print(f"| `{Path(e).stem}` | " + " | ".join(cells) + " |")
    print()


# -- part 3: the torch.compile recorder, with and without -------------------------------------------------
COMPILED_EXAMPLES = ["train_healthy.py", "train_compiled.py"]


def compile_child(example: str, mode: str, backend: str) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    # thread CPU time: on a shared machine wall time mostly measures the wait for a core
    stamps = [time.thread_time()]
    register_optimizer_step_post_hook(lambda *a: stamps.append(time.thread_time()))
    from gpuadvise.harness.facts import compiled  # imported in both modes: only the install differs

    if mode == "recorder":
        compiled.install(torch, lambda: (len(stamps) - 1, "wait"))
    sys.argv = [example, "--steps", "60"] + (["--backend", backend] if "compiled" in example else [])
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        runpy.run_path(str(EXAMPLES / example), run_name="__main__")
    ms = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]
    print(json.dumps({"first_ms": ms[0], "steady_ms": statistics.median(ms[10:])}))


def part3(args) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    modes = ("without", "recorder")
    results = {(e, m): [] for e in COMPILED_EXAMPLES for m in modes}
    for r in range(args.compiled):
        for e in COMPILED_EXAMPLES:
            for m in (modes if r % 2 == 0 else modes[::-1]):  # alternate which mode runs first
                proc = subprocess.run([sys.executable, __file__, "--compile-child", e, m, "--backend", args.backend],
                                      capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    raise SystemExit(f"{e} ({m}) failed:\n{proc.stderr}")
                results[(e, m)].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"## torch.compile recorder (median of {args.compiled} runs, 60 steps, backend {args.backend})\n")
    print("| loop | first step, thread CPU ms, without → with recorder | steady step (median of 10+), thread CPU ms |")
    print("|---|---:|---:|")
    for e in COMPILED_EXAMPLES:
        f = [statistics.median(r["first_ms"] for r in results[(e, m)]) for m in modes]
        s = [statistics.median(r["steady_ms"] for r in results[(e, m)]) for m in modes]
        print(f"| `{Path(e).stem}` | {f[0]:.1f} → {f[1]:.1f} | {s[0]:.3f} → {s[1]:.3f} ({s[1] / s[0]:.3f}×) |")
    print()


# -- part 4: the whole-run step record and the long-run triggers, after the window -------------------------
LONG_MODES = ["timing only", "+ step record", "+ long-run triggers"]


def _long_boundary(mode: str, folder: str, torch):
    """The per-boundary work of `mode` after the window (what session._boundary does there)."""
    from gpuadvise.harness.windows.requests import Requests
    from gpuadvise.harness.steps.record import StepRecord
    from gpuadvise.harness.steps.times import StepTimes
    from gpuadvise.harness.windows.triggers import Triggers

    record = StepRecord(os.path.join(folder, f"steps-{LONG_MODES.index(mode)}.jsonl")) if mode != "timing only" else None
    triggers = None
    if mode == "+ long-run triggers":
        config = {"on_signal": True, "when_slower": 50.0, "slower_steps": 20, "every": 10 ** 9}
        triggers = Triggers(config, Requests(folder, None, is_distributed=False), 1, 3)

    def on_final(n, phase, cpu_ms, gpu_ms):
        record.add(n, phase, cpu_ms, gpu_ms)
        if triggers is not None:
            triggers.observe(n, phase, cpu_ms)

    times = StepTimes(torch, keep_head=200, on_final=on_final if record is not None else None)
    k = [0]

    def boundary():
        times.end()
        k[0] += 1
        if record is not None:
            record.tick()
            if record.wants_memory(k[0]):
                record.memory(k[0], torch)
        if triggers is not None:
            triggers.boundary(k[0], 7)
        times.begin(k[0], "after", "optimizer")

    return boundary, record


def long_child(example: str, rounds: int, seg: int) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    folder = tempfile.mkdtemp(prefix="bench-long-")
    boundaries = {m: _long_boundary(m, folder, torch) for m in LONG_MODES}
    plan = [m for _ in range(rounds) for m in LONG_MODES]
    state = {"i": 0, "t": None, "rows": []}

    def hook(opt, args, kwargs):
        i = state["i"]
        mode = plan[min(i // seg, len(plan) - 1)]
        boundaries[mode][0]()  # the boundary's work is in the step it ends, as under gpuadvise profile
        cpu = time.thread_time_ns()
        if state["t"] is not None and i % seg:  # a segment's first step straddles two modes: dropped
            state["rows"].append((mode, (cpu - state["t"]) / 1e6))
        state["i"], state["t"] = i + 1, time.thread_time_ns()

    register_optimizer_step_post_hook(hook)
    sys.argv = [example, "--steps", str(len(plan) * seg + 1)]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        runpy.run_path(example, run_name="__main__")
    alone = {}
    for m in LONG_MODES:  # the boundary work with no training around it
        boundary, record = _long_boundary(m, folder, torch)
        n = 20_000
        t = time.thread_time_ns()
        for _ in range(n):
            boundary()
        alone[m] = (time.thread_time_ns() - t) / n / 1e3
        if record is not None:
            record.close()
    print(json.dumps({"rows": state["rows"], "alone_us": alone}))


def part4(args, examples) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    print(f"## After the window: the whole-run step record and the long-run triggers ({args.long} rounds × "
          f"{len(LONG_MODES)} modes × {args.seg} steps, thread CPU time)\n")
    print("| loop | timing only, CPU ms per step | " + " | ".join(LONG_MODES[1:]) + " | boundary work alone (µs per step) |")
    print("|---|---:|" + "---:|" * (len(LONG_MODES) - 1) + "---|")
    for e in examples:
        proc = subprocess.run([sys.executable, __file__, "--long-child", str(EXAMPLES / e), "--long", str(args.long),
                               "--seg", str(args.seg)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{e} failed:\n{proc.stderr}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        med = {m: statistics.median([ms for mm, ms in res["rows"] if mm == m]) for m in LONG_MODES}
        base = med[LONG_MODES[0]]
        alone = " / ".join(f"{res['alone_us'][m]:.1f}" for m in LONG_MODES)
        print(f"| `{Path(e).stem}` | {base:.3f} | " + " | ".join(f"{med[m]:.3f} ({med[m] / base:.3f}×)" for m in LONG_MODES[1:])
              + f" | {alone} |")
    print("\nA cell: the median thread CPU time per step (ratio to timing only); modes interleaved in one process. "
          "The last column times the boundary work of each mode alone, without training.\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--seg", type=int, default=6, help="steps per segment (the first one is dropped)")
    p.add_argument("--threads", type=int, default=1, help="OMP/MKL threads in the examples (default 1)")
    p.add_argument("--examples", default=",".join(DEFAULT_EXAMPLES))
    p.add_argument("--e2e", type=int, default=0, metavar="N", help="also run `gpuadvise profile` N times per mode")
    p.add_argument("--compiled", type=int, default=0, metavar="N",
                   help="part 3 only: the torch.compile recorder on and off, N runs each")
    p.add_argument("--backend", default="inductor", help="torch.compile backend for part 3")
    p.add_argument("--long", type=int, default=0, metavar="N",
                   help="part 4 only: the step record and the long-run triggers after the window, N rounds")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--compile-child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--long-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.long_child:
        long_child(args.long_child, args.long, args.seg)
        return
    if args.long:
        part4(args, args.examples.split(","))
        return
    if args.compile_child:
        compile_child(*args.compile_child, args.backend)
        return
    if args.compiled:
        part3(args)
        return
    if args.child:
        child(args.child, args.rounds, args.seg)
        return
    examples = args.examples.split(",")
    part1(args, examples)
    if args.e2e:
        part2(args, examples)


if __name__ == "__main__":
    main()

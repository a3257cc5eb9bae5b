#!/usr/bin/env python3
"""Grow a real Kineto (PyTorch profiler) trace to a target size, for benchmarks.

    python bench/grow_trace.py SRC.json[.gz] OUT.json[.gz] --size-mb 1000

The whole event list is repeated N times along the time axis.  Copy i:
  * shifts every event's ``ts`` by i * (source span + 1000 us gap);
  * offsets every id that links events (``args.correlation``, ``args["External id"]``,
    ``args["external id"]``, flow ``id`` of ph s/f events, ``args["Python id"]`` and
    ``args["Python parent id"]``) by i * stride, so links never cross copies;
  * renames ``ProfilerStep#N`` to ``ProfilerStep#(N + i * steps_in_source)``.
Metadata events (ph "M") and the other top-level keys are written once.

``--size-mb`` is the size of the *uncompressed* JSON in MB (10**6 bytes); the output is
gzip-compressed when OUT ends in ``.gz``.  The output is written streaming (one copy at a
time), so growing to several GB needs only about the memory of the source trace.
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SRC = REPO_ROOT.parent / "shared/traces/hta/tests/data/df_index_resolver/df_index_resolver.json.gz"

GAP_US = 1000
ARG_ID_KEYS = ("correlation", "External id", "external id", "Python id", "Python parent id")
FLOW_PHASES = ("s", "f")
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
SEP = (",", ":")


def load_trace(path: Path) -> dict:
    """json.load a trace, gzip or plain (detected by magic bytes, not by extension)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def is_id(v) -> bool:
    # bool is an int subclass; ids are never bools, and null Python ids stay null.
    return isinstance(v, int) and not isinstance(v, bool)


class Grower:
    """Holds what is needed to emit copy i of the source events."""

    def __init__(self, events: list[dict]):
        self.meta = [e for e in events if e.get("ph") == "M"]
        self.events = [e for e in events if e.get("ph") != "M"]

        # Time shift per copy: source span (incl. durations) + gap.  Rounded up to whole
        # microseconds so integer timestamps stay integers.
        starts = [e["ts"] for e in self.events if isinstance(e.get("ts"), (int, float))]
        ends = [e["ts"] + (e.get("dur") or 0) for e in self.events if isinstance(e.get("ts"), (int, float))]
        self.span = (max(ends) - min(starts)) if starts else 0
        self.ts_step = math.ceil(self.span) + GAP_US

        # One stride for every id kind: in Kineto the flow id equals the correlation id
        # (and External id often does too), so a common offset keeps those equalities.
        max_id = 0
        for e in self.events:
            if e.get("ph") in FLOW_PHASES and is_id(e.get("id")):
                max_id = max(max_id, e["id"])
            args = e.get("args")
            if args:
                for k in ARG_ID_KEYS:
                    if is_id(args.get(k)):
                        max_id = max(max_id, args[k])
        self.id_stride = max_id + 1

        steps = [int(m.group(1)) for e in self.events
                 if isinstance(e.get("name"), str) and (m := STEP_RE.match(e["name"]))]
        # max-min+1 (not the count) so renamed ranges never overlap even with gaps.
        self.steps_in_source = (max(steps) - min(steps) + 1) if steps else 0

    def copy(self, i: int):
        """Yield the events of copy i (new dicts; the source events are not modified)."""
        if i == 0:
            yield from self.events
            return
        dt, did, dstep = i * self.ts_step, i * self.id_stride, i * self.steps_in_source
        for e in self.events:
            e = dict(e)
            ts = e.get("ts")
            if isinstance(ts, int):
                e["ts"] = ts + dt
            elif isinstance(ts, float):
                # Fractional (ns-resolution) timestamps: round away float noise from the add.
                e["ts"] = round(ts + dt, 3)
            if e.get("ph") in FLOW_PHASES and is_id(e.get("id")):
                e["id"] += did
            name = e.get("name")
            if dstep and isinstance(name, str) and name.startswith("ProfilerStep#"):
                m = STEP_RE.match(name)
                if m:
                    e["name"] = f"ProfilerStep#{int(m.group(1)) + dstep}"
            args = e.get("args")
            if args and any(k in args for k in ARG_ID_KEYS):
                args = e["args"] = dict(args)
                for k in ARG_ID_KEYS:
                    if is_id(args.get(k)):
                        args[k] += did
            yield e


def grow(src: Path, out: Path, size_mb: float) -> tuple[int, int]:
    """Write the grown trace to ``out``; returns (uncompressed bytes, event count)."""
    trace = load_trace(src)
    events = trace.pop("traceEvents")
    g = Grower(events)
    del events

    dumps = json.JSONEncoder(separators=SEP).encode
    head = "{" + "".join(f"{dumps(k)}:{dumps(v)}," for k, v in trace.items()) + '"traceEvents":['
    meta_bytes = sum(len(dumps(e)) + 1 for e in g.meta)
    copy_bytes = sum(len(dumps(e)) + 1 for e in g.events)  # +1 for the comma
    # Whole copies only, so round to the nearest count.  Later copies have slightly
    # longer numbers; the estimate only needs to be close.
    n_copies = max(1, round((size_mb * 1e6 - len(head) - meta_bytes) / copy_bytes))
    print(f"source: {len(g.events) + len(g.meta)} events, span {g.span / 1e6:.3f} s, "
          f"{g.steps_in_source} profiler steps, ~{copy_bytes / 1e6:.1f} MB/copy -> {n_copies} copies",
          file=sys.stderr)

    def all_events():
        yield from g.meta
        for i in range(n_copies):
            yield from g.copy(i)
            if sys.stderr.isatty():
                print(f"  copy {i + 1}/{n_copies}", end="\n" if i + 1 == n_copies else "\r",
                      file=sys.stderr, flush=True)

    tmp = out.with_name(out.name + ".tmp")
    if out.name.endswith(".gz"):
        f = gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6)
    else:
        f = open(tmp, "w", encoding="utf-8", buffering=1 << 20)
    n_events, n_bytes = 0, 0
    try:
        with f:
            f.write(head)
            n_bytes += len(head)
            # Join events in batches: far fewer write() calls, bounded memory.
            strings, sep = map(dumps, all_events()), ""
            while batch := list(itertools.islice(strings, 20000)):
                s = sep + ",".join(batch)
                f.write(s)
                n_bytes += len(s)  # dumps output is ASCII (ensure_ascii), so chars == bytes
                n_events += len(batch)
                sep = ","
            f.write("]}\n")
            n_bytes += 3
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n_bytes, n_events


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", type=Path, default=DEFAULT_SRC, help="source trace (.json or .json.gz)")
    ap.add_argument("out", type=Path, help="output trace (.json or .json.gz)")
    ap.add_argument("--size-mb", type=float, required=True, help="target uncompressed size in MB (10^6 bytes)")
    args = ap.parse_args(argv)
    nbytes, nevents = grow(args.src, args.out, args.size_mb)
    on_disk = args.out.stat().st_size
    print(f"wrote {args.out}: {nbytes / 1e6:.1f} MB JSON ({on_disk / 1e6:.1f} MB on disk), {nevents} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`--perfetto OUT.json`: the analysed trace, every original event as it was, plus the gpuadvise
track of findings (report/perfetto.py). One trace per file: a job's ranks are separate timelines."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.read.filebytes import read_trace_bytes
from gpuadvise.analyzer.report.output import write_atomic
from gpuadvise.analyzer.report.perfetto import finding_events


def write_perfetto(reports, out: Path) -> None:
    traces = [r for r in reports if r.kind == "trace" and r.model is not None]
    if len(traces) != 1:
        raise InputError(out, f"--perfetto writes one trace's timeline; the input has {len(traces)} traces "
                              "(analyze one rank or capture at a time)")
    report = traces[0]
    src = Path(report.model.meta.path or report.source)
    data, _ = read_trace_bytes(src)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        try:  # torch writes NaN/Infinity tokens in some fields: the standard library reads them
            doc = json.loads(data)
        except ValueError as exc:  # damaged traces are salvaged for analysis, never rewritten
            raise InputError(src, f"cannot rewrite a damaged trace for --perfetto: {exc}") from None
    if isinstance(doc, list):  # the bare-array form of the Trace Event format
        doc = {"traceEvents": doc}
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise InputError(src, "no traceEvents list to add the gpuadvise track to")
    pids = [e.get("pid") for e in events if isinstance(e, dict)]
    pid = max([p for p in pids if isinstance(p, int)], default=0) + 1  # a process id no event uses
    events.extend(finding_events(report, pid))
    # first key, so a folder scan sees at once that this file is a copy of a trace, not another rank
    doc = {"gpuadvise": {"timeline_of": str(src)}, **{k: v for k, v in doc.items() if k != "gpuadvise"}}
    try:
        text = msgspec.json.encode(doc).decode("utf-8")
    except (msgspec.EncodeError, ValueError):  # NaN read back by json: written back as json writes it
        text = json.dumps(doc)
    write_atomic(out, text)

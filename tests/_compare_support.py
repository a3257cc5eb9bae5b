"""Shared by the compare and chart tests (test_compare.py, test_analyze_gate_charts.py,
test_compare_pairs.py, test_tui_compare.py): run folders of small builder traces of a training loop in
the variants a user would compare, each with the run.json `gpuadvise profile` writes, and readers of
the reports (markdown tables, SVG texts, HTML structure) to check that they show the same numbers.

- `stall`: a single-process DataLoader waits 20 ms per step, and `.item()` syncs every step;
- `fixed`: the same loop with DataLoader workers (the wait gone), `.item()` still there;
- `clean`: workers, no sync, fast TF32 GEMMs;
- `slow`: the clean loop with fp32 SIMT GEMMs twice as long (TF32 turned off: a regression).

`with_figures` makes a hand-made side of an analysed one: the same run with other headline figures.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

from gpuadvise.analyzer.compare.side import Side
from gpuadvise.fixtures.builder import GEMM, TraceBuilder

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
SIMT_GEMM = "ampere_sgemm_128x64_nn"
A100 = "NVIDIA A100-SXM4-80GB"
SVG_NS = "{http://www.w3.org/2000/svg}"


def training(stall_us: float = 0.0, item: bool = False, gemm: str = GEMM, gemm_us: float = 300,
             device: str = A100, extra_kernel: str | None = None) -> TraceBuilder:
    b = TraceBuilder(device=device)
    for _ in range(4):
        with b.step():
            b.cpu(SINGLE if stall_us else MULTI, stall_us or 100)
            for _ in range(40):
                with b.op("aten::mm"):
                    b.kernel(gemm, gemm_us)
            if extra_kernel:
                b.kernel(extra_kernel, 50)
            if item:
                b.item()
            b.sync()
    b.finish()
    return b


def run_json(num_workers: int = 0, device: str = A100, script: str = "train.py", tf32: bool = True) -> dict:
    return {
        "script": script,
        "argv": [script, "--epochs", "1"],
        "environment": {"torch": "2.4.0+cu124", "cuda": "12.4", "python": "3.11.7", "cudnn": 90100,
                        "device": {"name": device, "capability": [8, 0], "total_memory": 85_899_345_920, "count": 1}},
        "settings": {"cudnn_benchmark": False, "matmul_allow_tf32": tf32},
        "dataloaders": [{"created_at": f"train.py:{40 + num_workers}", "num_workers": num_workers,
                         "pin_memory": num_workers > 0, "batch_size": 64, "prefetch_factor": 2 if num_workers else None,
                         "persistent_workers": num_workers > 0}],
        "optimizers": [{"class": "AdamW", "id": 140000000 + num_workers, "foreach": None, "fused": None, "params": 10}],
        "capture": {"state": "captured", "options": {"record_shapes": True, "with_stack": False},
                    "window": {"wait": 1, "warmup": 2, "active": 3}},
    }


VARIANTS = {
    "stall": (dict(stall_us=20_000, item=True), dict(num_workers=0)),
    "fixed": (dict(item=True), dict(num_workers=8)),
    "clean": (dict(), dict(num_workers=8)),
    "slow": (dict(gemm=SIMT_GEMM, gemm_us=600), dict(num_workers=8, tf32=False)),
}


def run_folder(root: Path, variant: str, name: str | None = None, facts: dict | None = None, **overrides) -> Path:
    """A run folder `root/<name>` of one variant: trace.json.gz and run.json."""
    trace_kw, facts_kw = VARIANTS[variant]
    folder = root / (name or variant)
    folder.mkdir(parents=True, exist_ok=True)
    training(**{**trace_kw, **overrides}).write(folder / "trace.json.gz")
    (folder / "run.json").write_text(json.dumps(facts if facts is not None else run_json(**facts_kw)))
    return folder


def with_figures(side: Side, **figures) -> Side:
    """`side` with other figures for the trace that heads it (e.g. an unprofiled step time it never had)."""
    summary = side.summary
    traces = list(summary.traces)
    head = traces[summary.heading]
    traces[summary.heading] = replace(head, figures=replace(head.figures, **figures))
    return replace(side, summary=replace(summary, traces=tuple(traces)))


# ----------------------------------------------------------------------------------------------------
# Reading reports back: markdown tables, SVG texts, HTML structure


def md_table(md: str, heading: str) -> list[list[str]]:
    """The body rows of the first table after `heading`, as cell strings."""
    lines = md[md.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def sections_with_tables(md: str) -> list[str]:
    parts = re.split(r"(?m)^(#{2,3} .*)$", md)
    return [h for h, body in zip(parts[1::2], parts[2::2]) if re.search(r"(?m)^\|", body)]


def svg_texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG_NS}text")]


class Page(HTMLParser):
    """The structure of an HTML page: balanced tags, tables (as cell texts), every tag and attribute."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "col", "source", "wbr", "area", "base"}

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []
        self.tables: list[list[list[str]]] = []
        self.svgs: list[list[str]] = []  # the <text> contents of each inline SVG
        self.cell: list[str] | None = None
        self.in_svg_text = False
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]
        if tag not in self.VOID:
            self.stack.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif tag == "svg":
            self.svgs.append([])
        elif tag == "text" and "svg" in self.stack:
            self.in_svg_text = True
            self.svgs[-1].append("")

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(k, v or "") for k, v in attrs]

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "text":
            self.in_svg_text = False

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)
        if self.in_svg_text:
            self.svgs[-1][-1] += data


def self_contained(page: Page) -> None:
    assert page.stack == [], f"unclosed tags: {page.stack}"
    assert page.tags[:2] == ["html", "head"]
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(page.tags)
    assert not [a for a in page.attrs if a[0] in ("src", "srcset") or a[0].startswith("on")]
    assert "url(" not in "".join(page.text)


def unescape_md(cell: str) -> str:
    """A markdown cell as the page shows it: no code-span backticks, no escaping backslashes."""
    return re.sub(r"\\(.)", r"\1", cell.replace("`", ""))

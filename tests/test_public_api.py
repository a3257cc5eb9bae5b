"""gpuadvise from Python and notebooks, through the public API only."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest

import gpuadvise
from gpuadvise.fixtures.builder import TraceBuilder


def _stall_folder(tmp_path):
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 20_000)
            for _ in range(40):
                b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            b.sync()
    b.finish()
    b.facts = {"dataloaders": [{"created_at": "train.py:12", "num_workers": 0, "pin_memory": False}]}
    return b.write_run_folder(tmp_path / "run")


def test_public_names_are_listed_and_documented():
    assert set(gpuadvise.__all__) >= {"analyze", "capture", "step", "Report", "Finding", "Capture", "InputError"}
    for name in gpuadvise.__all__:
        assert getattr(gpuadvise, name) is not None
    page = (__import__("pathlib").Path(__file__).parents[1] / "docs" / "python-api.md").read_text(encoding="utf-8")
    for name in gpuadvise.__all__:
        assert f"`{name}" in page or f"`gpuadvise.{name}" in page, f"docs/python-api.md does not document {name}"


def test_analyze_returns_findings_and_renders(tmp_path):
    report = gpuadvise.analyze(_stall_folder(tmp_path))
    assert isinstance(report, gpuadvise.Report)
    stall = next(f for f in report.findings if f.topic == "dataloader-stall")
    assert isinstance(stall, gpuadvise.Finding)
    assert stall.severity in ("high", "medium") and stall.saving_pct > 0 and stall.message and stall.recommendation
    assert "train.py:12" in stall.evidence["sources"]
    assert report.summary["steps"] == 4
    doc = json.loads(report.to_json())
    assert [f["topic"] for f in doc["findings"]] == [f.topic for f in report.findings]
    assert stall.title in report.to_markdown() and report._repr_markdown_() == report.to_markdown()
    assert report.to_html().lstrip().lower().startswith("<!doctype html")


def test_analyze_several_paths_and_bad_input(tmp_path):
    run = _stall_folder(tmp_path)
    assert gpuadvise.analyze([next(run.glob("trace*.json.gz"))]).findings
    missing = tmp_path / "nope.json"
    with pytest.raises(gpuadvise.InputError) as err:
        gpuadvise.analyze(missing)
    assert str(missing) in str(err.value)


class _StrictHTML(HTMLParser):
    """Checks that every element is closed in order, and collects the text."""

    VOID = {"br", "hr", "img", "meta", "input", "link"}

    def __init__(self):
        super().__init__()
        self.open: list[str] = []
        self.text: list[str] = []
        self.cells = 0

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)
        self.cells += tag == "td"

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_jupyter_html_display_is_well_formed_with_the_findings(tmp_path):
    report = gpuadvise.analyze(_stall_folder(tmp_path))
    page = report._repr_html_()
    parser = _StrictHTML()
    parser.feed(page)
    parser.close()
    assert parser.open == []
    text = "".join(parser.text)
    for f in report.findings:
        assert f.title in text and f.topic in text
    assert parser.cells == 5 * len(report.findings)


def test_repr_html_escapes_what_it_quotes(tmp_path):
    b = TraceBuilder()
    for _ in range(4):
        with b.step():
            b.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 20_000)
            b.kernel("ampere_tf32_s1688gemm_64x64_nn", 300)
            b.sync()
    b.finish()
    b.facts = {"dataloaders": [{"created_at": "<script>alert(1)</script>.py:3", "num_workers": 0, "pin_memory": False}]}
    page = gpuadvise.analyze(b.write_run_folder(tmp_path / "run"))._repr_html_()
    assert "<script>" not in page


CAPTURE_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    import gpuadvise
    from torch.utils.data import DataLoader, TensorDataset
    import torch.utils.data.dataloader as dl

    before = dl._BaseDataLoaderIter.__next__
    data = DataLoader(TensorDataset(torch.randn(400, 8), torch.randint(0, 2, (400,))), batch_size=8)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    manual = sys.argv[2] == "manual"
    # the manual loop also records a window every 4 steps after the first (a long run's option)
    with gpuadvise.capture(sys.argv[1], wait=1, warmup=1, active=2, every=4 if manual else None) as cap:
        for n, (x, y) in enumerate(data):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            if manual:
                cap.step()
            if n == 12:
                break
    assert dl._BaseDataLoaderIter.__next__ is before  # the hooks are gone after the block
    report = cap.report()
    print("TOPICS", ",".join(f.topic for f in report.findings))
''')


@pytest.mark.parametrize("mode", ["auto", "manual"])
@pytest.mark.slow
def test_capture_in_a_plain_python_session(tmp_path, mode):
    pytest.importorskip("torch")
    script = tmp_path / "loop.py"
    script.write_text(CAPTURE_SCRIPT)
    out = tmp_path / "runs" / "exp1"
    proc = subprocess.run([sys.executable, str(script), str(out), mode], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert next(out.glob("*.pt.trace.json.gz")).is_file()
    run = json.loads((out / "run.json").read_text())
    assert run["capture"]["state"] == "captured"
    assert run["capture"]["step_source"] == ("gpuadvise.step()" if mode == "manual" else "optimizer.step()")
    assert run["exit_code"] == 0
    assert run["dataloaders"] == []  # created before the block: its settings are not recorded (README says so)
    windows = run["capture"].get("windows") or []
    if mode == "manual":  # window 1 (steps 2-3), then --every 4: from boundary 9, recorded steps 10-11
        assert [(w["trigger"], w["steps"], w["state"]) for w in windows[:2]] == [
            ("schedule", [2, 3], "captured"), ("every", [10, 11], "captured")]
        # the next one began but the block ended inside it: said so, and no trace of half a window
        assert [w["state"].split(":")[0] for w in windows[2:]] == ["incomplete"]
        assert not (out / "trace.w3.pt.trace.json.gz").exists()
        assert (out / "trace.w2.pt.trace.json.gz").is_file() and (out / "steps.jsonl").is_file()
    else:
        assert windows == []
    assert "TOPICS" in proc.stdout
    # the same folder analysed again from outside gives the same findings
    topics = proc.stdout.split("TOPICS", 1)[1].split()[0] if proc.stdout.split("TOPICS", 1)[1].split() else ""
    assert ",".join(f.topic for f in gpuadvise.analyze(out).findings) == topics


def test_capture_refuses_a_folder_that_holds_a_capture(tmp_path):
    pytest.importorskip("torch")
    run = _stall_folder(tmp_path)
    with pytest.raises(gpuadvise.InputError) as err:
        with gpuadvise.capture(run):
            pass
    assert str(run) in str(err.value) and "force=True" in str(err.value)


def test_dependency_graph_is_the_replay_and_its_longest_path_is_the_step(tmp_path):
    """The graph the predictions replay, as networkx: its longest path is the replay's baseline, it runs
    from the window's start through the stall the loader fixture plants, and it names calls and GPU ops."""
    import networkx as nx

    g = gpuadvise.dependency_graph(_stall_folder(tmp_path))
    assert isinstance(g, nx.DiGraph) and nx.is_directed_acyclic_graph(g)
    assert nx.dag_longest_path_length(g, weight="us") == pytest.approx(g.graph["baseline_us"], rel=1e-9)
    assert g.graph["steps"] >= 1 and g.graph["baseline_us"] > 0
    path = nx.dag_longest_path(g, weight="us")
    assert g.nodes[path[0]]["what"] == "window start"
    kinds = {g.edges[u, v]["kind"] for u, v in zip(path, path[1:])}
    assert "cpu" in kinds  # the loader's wait on the training thread is CPU time between calls
    whats = {d["what"] for _, d in g.nodes(data=True)}
    assert {"call start", "call end", "GPU op start", "GPU op end"} <= whats
    assert all("name" in d and "stream" in d for _, d in g.nodes(data=True) if d["what"].startswith("GPU op"))


def test_dependency_graph_refuses_what_it_cannot_graph(tmp_path):
    missing = tmp_path / "nothing.json"
    with pytest.raises(gpuadvise.InputError, match="nothing.json: no such file"):
        gpuadvise.dependency_graph(missing)
    cpu_only = tmp_path / "cpu.json"
    cpu_only.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1, "dur": 2, '
                        '"pid": 1, "tid": 1}]}')
    with pytest.raises(gpuadvise.InputError, match="nothing to replay"):
        gpuadvise.dependency_graph(cpu_only)

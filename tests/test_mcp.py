"""`gpuadvise mcp`: the real server, started over stdio by the MCP SDK's own client, as an assistant starts it.

One server process serves the whole module, started with torch hidden from its imports (as if torch were
not installed: `import torch` raises), so every call below also shows that the server needs no torch.
It lists its tools with their schemas and its rule resources; analyses an open corpus trace and gives
the findings `gpuadvise analyze --format json` gives; compares the H100 loader pair with the gate's
verdict both ways; answers a missing path, a truncated trace and a folder that is not a run with the
CLI's own one-line error; reports progress from the analysis on a trace big enough to be decoded in
several chunks, and stops that analysis when the call is cancelled; and profiles a script in its working
folder. Tests that read ../shared skip without it, those that talk to the server without the `mcp` extra;
without it, `gpuadvise mcp` says in one line what to install.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from _cli_support import REPO, call_main, write_rule_positive

pytestmark = pytest.mark.slow  # starts the server (a Python), and one `gpuadvise profile`

TRACES = Path(os.environ.get("GPUADVISE_TRACES") or REPO.parent / "shared" / "traces").resolve()
LOADER = TRACES / "h100" / "loader-before", TRACES / "h100" / "loader-after"
BERT = TRACES / "tracelens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"
needs_shared = pytest.mark.skipif(not LOADER[0].is_dir(), reason="needs ../shared/traces (the open corpus)")

# The server as `gpuadvise mcp` runs it, with torch made unimportable first.
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # as if torch were not installed: `import torch` raises ImportError
from gpuadvise.cli import main
sys.exit(main(["mcp"]))
"""

TOOLS = {"analyze", "explain", "compare", "steps", "top_kernels", "idle_causes", "source_line", "profile"}


class Client:
    """The SDK's client session on a thread of its own (a blocking portal), so that plain tests call it."""

    def __init__(self, portal, session, log: Path, folder: Path):
        self.portal, self.session, self.log, self.folder = portal, session, log, folder

    def call(self, tool: str, progress=None, **arguments):
        return self.portal.call(lambda: self.session.call_tool(tool, arguments, progress_callback=progress))

    def run(self, fn, *args):
        return self.portal.call(fn, *args)


@asynccontextmanager
async def _connected(params, errlog):
    from mcp import ClientSession, stdio_client

    async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def test_without_the_sdk_the_command_says_what_to_install(capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else find_spec(name, *a))
    rc, out, err = call_main(capsys, "mcp")
    assert rc == 2 and out == ""
    assert err.startswith("gpuadvise: error: `gpuadvise mcp` needs the MCP SDK; pip install ") and "[mcp]" in err
    assert len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("mcp", reason="the `mcp` extra is not installed")
    from anyio.from_thread import start_blocking_portal
    from mcp import StdioServerParameters

    folder = tmp_path_factory.mktemp("mcp-work")  # the server's working folder (profile's run folders go here)
    log = folder.parent / "server.log"
    env = {k: v for k, v in os.environ.items() if k != "GPUADVISE_DEBUG"}
    env["GPUADVISE_NO_CACHE"] = "1"  # every trace parsed for real, no cache written beside it
    params = StdioServerParameters(command=sys.executable, args=["-c", WITHOUT_TORCH], env=env, cwd=str(folder))
    with open(log, "w") as errlog, start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(_connected(params, errlog)) as session:
            yield Client(portal, session, log, folder)


def structured(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def error_text(result) -> str:
    assert result.is_error, "expected a tool error"
    assert len(result.content) == 1
    return result.content[0].text


def test_lists_its_tools_with_their_schemas_and_the_rules_as_resources(server):
    tools = {t.name: t for t in server.run(server.session.list_tools).tools}
    assert set(tools) == TOOLS
    required = {"analyze": {"path"}, "explain": {"rule"}, "compare": {"before", "after"}, "steps": {"path"},
                "top_kernels": {"path"}, "idle_causes": {"path"}, "source_line": {"path", "file", "line"},
                "profile": {"script"}}
    for name, tool in tools.items():
        schema = tool.input_schema
        assert set(schema.get("required", [])) == required[name], name
        assert "ctx" not in schema["properties"], name  # the SDK's context is no argument
        assert all(p.get("description") for p in schema["properties"].values()), f"{name}: an argument without words"
        assert tool.description and len(tool.description) > 80, name
    assert tools["top_kernels"].input_schema["properties"]["n"]["type"] == "integer"
    assert tools["profile"].annotations.read_only_hint is False
    assert all(tools[n].annotations.read_only_hint for n in TOOLS - {"profile"})

    from gpuadvise.rules import all_rules, catalog

    uris = {str(r.uri) for r in server.run(server.session.list_resources).resources}
    assert uris == {"gpuadvise://rules"} | {f"gpuadvise://rules/{r.code}" for r in all_rules()}
    page = server.run(server.session.read_resource, "gpuadvise://rules/GA102").contents[0].text
    assert page == catalog.rule_page(next(r for r in all_rules() if r.code == "GA102"))
    by_name = server.run(server.session.read_resource, "gpuadvise://rules/dataloader-stall").contents[0].text
    assert by_name == page
    assert "dataloader-stall" in server.run(server.session.read_resource, "gpuadvise://rules").contents[0].text


def test_explain_is_the_explain_command(server, capsys):
    rc, out, _ = call_main(capsys, "explain", "GA102")
    result = server.call("explain", rule="dataloader-stall")
    assert rc == 0 and result.content[0].text == out.rstrip("\n")
    assert structured(result)["code"] == "GA102" and structured(result)["name"] == "dataloader-stall"
    rc, _, err = call_main(capsys, "explain", "GA999")
    assert rc == 2 and error_text(server.call("explain", rule="GA999")) == err.strip()


@needs_shared
def test_analyze_gives_the_findings_of_the_json_report(server, capsys):
    rc, out, _ = call_main(capsys, "analyze", str(BERT), "--format", "json")
    assert rc == 0
    cli = json.loads(out)
    assert cli["findings"], "the trace has findings to compare"
    result = server.call("analyze", path=str(BERT), limit=50)
    got = structured(result)
    assert got["findings"] == cli["findings"]
    assert got["summary"] == cli["summary"]
    assert got["findings_page"] == {"offset": 0, "shown": len(cli["findings"]), "total": len(cli["findings"]),
                                    "next_offset": None}
    text = result.content[0].text
    assert cli["findings"][0]["title"] in text and f"{cli['summary']['median_step_ms']:.1f} ms" in text

    # paged: the second finding on a page of its own, and where the next page starts
    second = structured(server.call("analyze", path=str(BERT), offset=1, limit=1))
    assert second["findings"] == cli["findings"][1:2]
    assert second["findings_page"]["next_offset"] == (2 if len(cli["findings"]) > 2 else None)


@needs_shared
def test_the_tables_of_a_run_folder(server):
    path = str(LOADER[0])
    steps = structured(server.call("steps", path=path))
    assert [r["step"] for r in steps["rows"]] == [3, 4, 5]
    summary = structured(server.call("analyze", path=path))["summary"]
    assert steps["median_step_ms"] == pytest.approx(summary["median_step_ms"], abs=1e-3)
    for row in steps["rows"]:  # the step's GPU busy time and its idle time make up the step
        assert row["gpu_busy_ms"] + row["idle_ms"] == pytest.approx(row["time_ms"], abs=2e-3)

    kernels = structured(server.call("top_kernels", path=path, n=3))
    assert len(kernels["kernels"]) == 3 and kernels["page"]["next_offset"] == 3
    totals = [k["total_ms"] for k in kernels["kernels"]]
    assert totals == sorted(totals, reverse=True)
    rest = structured(server.call("top_kernels", path=path, n=3, offset=3))["kernels"]
    assert rest[0]["total_ms"] <= totals[-1] and rest[0]["name"] not in {k["name"] for k in kernels["kernels"]}

    idle = structured(server.call("idle_causes", path=path))
    assert idle["statistic"] == "median step" and idle["causes"][0]["kind"] == "dataloader"
    one = structured(server.call("idle_causes", path=path, step=5))
    assert one["gpu_idle_ms"] == next(r["idle_ms"] for r in steps["rows"] if r["step"] == 5)
    assert one["causes"][0]["ms"] <= one["gpu_idle_ms"]

    line = structured(server.call("source_line", path=path, file="exps.py", line=99))
    assert [f["topic"] for f in line["findings"]] == ["dataloader-stall"]
    assert structured(server.call("source_line", path=path, file="exps.py", line=98))["findings"] == []


def test_source_line_names_what_ran_at_a_line_of_the_users_code(server, tmp_path):
    from gpuadvise.fixtures.builder import TraceBuilder

    from _cli_support import GEMM

    b = TraceBuilder()
    for _ in range(6):  # each step reads a loss with .item() at train.py:42: a pageable copy and a sync
        with b.step():
            b.kernel(GEMM, 800)
            with b.op("aten::item", stack="train.py(42): train_step;torch/nn/modules/module.py(1500): _call_impl"):
                b.item()
            b.kernel(GEMM, 300)
    path = str(b.write(tmp_path / "stack.json"))
    got = structured(server.call("source_line", path=path, file="train.py", line=42))
    assert {c["call"]: c["count"] for c in got["blocking_calls"]} == {"cudaMemcpyAsync": 6, "cudaStreamSynchronize": 6}
    assert all(c["op"] == "aten::_local_scalar_dense" for c in got["blocking_calls"])
    assert "pageable-memcpy" in [f["topic"] for f in got["findings"]]
    elsewhere = structured(server.call("source_line", path=path, file="train.py", line=43))
    assert elsewhere["blocking_calls"] == [] and elsewhere["findings"] == []


@needs_shared
def test_compares_the_h100_loader_pair_with_the_gates_verdict(server, capsys):
    before, after = map(str, LOADER)
    rc, out, _ = call_main(capsys, "compare", before, after, "--format", "json")
    assert rc == 0
    cli = json.loads(out)
    result = server.call("compare", before=before, after=after, fail_on_regression=5)
    got = structured(result)
    assert got["step_time"] == cli["step_time"]
    assert got["findings"] == cli["findings"]
    assert got["gate"]["failed"] is False and got["gate"]["regressed"] is False
    assert "97.8 % faster" in result.content[0].text
    # the loader fix brings a new low finding (cudnn-benchmark): a gate on new low findings fails
    gated = structured(server.call("compare", before=before, after=after, fail_on="low"))
    assert gated["gate"]["failed"] is True and "cudnn-benchmark" in gated["gate"]["reasons"][0]


def _truncated(folder: Path) -> Path:
    whole = write_rule_positive("GA102", folder / "whole.json")
    cut = folder / "cut.json"
    cut.write_bytes(whole.read_bytes()[:60])  # the file ends before its first event
    return cut


def test_bad_input_is_a_tool_error_in_the_clis_own_line(server, capsys, tmp_path):
    not_a_run = tmp_path / "notes"
    not_a_run.mkdir()
    (not_a_run / "readme.txt").write_text("not a trace\n")
    for path in (tmp_path / "missing.json.gz", _truncated(tmp_path), not_a_run):
        rc, _, err = call_main(capsys, "analyze", str(path))
        assert rc == 2
        line = error_text(server.call("analyze", path=str(path)))
        assert line == err.strip() and "\n" not in line and "Traceback" not in line
    assert error_text(server.call("top_kernels", path=str(_truncated(tmp_path)), n=0)) == \
        "gpuadvise: error: n: expected a whole number ≥ 1, got 0"
    assert error_text(server.call("compare", before=str(tmp_path / "nope"), after=str(not_a_run))) == \
        f"gpuadvise: error: {tmp_path / 'nope'}: no such file or folder"


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    """A trace decoded in three chunks (the reader's 8 MB), grown with the project's own generator."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import grow_trace
    finally:
        sys.path.remove(str(REPO / "bench"))
    folder = tmp_path_factory.mktemp("big")
    src = write_rule_positive("GA102", folder / "step.json")
    big = folder / "big.json"
    grow_trace.grow(src, big, 20)
    return big


def _log_says(log: Path, text: str, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if text in log.read_text():
            return True
        time.sleep(0.05)
    return False


def test_a_cancelled_analysis_stops(server, big_trace):
    import anyio

    async def cancel_on_first_progress():
        with anyio.CancelScope() as scope:
            async def progress(value, total, message):
                scope.cancel()  # as an assistant's user pressing stop: the client sends notifications/cancelled

            await server.session.call_tool("analyze", {"path": str(big_trace)}, progress_callback=progress)
        return scope.cancelled_caught

    assert server.run(cancel_on_first_progress)
    assert _log_says(server.log, f"stopped analysing {big_trace}: the call was cancelled")
    assert f"analysed {big_trace}\n" not in server.log.read_text()


def test_progress_on_a_big_trace(server, big_trace):
    seen = []

    async def progress(value, total, message):
        seen.append((value, total, message))

    result = server.call("analyze", progress=progress, path=str(big_trace))
    assert structured(result)["findings_page"]["total"] >= 1
    values = [v for v, _, _ in seen]
    assert values == sorted(set(values)) and values[-1] == 1.0, seen  # strictly increasing, to the end
    assert all(total == 1.0 for _, total, _ in seen)
    decoding = [m for v, _, m in seen if 0 < v < 1 and m.endswith(f"% of {big_trace} read")]
    assert len(decoding) >= 2, seen  # the reader's own callbacks, chunk by chunk
    assert seen[-1][2] == f"analysed {big_trace}"


def test_profile_runs_a_script_of_the_working_folder(server, capsys):
    script = server.folder / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(32, 32)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(8):\n"
        "    loss = model(torch.randn(16, 32)).square().mean()\n"
        "    opt.zero_grad()\n"
        "    loss.backward()\n"
        "    opt.step()\n")
    lines = []

    async def progress(value, total, message):
        lines.append(message)

    result = server.call("profile", progress=progress, script="train.py", steps=2, wait=2, warmup=1)
    got = structured(result)
    run = server.folder / got["run"]["run_folder"]  # relative to the server's working folder
    assert got["run"]["exit_code"] == 0 and run.parent == server.folder / "gpuadvise-runs"
    assert (run / "run.json").is_file()
    assert got["summary"]["steps"] == 2 and "findings" in got
    assert any("captured 2 steps" in m for m in lines), lines  # profile's own lines, as they came

    assert error_text(server.call("profile", script="missing.py")) == "gpuadvise: error: missing.py: no such script"
    outside = error_text(server.call("profile", script=str(REPO / "examples" / "train_stall.py")))
    assert outside.startswith(f"gpuadvise: error: {REPO / 'examples' / 'train_stall.py'}: not inside the working folder")


def test_the_server_never_failed_inside(server):
    # last: every call above was answered without an internal error (and without torch)
    log = server.log.read_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]

"""The MCP server: gpuadvise's analysis as tools and resources an AI assistant uses, over stdio.

Each tool is a thin call into the analysis (`gpuadvise.analyzer.run`, through analyses.py) and the report
model: it returns the JSON report's own shapes as structured content and a short text beside them,
both kept to a size an assistant reads whole (results.py). Every number comes from the engine; the
server never estimates one. Bad input is a tool error whose text is the line the CLI prints for it
(`gpuadvise: error: …`); our own bug is one `gpuadvise: internal error: …` line, its traceback in the
server's log (stderr). Long work reports progress from the analysis' own callbacks, and a cancelled call
stops its work (analyses.py, profiling.py).

Tools: analyze, explain, compare, steps, top_kernels, idle_causes, source_line, profile.
Resources: gpuadvise://rules (the catalog) and gpuadvise://rules/CODE (each rule's page; a rule's name
works too).
"""

from __future__ import annotations

import logging
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from gpuadvise.analyzer import run
from gpuadvise.analyzer.errors import InputError
from gpuadvise.analyzer.model.summary import summarize
from gpuadvise.analyzer.report.json import finite
from gpuadvise.cli import error_line
from gpuadvise.version import __version__

from . import profiling, results
from .analyses import Analyses, Progress

log = logging.getLogger("gpuadvise.mcp")

INSTRUCTIONS = """\
gpuadvise finds why PyTorch training leaves the GPU idle, from torch.profiler traces and `gpuadvise profile`
run folders, and says what to change. Call `analyze` on a trace (.json/.json.gz), a run folder or a folder of
per-rank traces first: its findings come ranked, each with its evidence, the step time its fix is predicted
to save, the fix and the user's file:line. Then drill in with `steps`, `top_kernels`, `idle_causes` and
`source_line`, `explain` a rule, or `compare` a run before and after a change. Quote the numbers these
tools return; do not compute new ones from them."""

READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
RUNS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)

Path_ = Annotated[str, Field(description="a trace (.json/.json.gz), a `gpuadvise profile` run folder, a folder of "
                                         "per-rank traces, a tensorboard_trace_handler folder or a memory snapshot "
                                         "(.pickle); relative to the server's working folder")]
Rank = Annotated[int | None, Field(description="which rank's trace, in a folder of ranks (default: the slowest)")]
Offset = Annotated[int, Field(description="the first row to return (0: the first page); a result says where the next page starts")]


def _answer(structured: dict, text: str) -> CallToolResult:
    """A result: the data as JSON holds it (NaN and infinities as null), and its text, cut to size."""
    return CallToolResult(content=[TextContent(type="text", text=results.clip(text))],
                          structured_content=finite(structured))


def _failed(exc: BaseException) -> CallToolResult:
    """A tool error in one line, as the CLI says it; the traceback of our own bug goes to the log."""
    if not isinstance(exc, InputError):
        log.error("internal error", exc_info=exc)
    return CallToolResult(content=[TextContent(type="text", text=error_line(exc))], is_error=True)


def _trace(reports, rank: int | None, path: str):
    """The report a table is read from: `rank`'s, else the one that heads the summary (the slowest rank)."""
    if rank is None:
        heading = summarize(reports).heading
        return reports[heading if heading is not None else 0]
    for r in reports:
        if r.rank == rank:
            return r
    ranks = sorted(r.rank for r in reports if r.rank is not None)
    raise InputError(path, f"no rank {rank} here ({'its ranks: ' + ', '.join(map(str, ranks)) if ranks else 'one trace, no ranks'})")


def _where(report) -> dict:
    return {"trace": report.source, "rank": report.rank}


def build() -> MCPServer:
    """The server with its tools and resources; `serve()` runs it over stdio."""
    server = MCPServer("gpuadvise", title="gpuadvise", version=__version__, instructions=INSTRUCTIONS)
    analyses = Analyses()

    async def reports_of(path: str, ctx: Context):
        return await analyses.reports(path, Progress(ctx.report_progress))

    @server.tool(annotations=READS)
    async def analyze(path: Path_, ctx: Context, offset: Offset = 0,
                      limit: Annotated[int, Field(description="findings per page")] = 10) -> CallToolResult:
        """Analyse a PyTorch profiler trace or run: the header figures (steps, median step time, GPU busy,
        device, memory) and the findings, most severe first, each with its evidence, the step time its fix
        is predicted to save (from a replay of the recorded steps), the fix and the user's file:line. The
        findings are those of `gpuadvise analyze --format json`, paged."""
        try:
            results.whole_number("offset", offset, 0), results.whole_number("limit", limit, 1)
            reports = await reports_of(path, ctx)
            return _answer(*analysis_result(reports, path, offset, limit))
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=READS)
    async def explain(rule: Annotated[str, Field(description="a rule's code (GA102) or name (dataloader-stall)")]) -> CallToolResult:
        """A rule's documentation: what it detects, why it matters, the fix and its thresholds (what
        `gpuadvise explain RULE` prints), with the rule's catalog entry as data."""
        try:
            from gpuadvise.rules import catalog
            from gpuadvise.rules.cli import explain as explain_text, named_rule

            return _answer(catalog.entry(named_rule(rule)), explain_text(rule))
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=READS)
    async def compare(before: Annotated[str, Field(description="the run before the change (as `path` in analyze)")],
                      after: Annotated[str, Field(description="the run after the change")], ctx: Context,
                      fail_on_regression: Annotated[float | None, Field(description="the gate: fail when the step got more than this many percent slower")] = None,
                      fail_on: Annotated[str | None, Field(description="the gate: fail on a new finding of this severity or worse (high, medium, low, info), or of these topics or rules, comma-separated")] = None) -> CallToolResult:
        """Compare two runs as `gpuadvise compare` does: the step time before → after, the findings
        resolved, new and still there, each resolved finding's predicted saving next to the change
        measured, the kernels and ops that changed most, what differs between the runs, and the gate's
        verdict (`gate.failed`, with its reasons; the thresholds are optional)."""
        try:
            from gpuadvise.analyzer.compare import diff
            from gpuadvise.analyzer.compare.gate import apply_gate
            from gpuadvise.analyzer.compare.side import Side
            from gpuadvise.analyzer.report import formats
            from gpuadvise.analyzer.run.gate import parse_fail_on, parse_regression

            gate_on = parse_fail_on(fail_on)  # wrong gate values fail before the analysis, as in the CLI
            regression = parse_regression(None if fail_on_regression is None else f"{fail_on_regression:g}")
            progress = Progress(ctx.report_progress, total=2.0)
            sides = []
            for i, path in enumerate((before, after)):
                sides.append(Side.of(await analyses.reports(path, progress, (float(i), 1.0)), label=path))
            cmp = apply_gate(diff.compare(*sides), gate_on, regression)
            first = ("gate", "step_time", "findings", "predictions", "warnings")
            parts = {k: cmp[k] for k in first if k in cmp} | {k: v for k, v in cmp.items() if k not in first}
            structured = results.fit(parts, f"gpuadvise compare {before} {after} --format json")
            return _answer(structured, formats.render_compare(cmp, "text"))
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=READS)
    async def steps(path: Path_, ctx: Context, offset: Offset = 0,
                    limit: Annotated[int, Field(description="steps per page")] = 50, rank: Rank = None) -> CallToolResult:
        """The steps of a trace, as `gpuadvise view` lists them: each step's time (the slower of its CPU
        span and its GPU time), GPU busy share and its split into compute, communication, copies, DataLoader
        wait, sync wait and GPU idle (ms); the steps left out of every figure (warm-up, compile,
        evaluation) with why; the median step."""
        try:
            results.whole_number("offset", offset, 0), results.whole_number("limit", limit, 1)
            report = _trace(await reports_of(path, ctx), rank, path)
            t = run.tables.steps(report)
            rows, paging = results.page(t["rows"], offset, limit)
            structured = {**_where(report), "median_step_ms": t["median_step_ms"], "steps": t["steps"],
                          "rows": rows, "page": paging, "left_out": t["left_out"]}
            text = (f"{report.source}: {t['steps']} steps, median {t['median_step_ms']} ms\n"
                    + results.table(rows, [("step", "step"), ("time_ms", "time ms"), ("gpu_busy_pct", "GPU busy %"),
                                           ("compute_ms", "compute ms"), ("comm_ms", "comm ms"),
                                           ("memcpy_ms", "memcpy ms"), ("dataloader_ms", "loader ms"),
                                           ("sync_ms", "sync ms"), ("idle_ms", "idle ms")])
                    + "\n" + results.paging_line(paging, "steps")
                    + "".join(f"\nleft out: step {s['step']}: {s['why']}" for s in t["left_out"]))
            return _answer(structured, text)
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=READS)
    async def top_kernels(path: Path_, ctx: Context, n: Annotated[int, Field(description="kernels per page")] = 20,
                          offset: Offset = 0, rank: Rank = None) -> CallToolResult:
        """The GPU kernels that take the most time, by name: launches, total ms, mean and median µs, share of
        all kernel time, and their kind (communication, a matmul's precision path: tensor-core, fp32-simt, …)."""
        try:
            results.whole_number("n", n, 1), results.whole_number("offset", offset, 0)
            report = _trace(await reports_of(path, ctx), rank, path)
            rows, paging = results.page(run.tables.kernels(report), offset, n)
            text = (f"{report.source}: GPU kernels by total time\n"
                    + results.table(rows, [("total_ms", "total ms"), ("share_pct", "share %"), ("count", "launches"),
                                           ("median_us", "median µs"), ("kind", "kind"), ("name", "kernel")])
                    + "\n" + results.paging_line(paging, "kernels"))
            return _answer({**_where(report), "kernels": rows, "page": paging}, text)
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=READS)
    async def idle_causes(path: Path_, ctx: Context,
                          step: Annotated[int | None, Field(description="a step's number (ProfilerStep#N); default: the median step")] = None,
                          rank: Rank = None) -> CallToolResult:
        """What the CPU was doing while the GPU sat idle inside the steps: waiting for the DataLoader,
        blocked in a sync, in cudaMalloc/cudaFree, launching, running an op's CPU code, or Python outside
        any op; each cause's ms and share of the idle time, in the median step or in one step."""
        try:
            report = _trace(await reports_of(path, ctx), rank, path)
            t = run.tables.idle_causes(report, step)
            where = "the median step" if step is None else f"step {step}"
            text = (f"{report.source}: GPU idle {t['gpu_idle_ms']} ms in {where}, while the CPU was:\n"
                    + results.table(t["causes"], [("ms", "ms"), ("share_of_idle_pct", "% of idle"), ("kind", "kind"),
                                                  ("what", "what")]))
            return _answer({**_where(report), **t}, text)
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=READS)
    async def source_line(path: Path_, file: Annotated[str, Field(description="a file of the user's code (train.py, src/model.py)")],
                          line: Annotated[int, Field(description="its line number")], ctx: Context,
                          rank: Rank = None) -> CallToolResult:
        """What the analysis found at one line of the user's code: the findings that point at it, the calls
        there that blocked the CPU on the GPU (count, total and longest wait), and the GPU memory allocated
        there (the allocator snapshot's live blocks, the memory history's allocations)."""
        try:
            results.whole_number("line", line, 1)
            reports = await reports_of(path, ctx)
            report = _trace(reports, rank, path)
            from gpuadvise.analyzer.report.json import document

            found = [f for f in document(reports)["findings"] if f["trace"] in (report.source, None)]
            t = run.tables.source_line(report, found, file, line)
            structured = {**_where(report), **results.fit({"findings": t.pop("findings"), **t},
                                                          f"gpuadvise analyze {path} --format json")}
            lines = [f"{file}:{line} in {report.source}:"]
            lines += [f"  finding [{f['severity']}] {f['title']} ({f['rule']} {f['topic']})" for f in structured.get("findings", [])]
            lines += [f"  blocking call {c['call']} in {c['op'] or '(no op)'}: {c['count']}×, {c['total_ms']} ms in all, "
                      f"longest {c['max_ms']} ms" for c in t["blocking_calls"]]
            lines += [f"  memory ({m['from']}): " + ", ".join(f"{k} {v}" for k, v in m.items() if k not in ("from", "site"))
                      for m in t["memory"]]
            if len(lines) == 1:
                lines.append("  nothing: no finding, blocking call or allocation site of the analysis is at this line "
                             "(source lines need stacks: `gpuadvise profile --with-stack`)")
            return _answer(structured, "\n".join(lines))
        except Exception as exc:
            return _failed(exc)

    @server.tool(annotations=RUNS)
    async def profile(script: Annotated[str, Field(description="a training script (.py) inside the server's working folder, as the user named it")],
                      ctx: Context,
                      args: Annotated[list[str] | None, Field(description="the script's own arguments")] = None,
                      steps: Annotated[int, Field(description="steps recorded (profile --active)")] = 3,
                      wait: Annotated[int | None, Field(description="steps before the warm-up, timed but not profiled (profile's default: 10)")] = None,
                      warmup: Annotated[int | None, Field(description="warm-up steps, traced but discarded (profile's default: 2)")] = None,
                      stop_after_capture: Annotated[bool, Field(description="end the script once the steps are recorded")] = True,
                      with_stack: Annotated[bool, Field(description="record Python stacks (source lines in findings; slows the recorded steps)")] = False) -> CallToolResult:
        """Run `gpuadvise profile` on a script the user named, in the working folder: the script runs as
        `python script.py args…` would, a window of steps is recorded into a new run folder under
        ./gpuadvise-runs/, and the run folder's analysis comes back (as `analyze` returns it) with the run's
        exit code and the last lines of its output. Runs the user's code: call it only when asked to."""
        try:
            target = profiling.script_in_working_folder(script)
            options = {"steps": results.whole_number("steps", steps, 1),
                       "wait": None if wait is None else results.whole_number("wait", wait, 0),
                       "warmup": None if warmup is None else results.whole_number("warmup", warmup, 0),
                       "stop_after_capture": stop_after_capture, "with_stack": with_stack}
            progress = Progress(ctx.report_progress, total=None)
            seen = {"lines": 0}

            async def each_line(elapsed_s: float, text: str) -> None:
                seen["lines"] += 1
                await ctx.report_progress(seen["lines"], None, text)

            ran = await profiling.profile(target, list(args or []), options, each_line)
            try:
                reports = await analyses.reports(ran["run_folder"], progress, (seen["lines"] + 1.0, 1.0))
            except InputError as exc:  # nothing to analyse: say why, with what the run printed
                return CallToolResult(content=[TextContent(type="text", text=error_line(exc) + "\n" + "\n".join(ran["output_tail"]))],
                                      is_error=True)
            structured, text = analysis_result(reports, ran["run_folder"], 0, 10)
            head = (f"profiled {script} into {ran['run_folder']} (exit code {ran['exit_code']}, {ran['seconds']} s); "
                    f"`analyze` with path={ran['run_folder']} pages through the findings\n")
            return _answer({"run": ran, **structured}, head + text)
        except Exception as exc:
            return _failed(exc)

    _rule_resources(server)
    return server


def analysis_result(reports, path: str, offset: int, limit: int) -> tuple[dict, str]:
    """`analyze`'s result: a page of the JSON report's findings first, then its summary, the job and long-run
    sections and the traces' summaries while they fit; the text report (or, past the first page, a line per
    finding)."""
    from gpuadvise.analyzer.report import formats
    from gpuadvise.analyzer.report.json import document

    doc = document(reports)
    findings, paging = results.page(doc["findings"], offset, limit)
    parts = {"findings": findings, "findings_page": paging, "summary": doc["summary"]}
    parts |= {k: doc[k] for k in ("job", "long_runs", "traces") if k in doc}
    structured = results.fit(parts, f"gpuadvise analyze {path} --format json")
    text = formats.render(reports, "text", top=max(len(findings), 1)) if offset == 0 else ""
    if not text or len(text) > results.MAX_TEXT_CHARS:  # a later page, or many ranks' headers: the findings alone
        text = "\n".join(_finding_line(offset + i, f) for i, f in enumerate(findings, 1))
    return structured, text.rstrip("\n") + "\n" + results.paging_line(paging, "findings")


def _finding_line(n: int, f: dict) -> str:
    impact = f["impact"]
    saving = f"{'up to ' if impact['upper_bound'] else '~'}{impact['est_step_saving_pct']:.1f}% of step time"
    at = f" at {', '.join(f['evidence']['sources'][:2])}" if f["evidence"]["sources"] else ""
    return f"{n}. [{f['severity']}] {f['title']} ({saving}) {f['rule']} {f['topic']}{at}"


def _rule_resources(server: MCPServer) -> None:
    """The rule catalog, and each rule's page (its documentation, as on the site), as resources."""
    from gpuadvise.rules import all_rules, catalog
    from gpuadvise.rules.cli import named_rule

    @server.resource("gpuadvise://rules", name="rules", title="gpuadvise rule catalog", mime_type="text/markdown",
                     description="every rule: its code, topic, what it finds and what it reads")
    def rule_catalog() -> str:
        return "# gpuadvise rules\n\nEach rule's page: gpuadvise://rules/CODE.\n\n" + catalog.markdown_table() + "\n"

    def page_of(rule):
        return lambda: catalog.rule_page(rule)

    for rule in all_rules():
        server.resource(f"gpuadvise://rules/{rule.code}", name=f"{rule.code} {rule.name}", title=rule.title,
                        mime_type="text/markdown", description=rule.summary)(page_of(rule))

    @server.resource("gpuadvise://rules/{rule}", name="rule", mime_type="text/markdown",
                     description="a rule's page, by its code (GA102) or name (dataloader-stall)")
    def rule_page(rule: str) -> str:
        return catalog.rule_page(named_rule(rule))


def serve() -> None:
    """Serve on stdin/stdout until the client closes them; the log (stderr) says what ran."""
    logging.basicConfig(level=logging.INFO, format="gpuadvise mcp: %(message)s")  # before the SDK's own set-up
    build().run("stdio")

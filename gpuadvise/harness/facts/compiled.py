"""What torch.compile did while the script ran: compiled frames, recompilations, graph breaks, compile
time per step, CUDA graphs. Goes into run.json's `compiled`.

Nothing is installed until the script calls `torch.compile` (a script that never compiles pays nothing).
Then a handler is attached to torch's structured-trace logger (`torch._logging._internal.trace_log`,
the surface TORCH_TRACE/tlparse read; torch >= 2.2). Its records give, per frame compile,
`compilation_metrics` (function, file, first line, compile seconds, recompile reason, CUDA-graph skip
reason), `bwd_compilation_metrics` (the backward's lazy compile, added to its frame compile's seconds) and the `dynamo_graph_break_reason` / `recompile_reasons` artifacts. Older torch lacks it: then
only dynamo's counters (`torch._dynamo.utils.counters`) are read, at each run.json write.
Every record is stamped with the step it happened in. Any failure here is swallowed and noted.
"""

from __future__ import annotations

import logging
import re

from gpuadvise.analyzer.model import frames

from .general import caller

MAX_ITEMS = 200  # compiles / breaks kept in run.json: a recompiling loop must not grow it forever

_BREAK_AT = re.compile(r"Graph break in user code at (.+?):(\d+)")
_BREAK_REASON = re.compile(r"Graph Break Reason:\s*(.+?)(?:\n\s*(?:Explanation|Hint|Developer debug context):|\Z)", re.S)
_OLD_BREAK_AT = re.compile(r'File "([^"]+)", line (\d+)')  # older torch: a user stack, innermost last


class Recorder:
    def __init__(self, torch, where_fn):
        self.torch = torch
        self.where = where_fn  # () -> (step number, phase) of the step running now
        self.compiles: list[dict] = []
        self.breaks: dict[tuple, dict] = {}
        self.calls: list[dict] = []
        self.targets: dict[int, dict] = {}  # id(what torch.compile was given) → its call in `calls`
        self.cudagraph = {"captures": 0, "replays": 0}
        self.errors: list[str] = []
        self.surface = "counters"
        self.handler = None

    # -- installation --------------------------------------------------------------------------------
    def attach(self) -> None:
        try:
            from torch._logging._internal import trace_log
        except Exception:  # torch < 2.2: counters only
            return
        recorder = self

        class _Handler(logging.Handler):
            def emit(self, record):  # never raises into torch's logging
                try:
                    recorder.on_record(getattr(record, "metadata", None), getattr(record, "payload", None))
                except Exception as exc:
                    recorder.note(exc)

        self.handler = _Handler(logging.DEBUG)
        trace_log.addHandler(self.handler)
        # first in line: torch's LazyTraceHandler removes itself on the first record when TORCH_TRACE is
        # unset, and logging then skips the handler after it for that record
        trace_log.handlers.sort(key=lambda h: h is not self.handler)
        trace_log.setLevel(logging.DEBUG)
        self.surface = "structured_trace"

    def wrap_cudagraphs(self) -> None:
        """Count CUDA-graph captures and replays (reduce-overhead); a CUDA build only."""
        cls = getattr(getattr(self.torch, "cuda", None), "CUDAGraph", None)
        if cls is None or not self.torch.cuda.is_available() or getattr(cls, "_gpuadvise_counted", False):
            return
        counts = self.cudagraph
        for method, key in (("capture_begin", "captures"), ("replay", "replays")):
            original = getattr(cls, method, None)
            if original is None:
                continue

            def counted(graph, *a, _orig=original, _key=key, **k):
                counts[_key] += 1
                return _orig(graph, *a, **k)

            setattr(cls, method, counted)
        cls._gpuadvise_counted = True

    def note(self, exc: BaseException) -> None:
        if len(self.errors) < 5:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    # -- records -------------------------------------------------------------------------------------
    def on_record(self, md, payload) -> None:
        if not isinstance(md, dict):
            return
        if "compilation_metrics" in md:
            self._on_compile(md["compilation_metrics"])
        elif "bwd_compilation_metrics" in md:
            self._on_backward_compile(md["bwd_compilation_metrics"])
        elif isinstance(md.get("artifact"), dict) and md["artifact"].get("name") == "dynamo_graph_break_reason":
            self._on_break(payload)

    def _on_compile(self, m: dict) -> None:
        if not isinstance(m, dict) or len(self.compiles) >= MAX_ITEMS:
            return
        step, phase = self.where()
        entry = {
            "compile_id": m.get("compile_id"), "function": m.get("co_name"),
            "where": _where(m.get("co_filename"), m.get("co_firstlineno")),
            "seconds": _num(m.get("entire_frame_compile_time_s")), "graph_ops": m.get("graph_op_count"),
            "recompile_reason": _first_line(m.get("recompile_reason")), "fail_reason": _first_line(m.get("fail_reason")),
            "cudagraph_skip_reason": m.get("cudagraph_skip_reason"), "step": step, "phase": phase,
        }
        if m.get("co_filename") and frames.is_library(str(m["co_filename"])):
            entry.update(self._user_side(str(entry["where"])))
        self.compiles.append(entry)

    def _on_backward_compile(self, m: dict) -> None:
        """AOTAutograd compiles a frame's backward lazily, on its first backward call: its seconds join the
        frame compile's (same compile id), so a compile's `seconds` is all the compiling it cost, as the
        trace's compile spans show it; `backward_seconds` and `backward_step` say how much and where."""
        if not isinstance(m, dict):
            return
        us = _num(m.get("backward_cumulative_compile_time_us"))
        entry = next((c for c in reversed(self.compiles) if c["compile_id"] == m.get("compile_id")), None)
        if us is None or entry is None:
            return
        step, _ = self.where()
        entry["backward_seconds"] = round((entry.get("backward_seconds") or 0.0) + us / 1e6, 6)
        entry["backward_step"] = step
        entry["seconds"] = round((entry["seconds"] or 0.0) + us / 1e6, 6)

    def _user_side(self, library_where: str) -> dict:
        """A frame dynamo compiled inside torch or a framework (the `inner` wrapper torch.compile puts
        around an `nn.Module` whose forward torch itself traces, a Hugging Face model's forward): named by
        the compiled module and its `torch.compile(...)` call instead, found from the module being called
        on this stack (the record arrives while the user's call of it runs)."""
        call = self._target_on_stack() or (self.calls[0] if len(self.calls) == 1 else None)
        out = {"library_where": frames.library_label(frames.parse(library_where) or frames.Frame(library_where))}
        if call is None:
            return dict(out, where=frames.live().site or None)
        return dict(out, where=call.get("target_where") or call.get("called_at"), module=call.get("target"),
                    compiled_at=call.get("called_at"))

    def _target_on_stack(self) -> dict | None:
        import sys

        f = sys._getframe(1)
        while f is not None:
            obj = f.f_locals.get("self")
            orig = getattr(obj, "_orig_mod", None) if type(obj).__name__ == "OptimizedModule" else None
            if orig is not None and id(orig) in self.targets:
                return self.targets[id(orig)]
            f = f.f_back
        return None

    def _on_break(self, payload) -> None:
        text = payload if isinstance(payload, str) else ""
        where, reason = break_site(text)
        step, phase = self.where()
        key = (where, reason)
        entry = self.breaks.get(key)
        if entry is None:
            if len(self.breaks) >= MAX_ITEMS:
                return
            entry = self.breaks[key] = {"where": where, "reason": reason, "count": 0, "steps": []}
        entry["count"] += 1
        if step not in entry["steps"] and len(entry["steps"]) < 50:
            entry["steps"].append(step)
        entry.setdefault("first_phase", phase)

    # -- run.json --------------------------------------------------------------------------------------
    def summary(self) -> dict:
        out = {"surface": self.surface, "calls": self.calls, "compiles": self.compiles,
               "graph_breaks": sorted(self.breaks.values(), key=lambda b: -b["count"])}
        named = ("module", "compiled_at", "library_where")  # a frame compiled inside library code
        out["recompiles"] = [{k: c[k] for k in ("compile_id", "function", "where", "step", "phase")}
                             | {"reason": c["recompile_reason"]} | {k: c[k] for k in named if c.get(k)}
                             for c in self.compiles if c.get("recompile_reason")]
        # dynamo gives up on a frame past its recompile limit and runs it eagerly from then on
        out["limit_hit"] = [{"function": c["function"], "where": c["where"], "step": c["step"], "reason": c["fail_reason"]}
                            | {k: c[k] for k in named if c.get(k)}
                            for c in self.compiles if c.get("fail_reason") and "limit" in c["fail_reason"]]
        per_step: dict[str, float] = {}
        for c in self.compiles:
            if c["seconds"] is not None:  # the backward's compile in the step it ran in
                back = c.get("backward_seconds") or 0.0
                step_b = c.get("backward_step", c["step"])
                per_step[str(c["step"])] = round(per_step.get(str(c["step"]), 0.0) + c["seconds"] - back, 4)
                if back:
                    per_step[str(step_b)] = round(per_step.get(str(step_b), 0.0) + back, 4)
        out["compile_seconds_per_step"] = per_step
        compiled_frames: dict[str, dict] = {}
        for c in self.compiles:
            f = compiled_frames.setdefault(c["where"], {"function": c["function"], "where": c["where"], "compiles": 0,
                                                        "compile_seconds": 0.0, "first_step": c["step"]}
                                           | {k: c[k] for k in named if c.get(k)})
            f["compiles"] += 1
            f["compile_seconds"] = round(f["compile_seconds"] + (c["seconds"] or 0.0), 4)
        out["frames"] = list(compiled_frames.values())
        out.update(self._counters())
        skips = [c["cudagraph_skip_reason"] for c in self.compiles if c.get("cudagraph_skip_reason")]
        out["cudagraphs"] = dict(self.cudagraph, requested=any(_wants_cudagraphs(c) for c in self.calls),
                                 skip_reasons=sorted(set(skips)), skips=out.pop("cudagraph_skips", len(skips)))
        if self.errors:
            out["errors"] = self.errors
        return out

    def _counters(self) -> dict:
        """dynamo's own tallies: unique graphs, graph breaks by reason (all torch 2.x versions)."""
        try:
            from torch._dynamo.utils import counters
        except Exception:
            return {}
        out = {"graphs": int(counters["stats"].get("unique_graphs", 0)),
               "frames_ok": int(counters["frames"].get("ok", 0)),
               "graph_break_reasons": {str(k)[:300]: int(v) for k, v in list(counters["graph_break"].items())[:50]},
               "cudagraph_skips": int(counters["inductor"].get("cudagraph_skips", 0))}
        if self.surface == "counters" and not self.breaks:  # old torch: reasons without a file:line
            self.breaks = {(None, r): {"where": None, "reason": r, "count": n, "steps": []}
                           for r, n in out["graph_break_reasons"].items()}
        return out


def break_site(text: str) -> tuple[str | None, str]:
    """(user file:line, reason) from a `dynamo_graph_break_reason` payload: the line dynamo names when it
    is the user's code, else the innermost user frame of the traceback the payload carries (older torch
    gives only the traceback). None when no frame of it is the user's."""
    m = _BREAK_AT.search(text)
    named = frames.Frame(m.group(1), int(m.group(2))) if m else None
    stack = [frames.Frame(f, int(n)) for f, n in _OLD_BREAK_AT.findall(text)]  # outermost first
    if named is not None and not frames.is_library(named.file):
        where = named.site
    else:
        where = frames.pick(stack, innermost_first=False).site or None
    r = _BREAK_REASON.search(text)
    reason = (r.group(1) if r else text.strip().splitlines()[0] if text.strip() else "unknown").strip()
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    # torch >= 2.6 puts the generic "Encountered graph break when attempting to trace CALL" first: the cause follows
    while len(lines) > 1 and lines[0].startswith("Encountered graph break"):
        lines = lines[1:]
    return where, (lines[0] if lines else "unknown")[:300]


def _first_line(v) -> str | None:
    """A reason's first line: recompile reasons repeat the source line and the user stack after it."""
    if not isinstance(v, str) or not v.strip():
        return None
    return re.sub(r"\s+#.*$", "", v.strip().splitlines()[0])[:300]


def _wants_cudagraphs(call: dict) -> bool:
    return "reduce-overhead" in str(call.get("mode") or "") or bool(call.get("cudagraphs_option"))


def _where(filename, line) -> str | None:
    if not filename:
        return None
    return frames.Frame(str(filename), line if isinstance(line, int) else None).site


def _num(v):
    return round(float(v), 4) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


_REC: Recorder | None = None


def install(torch, where_fn) -> None:
    """Wrap torch.compile so the first call attaches the recorder (called once, before the script runs)."""
    import functools

    original = torch.compile

    @functools.wraps(original)
    def compile_(*a, **k):
        try:
            _on_compile_call(torch, where_fn, a, k)
        except Exception:  # recording must never break the script
            pass
        return original(*a, **k)

    torch.compile = compile_


def _on_compile_call(torch, where_fn, args: tuple, kwargs: dict) -> None:
    global _REC
    if _REC is None:
        _REC = Recorder(torch, where_fn)
        _REC.attach()
    options = kwargs.get("options") or {}
    call = {"mode": kwargs.get("mode"), "backend": _name(kwargs.get("backend", "inductor")),
            "dynamic": kwargs.get("dynamic"), "fullgraph": bool(kwargs.get("fullgraph", False)),
            "step": where_fn()[0],
            "cudagraphs_option": bool(isinstance(options, dict) and options.get("triton.cudagraphs")),
            "called_at": caller()}
    target = args[0] if args else kwargs.get("model")
    if target is not None:
        call.update(_describe_target(target))
        _REC.targets[id(target)] = call
    if len(_REC.calls) < 20:
        _REC.calls.append(call)
    if _wants_cudagraphs(call):
        _REC.wrap_cudagraphs()


def _describe_target(target) -> dict:
    """What torch.compile was given: an `nn.Module`'s class and its forward's file:line, a function's name
    and file:line; the file:line only when it is the user's code."""
    import inspect

    fn = getattr(type(target), "forward", None) if hasattr(target, "parameters") else target
    name = type(target).__name__ if fn is not target else getattr(target, "__qualname__", None) or _name(target)
    out = {"target": name}
    code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
    if code is not None and not frames.is_library(code.co_filename):
        out["target_where"] = frames.Frame(code.co_filename, code.co_firstlineno).site
    return out


def _name(backend) -> str:
    return backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)


def summary() -> dict | None:
    """run.json's `compiled`, or None when the script never called torch.compile."""
    if _REC is None:
        return None
    try:
        return _REC.summary()
    except Exception as exc:
        return {"errors": [f"{type(exc).__name__}: {exc}"]}


def reset() -> None:
    """Forget what was recorded and stop listening to torch's compile log (a new capture block in the same
    process starts from nothing)."""
    global _REC
    if _REC is not None and _REC.handler is not None:
        try:
            from torch._logging._internal import trace_log

            trace_log.removeHandler(_REC.handler)
        except Exception:
            pass
    _REC = None


__all__ = ["install", "summary", "reset", "break_site", "Recorder"]

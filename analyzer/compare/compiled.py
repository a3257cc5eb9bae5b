"""The torch.compile facts two runs are compared on (run.json `compiled`): counts and sites, never
compile seconds (those differ between any two runs and say nothing alone)."""

from __future__ import annotations

from gpuadvise.analyzer.model import runfacts


def compile_facts(facts: dict) -> dict[str, object]:
    c = runfacts.compiled(facts)
    if not c:
        return {}
    out: dict[str, object] = {}
    calls = [x for x in c.get("calls") or [] if isinstance(x, dict)]
    for i, call in enumerate(calls[:4]):
        for k in ("mode", "backend", "dynamic", "fullgraph"):
            out[f"compiled.call[{i}].{k}"] = call.get(k)
    if isinstance(c.get("graphs"), int):
        out["compiled.graphs"] = c["graphs"]
    out["compiled.frames"] = len([f for f in c.get("frames") or [] if isinstance(f, dict)])
    out["compiled.recompiles"] = len([r for r in c.get("recompiles") or [] if isinstance(r, dict)])
    out["compiled.recompiles_after_warmup"] = len(runfacts.recompiles_after_warmup(facts))
    out["compiled.recompile_limit_hit"] = len([h for h in c.get("limit_hit") or [] if isinstance(h, dict)])
    breaks = runfacts.graph_break_sites(facts)
    out["compiled.graph_breaks"] = len(breaks)
    out["compiled.graph_break_sites"] = ", ".join(sorted(str(b.get("where")) for b in breaks)) or "none"
    cg = c.get("cudagraphs") if isinstance(c.get("cudagraphs"), dict) else {}
    if cg.get("requested"):
        for k in ("skips", "captures", "replays"):
            out[f"compiled.cudagraphs.{k}"] = cg.get(k)
    return out

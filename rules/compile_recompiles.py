"""compile-recompiles: torch.compile keeps recompiling after warm-up.

## What it detects
Recompilations that `gpuadvise profile` recorded (run.json `compiled.recompiles`, from dynamo's guard
failures) from the third step on, when the first steps' compiles are over, and frames that hit dynamo's
recompile limit and run eagerly from then on (`compiled.limit_hit`). Each is reported with the guard
that failed ("tensor 'x' size mismatch at index 0. expected 8, actual 10"), the compiled function's
file:line in the user's code, the steps it happened in, and how long compiling took. A module whose
frame dynamo compiles inside torch or a framework (`torch.compile(nn.Sequential(...))` goes through
torch's own wrapper; a Hugging Face model's forward lives in `transformers`) is named by its class and
its `torch.compile(...)` call, never by the library file. From a trace alone (no run.json), a recompile
is a compile span of compile id F/R with R > 0, or a compiled frame F that runs as `Torch-Compiled
Region: F/R` with R above every R of that frame in the first recorded step; the trace names neither the
guard nor the line, so the finding names the frame, and the compile spans give the seconds. It sees the
recorded steps only: recompiles before the window are run.json's to report.

## Why it matters
A guard failure throws the compiled code away for that input: dynamo traces the frame again and the
backend compiles it again, seconds each time with Inductor, inside a training step. A batch size that
changes every few steps under `dynamic=False`, a Python scalar (a learning rate, a step counter, an
`.item()` result) or a global the graph reads, each becomes a guard. After `torch._dynamo.config.
recompile_limit` (8) recompiles of one frame dynamo gives up and runs the frame eagerly: the model
silently loses the speed-up it was compiled for.

## Fix
Make the guard stop failing:
```python
torch._dynamo.mark_dynamic(batch, 0)            # this dimension may change: one dynamic graph
model = torch.compile(model, dynamic=True)      # or let every size be symbolic
# or pad / bucket the sizes to a few fixed values (drop_last=True for the last short batch)
lr = torch.tensor(0.1)                          # a changing Python number becomes a tensor input
```
A guard on a value (`___stack0 == 0.73`, `L['step'] == 12`) means a Python number changes every call:
pass it as a tensor, or keep it out of the compiled function.

## Thresholds
Recompiles from step 2 on (steps 0 and 1 compile by design: the first call, then one recompile for
grad mode or automatic dynamic shapes), at least 2 of them, or any frame past the recompile limit.
The predicted saving is the recorded compile time of those recompiles as a share of the time of the
steps from the first of them to the last step timed (run.json `steps`); with no step times it is not
predicted.
"""

from __future__ import annotations

import re
from collections import Counter

from gpuadvise.analyzer.measure.analysis import Analysis
from gpuadvise.analyzer.model import runfacts
from gpuadvise.analyzer.model.findings import Evidence
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.compiled import compiled_facts, compiled_loop

from .base import Rule

MIN_RECOMPILES = 2
NO_REASON = "the trace does not record which guard failed; TORCH_LOGS=recompiles prints it"
_SIZE = re.compile(r"size mismatch|stride mismatch|sizes|shape", re.I)
_VALUE = re.compile(r"==\s*-?[\d.]+|!=|___stack|L\['[^']+'\]\s*==", re.I)
_GLOBAL = re.compile(r"G\['|___check_obj_id|ID_MATCH|global", re.I)


class CompileRecompiles(Rule):
    code = "GA150"
    name = "compile-recompiles"
    title = "torch.compile recompiles after warm-up"
    thresholds = {"warmup_steps": runfacts.COMPILE_WARMUP_STEPS, "min_recompiles": MIN_RECOMPILES}

    def check(self, a: Analysis):
        facts = a.compile_facts
        late = runfacts.recompiles_after_warmup(facts)
        limit = runfacts.recompile_limit_hits(facts)
        if len(late) < MIN_RECOMPILES and not limit:
            return []
        reasons = Counter(_pattern(str(r.get("reason") or "the failed guard is not recorded")) for r in late)
        # the compiled function by its user-side name: its file:line, or the module and its torch.compile call
        named = Counter(runfacts.compiled_module(r) for r in late)
        sources = Counter(s for r in late + limit for s in (r.get("where"), runfacts.site(r.get("compiled_at"))) if s)
        steps = sorted({int(r["step"]) for r in late if isinstance(r.get("step"), int)})
        seconds = sum(r["seconds"] for r in late)
        saving, basis = self._saving(facts, steps, seconds, a.compile_facts_from_trace)
        example = str((late[0] if late else limit[0]).get("reason") or NO_REASON)
        where = named.most_common(1)[0][0] if named else runfacts.compiled_module(limit[0])
        message = (f"torch.compile recompiled {len(late)} time(s) after warm-up (steps {_span(steps)}), "
                   f"{seconds:.2f} s of compiling, most in {where}: \"{example}\".") if late else ""
        if limit:
            message += (f" {len(limit)} frame(s) hit dynamo's recompile limit at step "
                        f"{limit[0].get('step')} and run eagerly from then on.")
        items = [{"name": p, "count": n} for p, n in reasons.most_common(8)]
        items += [{"name": f"recompile limit: {h.get('reason')}", "count": 1, "where": h.get("where")} for h in limit[:3]]
        evidence = Evidence(steps=steps, items=items, sources=[s for s, _ in sources.most_common(5)],
                            numbers={"recompiles_after_warmup": len(late), "compile_seconds": round(seconds, 3),
                                     "limit_hit": len(limit), "first_reason": example})
        return [self.finding(message=message.strip(), evidence=evidence, saving=saving, basis=basis,
                             advice=_advice(example, where, bool(limit)),
                             severity="medium" if limit and saving < 3 else None)]

    @staticmethod
    def _saving(facts: dict, steps: list[int], seconds: float, from_trace: bool = False) -> tuple[float, str]:
        times = runfacts.step_times_ms(facts)
        if not steps or not times:
            return 0.0, "not predicted: run.json has no step times to weigh the compile time against"
        span = [ms for n, ms in times.items() if n >= steps[0]]
        total_s = sum(span) / 1e3
        if total_s <= 0:
            return 0.0, "not predicted: no timed steps after the first recompile"
        pct = 100.0 * min(seconds, total_s) / total_s
        return pct, (f"recorded compile time of the recompiles ({seconds:.2f} s) over the {len(span)} timed steps "
                     f"from step {steps[0]} on ({total_s:.2f} s, {'the trace' if from_trace else 'run.json'})")

    def positive(self) -> TraceBuilder:
        b = compiled_loop()
        sizes = [(s, 8 + 4 * i) for i, s in enumerate((2, 4, 6, 8, 10))]
        b.facts = compiled_facts([{"step": 0, "seconds": 4.0}] + [
            {"step": s, "seconds": 1.5, "recompile_reason": f"0/{i}: tensor 'x' size mismatch at index 0. expected "
                                                             f"{n - 4}, actual {n}"}
            for i, (s, n) in enumerate(sizes)])
        return b

    def negative(self) -> TraceBuilder:
        # one recompile at step 1 (grad mode / automatic dynamic) is warm-up, not a problem
        b = compiled_loop()
        b.facts = compiled_facts([{"step": 0, "seconds": 4.0},
                                  {"step": 1, "seconds": 2.0, "recompile_reason": "0/0: tensor 'x' size mismatch at "
                                                                                  "index 0. expected 8, actual 6"}])
        return b


def _pattern(reason: str) -> str:
    """A reason without its compile id and numbers: recompiles for 8, 10, 12 are one cause."""
    r = re.sub(r"^\d+/\d+:\s*", "", reason)
    return re.sub(r"-?\d+(\.\d+)?", "N", r)[:200]


def _advice(reason: str, where: str, limit: bool) -> str:
    if _SIZE.search(reason):
        advice = (f"A tensor's size changes between calls of {where} and the graph was compiled for "
                  "fixed sizes: mark that dimension dynamic (`torch._dynamo.mark_dynamic(x, 0)`), compile with "
                  "`dynamic=True`, or pad/bucket the sizes to a few values.")
    elif _GLOBAL.search(reason):
        advice = (f"{where[0].upper()}{where[1:]} reads a global or an object that changes identity between calls: pass "
                  "it as an argument, or keep it constant.")
    elif _VALUE.search(reason):
        advice = (f"A Python number {where} reads changes every call (a guard on its value): pass "
                  "it as a tensor, or keep it out of the compiled code.")
    else:
        advice = f"Find what the failing guard of {where} checks and keep it constant between calls."
    if limit:
        advice += (" Past the recompile limit dynamo runs the frame eagerly: raising "
                   "`torch._dynamo.config.recompile_limit` only hides the cause.")
    return advice


def _span(steps: list[int]) -> str:
    if not steps:
        return "?"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}–{steps[-1]}"


RULE = CompileRecompiles()

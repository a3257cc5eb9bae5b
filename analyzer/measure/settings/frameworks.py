"""The training frameworks a run used, and a rule's Fix kept to them.

A rule's Fix may carry a paragraph for a framework's own switch ("Under transformers' Trainer …", "Under
Lightning …", "With Hugging Face Accelerate …"): it is that framework's user's, and noise in the fix of a
plain script. `for_frameworks(fix, used(a))` keeps such a paragraph only where the run used its framework:
run.json's `framework` (the loop `gpuadvise profile` saw run), or what the trace shows of it (Lightning's
profiler marks `[pl][…]`, the framework's own files among the Python frames of a trace with stacks).
A paragraph is the prose between blank lines, code blocks and the fix's ends; the engine applies this to
every finding (run/single.py) as it leaves out what the input shows on (switches_on.without_what_is_on).
"""

from __future__ import annotations

import re

from gpuadvise.analyzer.model import runfacts

# a paragraph that opens on a framework: its first words name it
LEAD = re.compile(r"^(?:Under|With|In) (?:(?P<transformers>transformers' Trainer)|(?P<lightning>Lightning)|"
                  r"(?:Hugging Face )?(?P<accelerate>Accelerate))\b")
# what the trace shows of each: annotation names (Lightning's profiler), the framework's files in Python frames
ANNOTATIONS = {"lightning": re.compile(r"^\[pl\]\[|\[LightningModule\]|\[Strategy\]")}
FILES = {"transformers": re.compile(r"transformers[/\\]trainer\.py"),
         "lightning": re.compile(r"(?:pytorch_lightning|lightning[/\\]pytorch)[/\\]"),
         "accelerate": re.compile(r"accelerate[/\\]accelerator\.py")}


def used(a) -> set[str]:
    """The frameworks the run used: run.json's, and those the trace shows."""
    out = set()
    fw = runfacts.framework(getattr(a, "facts", None) or {})
    if fw is not None:
        out.add(fw.name)
    model = getattr(a, "model", None)
    if model is not None:
        names = _names(model.cpu[model.cpu["is_annotation"].astype(bool)]) if len(model.cpu) else []
        out |= {k for k, rx in ANNOTATIONS.items() if any(rx.search(n) for n in names)}
        frames = _names(model.python) if len(model.python) else []
        out |= {k for k, rx in FILES.items() if any(rx.search(n) for n in frames)}
    return out


def _names(frame) -> list[str]:
    return [str(n) for n in frame["name"].unique()]


def about_a_framework(fix: str) -> bool:
    return any(LEAD.match(p) for p in _paragraph_starts(fix))


def for_frameworks(fix: str, used_ones: set[str]) -> str:
    """`fix` without its paragraphs for frameworks the run did not use."""
    if not about_a_framework(fix):
        return fix
    lines = fix.split("\n")
    keep = [True] * len(lines)
    code = False
    start = None
    for i, line in enumerate(lines + ["```"]):  # a closing fence ends the last paragraph
        fence = line.strip().startswith("```")
        prose = not code and not fence and line.strip() != ""
        if prose and start is None:
            start = i
        if not prose and start is not None:
            m = LEAD.match(lines[start])
            if m and m.lastgroup not in used_ones:
                keep[start:i] = [False] * (i - start)
            start = None
        if fence:
            code = not code
    text = "\n".join(line for line, k in zip(lines, keep) if k)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _paragraph_starts(fix: str) -> list[str]:
    out, code, prev_prose = [], False, False
    for line in fix.split("\n"):
        if line.strip().startswith("```"):
            code, prev_prose = not code, False
            continue
        prose = not code and line.strip() != ""
        if prose and not prev_prose:
            out.append(line)
        prev_prose = prose
    return out

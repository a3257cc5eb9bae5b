"""Evidence in people's words: the one place that turns a finding's evidence keys and values into the
labels and units a person reads ("DataLoader share: 62.5 %", "single-process loader: yes", "outlier
steps: none"). Every renderer (text, markdown, HTML, the TUI's finding pane) draws evidence through it;
the JSON keeps the keys and values as they are.

How a key becomes a label:

1. `LABELS`: keys whose words need more than the rules below (an acronym, a unit a suffix cannot tell).
2. Otherwise the unit is the key's last unit word (`UNITS`: `pct` → %, `ms` → ms, `gib` → GiB,
   `gbps` → GB/s, …; `_pct_of_step` → "% of step", `_ms_per_step` → "ms per step"), and the rest of
   the key is its label, underscores as spaces, with the words of `WORDS` spelled as people spell them
   (gpu → GPU, dataloader → DataLoader, ooms → OOMs).

How a value is written: numbers to three significant figures with their unit, yes/no for booleans,
"–" for None (not measured, or not applicable), "none" for an empty list or table, a list as its items joined by commas (step
numbers as #3, #4), a table (dict) as "label value" pairs, a list of tables one per "; "-separated part.
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real
from typing import Callable, NamedTuple

# key → (label, unit): where a suffix cannot tell, or the words need care
LABELS: dict[str, tuple[str, str]] = {
    "single_process": ("single-process loader", ""),
    "dataloader_share_pct": ("DataLoader share", "%"),
    "dataloader_pct": ("DataLoader share", "%"),
    "bytes": ("bytes copied", "bytes"),
    "gpu": ("GPU", ""),
    "device_row": ("device", ""),
    "ms": ("time", "ms"),
    "seconds": ("time", "s"),
    "mib": ("size", "MiB"),
    "GB/s": ("GB/s", ""),
    "MiB": ("MiB", ""),
    "statistic": ("statistic", ""),
    "copy_src": ("copied from", ""),
    "recorded_settings": ("settings recorded", ""),
    "settings_read_at": ("settings read at", ""),
    "cudnn_benchmark": ("cudnn.benchmark", ""),
    "param_devices": ("parameters by device", ""),
    "speedups": ("speed-up by fix", "×"),
    "at_ms": ("at", "ms"),
    "first_reason": ("first reason", ""),
    "first_where": ("first at", ""),
    "explained_by": ("explained by", ""),
}

# a word of a key that is a unit: the last one in the key is its unit ("blocked_ms_per_step": ms per step)
UNITS: dict[str, str] = {
    "pct": "%", "ms": "ms", "us": "µs", "ns": "ns", "seconds": "s", "gib": "GiB", "mib": "MiB", "mb": "MB",
    "kb": "KB", "bytes": "bytes", "gbps": "GB/s", "tflops": "TFLOP/s", "mhz": "MHz", "watts": "W",
}
# units only as a key's last word (elsewhere they are words: "x" in "max_x", "c" in "c_api")
LAST_UNITS: dict[str, str] = {"x": "×", "w": "W", "c": "°C"}

# words spelled as people spell them
WORDS: dict[str, str] = {
    "gpu": "GPU", "cpu": "CPU", "dataloader": "DataLoader", "oom": "OOM", "ooms": "OOMs", "nan": "NaN",
    "ddp": "DDP", "fsdp": "FSDP", "cudnn": "cuDNN", "tf32": "TF32", "bf16": "bf16", "fp16": "fp16",
    "simt": "SIMT", "sm": "SM", "nvml": "NVML", "allreduce": "all-reduce", "allreduces": "all-reduces",
    "allgather": "all-gather", "allgathers": "all-gathers", "kb": "KB", "mb": "MB", "gib": "GiB",
    "mib": "MiB", "gbps": "GB/s", "tflops": "TFLOP/s", "ms": "ms", "us": "µs", "pct": "%",
    "id": "ID", "hta": "HTA", "params": "parameters", "io": "I/O", "h2d": "host-to-device", "d2h": "device-to-host", "cuda": "CUDA",
}

_STEP_LISTS = re.compile(r"(^|_)steps(_|$)|^step$|(?<!_per)_step$")  # `…_per_step`: counts, not steps
_LEADS = ("what", "name", "remedy", "rule", "topic")  # a table's entry that names it: written first


def words(key: str) -> str:
    """A snake_case name in words: underscores as spaces, acronyms and units spelled out."""
    return " ".join(WORDS.get(w.lower(), w) for w in str(key).replace("_", " ").split())


def label_and_unit(key: str) -> tuple[str, str]:
    """("DataLoader share", "%") for `dataloader_share_pct`, ("blocked", "ms per step") for
    `blocked_ms_per_step`, ("conv", "% of step") for `conv_pct_of_step`, ("allocator in iterations", "ms")
    for `allocator_ms_in_iterations`; ("", "ms per step") for a bare unit such as `ms_per_step`."""
    key = str(key)
    if key in LABELS:
        return LABELS[key]
    tokens = key.split("_")
    at = next((i for i in range(len(tokens) - 1, -1, -1) if tokens[i].lower() in UNITS), None)
    if at is None and len(tokens) > 1 and tokens[-1].lower() in LAST_UNITS:
        return words("_".join(tokens[:-1])), LAST_UNITS[tokens[-1].lower()]
    if at is None:
        return words(key), ""
    unit, before, after = UNITS[tokens[at].lower()], tokens[:at], tokens[at + 1:]
    if after and after[0].lower() in ("per", "of"):
        return words(" ".join(before)), f"{unit} {words(' '.join(after))}"
    return words(" ".join(before + after)), unit


def number(v) -> str:
    """A number as people write it: integers whole, others to three significant figures. From five digits
    on, the digits are grouped in threes by a space (a comma would read as a list's separator): "2304",
    "46 254", whether the value came as an integer or a float."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, Integral):
        return _grouped(int(v))
    v = float(v)
    if math.isnan(v):
        return "not measured"
    if math.isinf(v):
        return "unbounded"
    if v == int(v) and abs(v) < 1e15:
        return _grouped(int(v))
    if abs(v) >= 999.5:  # three significant figures would be written "1e+03"
        return _grouped(round(v))
    if abs(v) < 0.001:
        return f"{v:.2g}"  # a chance of 1e-12 is not 0
    return f"{v:.3g}"


def _grouped(n: int) -> str:
    return str(n) if abs(n) < 10_000 else f"{n:,}".replace(",", " ")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{number(n / size)} {unit}"
    return f"{number(n)} bytes"


def _with_unit(text: str, unit: str) -> str:
    if not unit:
        return text
    return f"{text}{unit}" if unit == "×" else f"{text} {unit}"


class Style(NamedTuple):
    """How text reaches the output: `words` for labels and prose values (markdown escapes them), `code`
    for names from the trace or the code (`literal`: an op, a file:line)."""

    words: Callable[[str], str] = str
    code: Callable[[str], str] = str


PLAIN = Style()


def value(v, unit: str = "", key: str = "", style: Style = PLAIN) -> str:
    """A value in words with its unit (see the module docstring)."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, Real):
        if unit == "bytes":
            return _bytes(float(v))
        return _with_unit(number(v), unit)
    if isinstance(v, str):
        return (style.code(v) if literal(v) else style.words(v)) if v.strip() else "none"
    if isinstance(v, dict):
        if not v:
            return "none"
        return ", ".join(_pair(k, x, unit, key, style) for k, x in v.items())
    if isinstance(v, (list, tuple, set, frozenset)):
        v = list(v)
        if not v:
            return "none"
        if all(isinstance(x, dict) for x in v):
            return "; ".join(_entry(x, unit, style) for x in v)
        if len(v) == 2 and "range" in key and all(isinstance(x, Real) and not isinstance(x, bool) for x in v):
            return _with_unit(f"{number(v[0])}–{number(v[1])}", unit)
        if key and _STEP_LISTS.search(key) and all(isinstance(x, Integral) and not isinstance(x, bool) for x in v):
            return ", ".join(f"#{int(x)}" for x in v)
        if unit and all(isinstance(x, Real) and not isinstance(x, bool) for x in v):
            return ", ".join(number(x) for x in v) + ("" if unit == "×" else " ") + unit
        return ", ".join(value(x, style=style) for x in v)
    return style.words(str(v))


def _pair(k, x, outer_unit: str, outer_key: str = "", style: Style = PLAIN) -> str:
    """One entry of a table: its own key's label and unit, else the table's unit ({"bf16": 91.2} under a
    `_pct` key is "bf16 91.2 %"; {"bf16": [85.6, 91.2]} under `saving_range_pct` "bf16 85.6–91.2 %")."""
    label, unit = label_and_unit(k)
    if not unit and not isinstance(x, (bool, str)):
        unit = outer_unit
    text = value(x, unit, f"{outer_key}_{k}" if "range" in outer_key else str(k), style)
    return f"{style.words(label)} {text}" if label else text


def _entry(d: dict, unit: str, style: Style = PLAIN) -> str:
    """One entry of a list of tables: its name first ("kernel launch calls: 0.01 ms per step, …")."""
    lead = next((k for k in _LEADS if isinstance(d.get(k), str) and d[k].strip()), None)
    rest = ", ".join(_pair(k, x, unit, style=style) for k, x in d.items() if k != lead)
    if lead is None:
        return rest or "none"
    name = value(d[lead], style=style)
    return f"{name}: {rest}" if rest else name


_LITERAL = re.compile(r"[_=`{}\[\]\\]|::|[A-Za-z]\.[A-Za-z]|\.py\b|/\w")


def literal(v) -> bool:
    """A string value that is a name or text from the trace or the code (an op, a file:line, a compiler's
    reason), to be shown as code rather than read as words."""
    return isinstance(v, str) and bool(_LITERAL.search(v))


def named(key: str, v, style: Style = PLAIN) -> tuple[str, str]:
    """One named number of a finding's evidence: (label, value with unit), both in `style`."""
    label, unit = label_and_unit(key)
    return style.words(label), value(v, unit, key, style)


def column(key: str) -> str:
    """A column of a finding's offenders table: its label, with the unit in brackets."""
    label, unit = label_and_unit(key)
    return f"{label} ({unit})" if unit else label


def cell(key: str, v) -> str:
    """A cell of that table: the value in words, its unit in the column heading."""
    _, unit = label_and_unit(key)
    if unit == "bytes" and isinstance(v, Real) and not isinstance(v, bool):
        return _bytes(float(v))
    if isinstance(v, Real) and not isinstance(v, bool):
        return number(v)
    if v is None or (isinstance(v, str) and not v.strip()):
        return "–"
    return value(v, "", key)


def where(steps: list, ranges_ms: list, range_steps: list, limit: int = 6) -> list[str]:
    """The time ranges in step order, each beside its step: ["step 3: 1.01–528.97 ms", …]; the ranges no
    step holds (or all, when the steps are not known) after them, in their own order."""
    shown = list(ranges_ms[:limit])
    placed = list(range_steps[: len(shown)]) if len(range_steps) >= len(shown) else [None] * len(shown)
    by_step: dict[int, list[tuple[float, float]]] = {}
    loose = []
    for r, s in zip(shown, placed):
        if s is None:
            loose.append(r)
        else:
            by_step.setdefault(int(s), []).append(r)
    out = [f"step {s}: " + ", ".join(_span(r) for r in sorted(rs)) for s, rs in sorted(by_step.items())]
    if loose:
        out.append(("outside the steps: " if by_step else "") + ", ".join(_span(r) for r in loose))
    return out


def _span(r) -> str:
    a, b = r
    return f"{a:.2f}–{b:.2f} ms"

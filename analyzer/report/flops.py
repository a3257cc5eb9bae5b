"""The words every output uses for a trace's FLOPs and MFU (`model.report.FlopFigures`): the header's
line, what qualifies it, and the arithmetic as a table. The text and markdown (so HTML) reports, the TUI's
overview and `compare` read them, so each says the same thing."""

from __future__ import annotations

from gpuadvise.analyzer.model.report import FlopFigures, flop_text, ms_text

PHASE_WORDS = {"forward": "forward", "backward": "backward", "recompute": "recomputed forward"}
FAMILY_WORDS = {"matmul": "matmuls", "conv": "convolutions", "attention": "attention"}


def headline(f: FlopFigures | None) -> str | None:
    """One line: MFU with its denominator, or the FLOPs and rate where there is no peak, or what is missing."""
    if f is None:
        return None
    if f.state != "counted" or f.model_flops is None:
        return f.note
    rate = flop_text(f.achieved_tflops * 1e12, "FLOP/s") if f.achieved_tflops is not None else "–"
    per_step = f"{flop_text(f.model_flops)} per step / {ms_text(f.step_ms)} ms = {rate}"
    if f.mfu_pct is None:
        return f"FLOPs: {per_step}. {f.note}" if f.note else f"FLOPs: {per_step}"
    hfu = f" (HFU {f.hfu_pct:.1f} %)" if f.hfu_pct is not None and f.hfu_pct > f.mfu_pct + 0.05 else ""
    gpus = f"{f.gpus} × " if f.gpus > 1 else ""
    at_least = "≥ " if partial(f) else ""  # matrix kernels without a count: a lower bound (qualifiers say why)
    line = (f"MFU {at_least}{f.mfu_pct:.1f} %{hfu}: {per_step} of {f.peak_tflops:g} TFLOP/s "
            f"({gpus}{f.device}, {dense(f)})")
    if f.unprofiled_mfu_pct is not None:
        line += f"; {f.unprofiled_mfu_pct:.1f} % over the unprofiled {ms_text(f.unprofiled_step_ms)} ms step"
    return line


def labelled(f: FlopFigures | None) -> tuple[str, str] | None:
    """The headline as a label and its value, for a header's "label: value" line: ("MFU", "41.2 %: …"),
    ("FLOPs", "…") where there is no peak, ("MFU", "none: …what is missing") without shapes."""
    line = headline(f)
    if not line:
        return None
    if f.state == "counted" and f.mfu_pct is not None:
        return "MFU", line.removeprefix("MFU ")
    if f.state == "counted":
        return "FLOPs", line.removeprefix("FLOPs: ")
    return "MFU", "none: " + line.removeprefix("No MFU: ")


def partial(f: FlopFigures) -> bool:
    """Whether matrix kernels ran without a count: the FLOPs, and so the MFU, are a lower bound."""
    return f.coverage_pct is not None and f.coverage_pct < 99.5


def dense(f: FlopFigures) -> str:
    """The dense peaks the FLOPs are measured against: "dense bf16", or "dense bf16 989.4 for 97 %, …"."""
    if len(f.peaks) == 1:
        p = f.peaks[0]
        return f"dense {p.dtype}" + (f", at its {p.stand_in} peak" if p.stand_in else "")
    return "dense " + ", ".join(f"{p.dtype} {p.tflops:g} for " + (f"{p.share_pct:.0f} %" if p.share_pct >= 0.5 else "<1 %")
                                + (f" (its {p.stand_in} peak)" if p.stand_in else "") for p in f.peaks)


def qualifiers(f: FlopFigures | None) -> list[str]:
    """What the reader needs to trust the headline: how much of the matrix work it counts, how causal
    attention is counted, notes."""
    if f is None or f.state != "counted":
        return []
    out = []
    if partial(f):
        names = ", ".join(_short(n) for n in f.uncounted[:2])
        out.append(f"FLOPs counted for {f.coverage_pct:.0f} % of the matrix kernels' time: the rest ({names}) has no "
                   "count (its op's shapes or scalar arguments were not recorded, or its launch came before the "
                   "trace began), so the MFU is a lower bound.")
    if f.whole_model_flops is not None:
        whole = f" (MFU {f.whole_mfu_pct:.1f} %)" if f.whole_mfu_pct is not None else ""
        out.append("Causal attention is counted as its kernels run it (the masked half skipped); nanoGPT's "
                   f"6·N + 12·L·H·Q·T and FlopCounterMode count the whole mask: {flop_text(f.whole_model_flops)} "
                   f"model FLOPs per step that way{whole}.")
    if f.hardware_flops is not None and f.model_flops is not None and f.hardware_flops > f.model_flops * 1.0005:
        checkpointed = sum(c.flops for c in f.classes if c.phase == "recompute")
        scores = f.hardware_flops - f.model_flops - checkpointed
        parts = ([f"{flop_text(checkpointed)} of forward ops run again in the backward (activation checkpointing)"]
                 if checkpointed > 0.0005 * f.hardware_flops else [])
        parts += ([f"{flop_text(scores)} of attention scores the fused backward computes again"]
                  if scores > 0.0005 * f.hardware_flops else [])
        hfu = f" (HFU {f.hfu_pct:.1f} %)" if f.hfu_pct is not None else ""
        out.append(f"Hardware FLOPs {flop_text(f.hardware_flops)} per step{hfu}: the model's and "
                   + " and ".join(parts) + ".")
    if f.note and f.mfu_pct is not None:
        out.append(f.note)
    return out


def table(f: FlopFigures | None) -> list[list[str]]:
    """The arithmetic, one row per op family and pass: FLOPs per step, ops, the dtype (peak), kernel time
    and what the kernels reached."""
    if f is None or f.state != "counted":
        return []
    peaks = {p.dtype: p.tflops for p in f.peaks}
    rows = []
    for c in f.classes:
        peak = peaks.get(c.dtype)
        reached = f"{c.tflops:.3g}" if c.tflops is not None else "–"
        of_peak = f"{100 * c.tflops / peak:.0f} %" if c.tflops is not None and peak else "–"
        hardware = flop_text(c.flops) if c.flops > c.model_flops * 1.0005 else "="
        rows.append([f"{FAMILY_WORDS.get(c.family, c.family)}, {PHASE_WORDS.get(c.phase, c.phase)}",
                     f"{c.ops:.0f}", c.dtype + (f" ({peak:g})" if peak else ""), flop_text(c.model_flops), hardware,
                     f"{c.kernel_ms:.3g}" if c.kernel_ms is not None else "–", reached, of_peak])
    return rows


TABLE_HEADER = ["Ops", "Per step", "Dtype (peak TFLOP/s)", "Model FLOPs per step", "Hardware FLOPs", "Kernel ms",
                "TFLOP/s reached", "Of peak"]


def per_step(f: FlopFigures | None) -> str | None:
    """Each step's MFU (or rate), in one line."""
    if f is None or f.state != "counted" or len(f.steps) < 2:
        return None
    if f.mfu_pct is not None:
        return "MFU per step: " + ", ".join(f"#{s.step} {s.mfu_pct:.1f} %" for s in f.steps if s.mfu_pct is not None)
    return "Per step: " + ", ".join(f"#{s.step} {flop_text(s.model_flops / (s.ms / 1e3), 'FLOP/s')}"
                                    for s in f.steps if s.ms > 0)


def job_line(figures) -> str | None:
    """A job's MFU (`model.summary.RunFigures`: every rank's model FLOPs over the slowest rank's step and
    their peaks), for two or more ranks; None where it has none."""
    if figures.mfu_pct is None or not figures.mfu_basis:
        return None
    hfu = f" (HFU {figures.hfu_pct:.1f} %)" if figures.hfu_pct is not None and figures.hfu_pct > figures.mfu_pct + 0.05 else ""
    return f"job MFU {figures.mfu_pct:.1f} %{hfu}: {figures.mfu_basis}"


def _short(name: str, width: int = 48) -> str:
    name = name.split("(", 1)[0]
    return name if len(name) <= width else name[: width - 1] + "…"

"""The attention and recompute rules on real training loops recorded on this CPU with plain torch.profiler
(tests/probes/transformer_loops.py): attention written by hand and SDPA forced to its math backend are
reported, SDPA on its fused CPU kernel is not, nor SDPA with dropout (math is the CPU's only backend for it); every block checkpointed shows a recompute whose share of
the step agrees with a hand count, the same model without checkpointing shows none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuadvise.analyzer.measure.efficiency import recompute
from gpuadvise.analyzer.read.loader import load_trace
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.rules.unfused_attention import RULE as ATTENTION
from gpuadvise.rules.unneeded_recompute import RULE as RECOMPUTE

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probes" / "transformer_loops.py"
CASES = ("hand", "math", "fused", "dropout", "hand_dropout", "plain", "checkpointed")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Each loop's model and its report by the two rules, recorded in one Python."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("transformer_loops")
    proc = subprocess.run([sys.executable, str(PROBE), str(out)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    found = {}
    for case in CASES:
        model = load_trace(out / f"{case}.json", cache=False)
        found[case] = (model, analyze_model(model, rules=[ATTENTION, RECOMPUTE]))
    return found


def _finding(report, topic):
    return next((f for f in report.findings if f.topic == topic), None)


def test_attention_written_by_hand_is_reported_at_its_line(recorded):
    f = _finding(recorded["hand"][1], "unfused-attention")
    assert f is not None
    assert "written out by hand" in f.message
    n = f.evidence.numbers
    # B=4 × H=4 heads, T=256, head dim 64/4 = 16, fp32: the probe's shapes
    assert (n["batch_heads"], n["q_len"], n["k_len"], n["head_dim"], n["dtype"]) == (16, 256, 256, 16, "fp32")
    assert n["unfused_calls_per_step"] == 2  # one per block
    assert any(s.startswith("transformer_loops.py(") for s in f.evidence.sources)
    assert "scaled_dot_product_attention(q, k, v, is_causal=True)" in f.advice + f.fix
    assert 0 < f.impact.est_step_saving_pct <= n["attention_share_pct_of_step"]


def test_sdpa_forced_to_math_is_reported_with_why(recorded):
    f = _finding(recorded["math"][1], "unfused-attention")
    assert f is not None
    assert "math fallback" in f.message
    assert "sdpa_kernel(SDPBackend.MATH)" in f.message  # nothing in the trace rules the fused kernels out
    assert f.evidence.numbers["paths"] == {"math": 6}  # 2 blocks × 3 recorded steps


def test_sdpa_on_its_fused_kernel_is_quiet(recorded):
    assert _finding(recorded["fused"][1], "unfused-attention") is None


def test_attention_with_dropout_on_a_cpu_is_not_reported(recorded):
    """The CPU's flash kernel takes no dropout: an SDPA call with dropout runs math whatever is set, and
    attention written by hand with dropout would run the same math as an SDPA call: nothing to advise."""
    model = recorded["dropout"][0]
    assert (model.cpu["name"] == "aten::_scaled_dot_product_attention_math").any()  # what the CPU ran
    assert _finding(recorded["dropout"][1], "unfused-attention") is None
    assert _finding(recorded["hand_dropout"][1], "unfused-attention") is None


def _hand_count(model, metrics) -> np.ndarray:
    """The recompute's time per step, counted by hand: each block's forward is annotated `block`,
    `loss.backward()` `backward`; checkpointing runs the block's forward a second time inside the
    backward, so the `block` spans that lie inside a step's `backward` span are its recompute."""
    cpu = model.cpu
    names = cpu["name"].astype(str)
    blocks, backward = cpu[names == "block"], cpu[names == "backward"]
    per_step = []
    for st in metrics.steps:
        bw = backward[(backward["ts"] >= st.start) & (backward["ts"] < st.end)]
        inside = blocks[(blocks["ts"] >= bw["ts"].min()) & (blocks["end"] <= bw["end"].max())]
        assert len(inside) == 2  # the two blocks, each once
        per_step.append(float(inside["dur"].sum()))
    return np.array(per_step)


def test_recompute_share_agrees_with_a_hand_count(recorded):
    """Step by step, the recompute's share of the step agrees with the hand count within 10 % (the same
    executions measured twice: compared step by step, since a shared CPU makes one step's recompute take
    five times another's)."""
    model, report = recorded["checkpointed"]
    metrics = report.metrics
    rc = recompute.find(model, metrics.launches)
    assert rc is not None and rc.segments == 2 * len(metrics.steps)
    found = recompute.per_step(rc, metrics)["cpu_us"]
    hand = _hand_count(model, metrics)
    shares = found / metrics.per_step["dur_us"].to_numpy(), hand / metrics.per_step["dur_us"].to_numpy()
    assert np.median(shares[0] / shares[1]) == pytest.approx(1.0, abs=0.10)
    assert recompute.find(recorded["plain"][0], recorded["plain"][1].metrics.launches) is None


def test_recompute_finding_says_what_it_costs_and_what_is_unknown(recorded):
    f = _finding(recorded["checkpointed"][1], "unneeded-recompute")
    assert f is not None and f.severity == "info"  # a CPU run: the memory left is not recorded
    n = f.evidence.numbers
    assert n["segments_per_step"] == 2
    assert n["activations_measured_by"] == "memory events"  # the probe records profile_memory=True
    assert f.impact.est_step_saving_pct == pytest.approx(n["recompute_share_pct_of_step"], abs=0.2)
    assert "not known" in f.message
    assert _finding(recorded["plain"][1], "unneeded-recompute") is None

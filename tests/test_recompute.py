"""Activation checkpointing's recompute found in a trace (analyzer/measure/efficiency/recompute.py), on fixtures whose
truth is known: a GPT-style loop with and without every layer checkpointed, and a double backward
(create_graph=True) that records ops with grad mode on inside the backward without recomputing anything."""

from __future__ import annotations

import numpy as np
import pytest

from gpuadvise.analyzer.measure.basics import perstep
from gpuadvise.analyzer.measure.efficiency import recompute
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.fixtures.transformer import GEMM_BF16, Shape, training_loop

FORWARD_OPS_PER_LAYER = 10  # layer norm, linear, attention, linear, add, layer norm, linear, gelu, linear, add


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    from gpuadvise.analyzer.read.loader import load_trace

    out = {}
    for name, kw in {"plain": {}, "checkpointed": {"checkpoint": True}}.items():
        path = training_loop(shape=Shape(layers=3), **kw).write(tmp_path_factory.mktemp(name) / "trace.json")
        model = load_trace(path, cache=False)
        out[name] = (model, compute(model))
    return out


def test_no_checkpointing_means_no_recompute(loops):
    model, metrics = loops["plain"]
    assert recompute.find(model, metrics.launches) is None


def test_every_layer_forward_is_found_again_in_the_backward(loops):
    model, metrics = loops["checkpointed"]
    rc = recompute.find(model, metrics.launches)
    steps = len(metrics.steps)
    assert len(rc.ops) == steps * 3 * FORWARD_OPS_PER_LAYER
    assert rc.segments == steps * 3  # one backward node re-ran each layer
    per = recompute.per_step(rc, metrics)
    assert perstep.median(per["ops"]) == 3 * FORWARD_OPS_PER_LAYER
    # the recompute's GPU time is what checkpointing added to the GPU-bound step
    plain = loops["plain"][1].median_step_us
    added = metrics.median_step_us - plain
    assert perstep.median(per["gpu_us"]) == pytest.approx(added, rel=0.02)


def test_inner_ops_of_a_recomputed_op_are_recomputed_too(loops):
    model, metrics = loops["checkpointed"]
    rc = recompute.find(model)
    cpu = model.cpu
    addmm = cpu[cpu["name"] == "aten::addmm"]
    inside = rc.contains(addmm["external_id"])
    # per step: 3 layers × 4 linears in the forward, and again in the recompute
    assert inside.sum() == addmm.shape[0] // 2
    assert set(rc.rows) >= set(np.flatnonzero(cpu["name"].astype(str).eq("aten::addmm").to_numpy())[inside])
    assert rc.kernels is None  # launches not asked for


def test_a_double_backward_is_not_a_recompute(tmp_path):
    """create_graph=True: the backward's own formula ops carry sequence numbers, and are no forward."""
    from gpuadvise.analyzer.read.loader import load_trace

    b = TraceBuilder()
    seq = iter(range(10, 1000))
    for _ in range(3):
        with b.step():
            fwd = []
            for _ in range(4):
                with b.op("aten::linear", **{"Sequence number": next(seq)}):
                    with b.op("aten::addmm"):
                        b.kernel(GEMM_BF16, 100)
                fwd.append(("AddmmBackward0", next(seq)))
                with b.op("aten::gelu", **{"Sequence number": fwd[-1][1]}):
                    b.kernel("gelu", 20)
            for _name, s in fwd[::-1]:
                with b.op("autograd::engine::evaluate_function: GeluBackward0", **{"Sequence number": s}):
                    with b.op("aten::gelu_backward", **{"Sequence number": next(seq)}):
                        b.kernel("gelu_backward", 30)
                with b.op("autograd::engine::evaluate_function: AddmmBackward0", **{"Sequence number": s}):
                    for _ in range(2):
                        with b.op("aten::mm", **{"Sequence number": next(seq)}):
                            b.kernel(GEMM_BF16, 100)
                        with b.op("aten::t", **{"Sequence number": next(seq)}):
                            pass
            b.sync()
    b.finish()
    model = load_trace(b.write(tmp_path / "double.json"), cache=False)
    assert recompute.find(model) is None


# -- the rule: unneeded-recompute ---------------------------------------------------------------------------

def _recompute_finding(tmp_path, name, facts=None, **kw):
    from gpuadvise.analyzer.read.loader import load_trace
    from gpuadvise.analyzer.run.single import analyze_model
    from gpuadvise.rules.unneeded_recompute import RULE

    model = load_trace(training_loop(checkpoint=True, shape=Shape(layers=4), **kw).write(tmp_path / f"{name}.json"),
                       cache=False)
    found = [f for f in analyze_model(model, facts=facts, rules=[RULE]).findings]
    assert len(found) <= 1
    return found[0] if found else None


def test_room_for_every_segment_means_no_checkpointing(tmp_path):
    f = _recompute_finding(tmp_path, "room", memory_gib=30)
    n = f.evidence.numbers
    assert n["segments_kept"] == n["segments_per_step"] == 4
    assert "Stop checkpointing" in f.advice
    # the saving is the replay without the whole recompute: most of what it costs a GPU-bound step
    assert 0.8 * n["recompute_share_pct_of_step"] <= f.impact.est_step_saving_pct <= n["recompute_share_pct_of_step"] + 0.5


def test_room_for_some_segments_means_fewer_checkpointed_layers(tmp_path):
    """72 GiB is 90 % of the 80 GiB device. A layer's recompute saves, by the recorded shapes, the inputs of
    its four linears (3 of [B, T, C] and one of [B, T, 4C]) and attention's q, k, v and output: 11 tensors
    of B·T·C bf16, 22·s·b·h bytes, scaled to a whole layer's 34·s·b·h: 0.27 GiB. A peak of 71.4 GiB (the
    fixture's reserved memory: memory_gib + 2) leaves room for two of the four."""
    s = Shape(layers=4)
    per_layer = 34 * s.tokens * s.width
    assert 2 * per_layer < (72 - 71.4) * 2**30 < 3 * per_layer
    full = _recompute_finding(tmp_path, "room", memory_gib=30)
    f = _recompute_finding(tmp_path, "some", memory_gib=69.4)
    assert f.evidence.numbers["segments_kept"] == 2
    assert "Checkpoint 2 of them" in f.advice
    assert f.impact.est_step_saving_pct == pytest.approx(full.impact.est_step_saving_pct / 2, rel=0.15)


def test_quiet_where_memory_is_tight(tmp_path):
    assert _recompute_finding(tmp_path, "tight", memory_gib=71.9) is None


def test_unknown_memory_is_said_not_guessed(tmp_path):
    f = _recompute_finding(tmp_path, "unknown")
    assert f.severity == "info" and "not known" in f.message
    assert "no memory peak" in f.message
    assert f.evidence.numbers["segments_kept"] is None


def test_a_hugging_face_run_is_told_gradient_checkpointing_disable(tmp_path):
    facts = {"framework": {"name": "transformers", "settings": {"gradient_checkpointing": True}}}
    f = _recompute_finding(tmp_path, "hf", facts=facts, memory_gib=30)
    assert f.message.startswith("Gradient checkpointing (Hugging Face)")
    assert "gradient_checkpointing_disable()" in f.advice

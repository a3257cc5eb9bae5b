"""Activation checkpointing's recompute found in a trace (analyzer/measure/recompute.py), on fixtures whose
truth is known: a GPT-style loop with and without every layer checkpointed, and a double backward
(create_graph=True) that records ops with grad mode on inside the backward without recomputing anything."""

from __future__ import annotations

import numpy as np
import pytest

from gpuadvise.analyzer.measure import perstep, recompute
from gpuadvise.analyzer.measure.metrics import compute
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

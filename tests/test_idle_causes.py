"""low-gpu-utilization's account of the idle time: what the CPU was doing while the GPU sat idle, each
cause's time per step and its share of the idle time from the same statistic (the median step, so one
step's stall is not reported as the typical step's share), and the steps counted in words."""

from __future__ import annotations

from gpuadvise.analyzer.measure.basics.idle import OUTSIDE_OPS, explain_idle
from gpuadvise.analyzer.measure.basics.metrics import compute
from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import find_rule

GEMM = "ampere_sgemm_128x64_nn"


def _loop(stall_in: int | None) -> TraceBuilder:
    """Five steps of 2 ms of Python before five short kernels; in step `stall_in`, a 50 ms CPU op too."""
    b = TraceBuilder()
    for i in range(5):
        with b.step():
            b.idle(2_000)
            if i == stall_in:
                b.cpu("aten::slow_host_op", 50_000)
            for _ in range(5):
                b.kernel(GEMM, 100)
            b.sync()
    b.finish()
    return b


def test_a_cause_in_one_step_has_no_share_of_the_median_step(load_built):
    model = load_built(_loop(stall_in=2))
    causes = explain_idle(model, compute(model)).set_index("what")
    python = causes.loc[OUTSIDE_OPS]
    assert 1.9 <= python["ms_per_step"] <= 2.1 and python["share_of_idle_pct"] >= 80
    # 50 ms in one step of five: the median step has none of it, so neither its time nor its share show
    slow = causes.loc["aten::slow_host_op"]
    assert slow["ms_per_step"] == 0 and slow["share_of_idle_pct"] == 0
    report = analyze_model(model, None, rules=[find_rule("low-gpu-utilization")])
    (f,) = [f for f in report.findings if f.topic == "low-gpu-utilization"]
    assert "(median per step; share of that step's idle time)" in f.message and "slow_host_op" not in f.message


def test_every_cause_share_is_its_time_over_the_median_step_idle_time(load_built):
    model = load_built(_loop(stall_in=None))
    causes = explain_idle(model, compute(model))
    assert list(causes["ms_per_step"]) == sorted(causes["ms_per_step"], reverse=True)
    ratio = causes["share_of_idle_pct"] / causes["ms_per_step"]
    assert (ratio.max() - ratio.min()) / ratio.mean() < 0.05  # one denominator: the median step's idle time


def test_one_step_is_one_step_not_one_steps(load_built):
    b = TraceBuilder()
    with b.step():
        b.idle(4_000)
        for _ in range(10):
            b.kernel(GEMM, 100)
        b.sync()
    b.finish()
    report = analyze_model(load_built(b), None, rules=[find_rule("low-gpu-utilization")])
    (f,) = [f for f in report.findings if f.topic == "low-gpu-utilization"]
    assert "inside the steps (1 step, " in f.message and "1 steps" not in f.message



def test_the_largest_gaps_are_the_earliest_of_equal_ones_on_any_cpu():
    """numpy's default sort breaks ties one way on a CPU with AVX-512 and another without: the gaps a
    finding shows (and its golden report) must not depend on the machine."""
    import numpy as np
    from types import SimpleNamespace

    from gpuadvise.rules.low_gpu_utilization import _largest_gaps

    starts = np.arange(40, dtype=float) * 20.0  # 40 kernels of 3 µs, 17 µs apart: every gap ties
    ends = starts + 3.0
    ends[10] -= 1.0  # one gap a µs longer, in the middle
    gaps = _largest_gaps(SimpleNamespace(gpu_union=(starts, ends), window=(0.0, 800.0)))
    assert gaps == [(3.0, 20.0), (23.0, 40.0), (43.0, 60.0), (63.0, 80.0), (202.0, 220.0)]

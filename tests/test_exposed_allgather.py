"""exposed-allgather advises prefetch only where there is work to prefetch under: when the rank does
almost nothing before its all-gathers, the finding says prefetch cannot hide them and asks for cheaper
transfers instead."""

from __future__ import annotations

from gpuadvise.analyzer.run.single import analyze_model
from gpuadvise.fixtures.builder import TraceBuilder
from gpuadvise.rules import find_rule


def _finding(load_built, b: TraceBuilder):
    report = analyze_model(load_built(b), None, rules=[find_rule("exposed-allgather")])
    (f,) = [f for f in report.findings if f.topic == "exposed-allgather"]
    return f


def _gathers_first() -> TraceBuilder:
    """Each step gathers its twelve layers back to back, then computes: nothing to hide the gathers under
    but the previous step's compute, before the first."""
    b = TraceBuilder(device=None, rank=0, world_size=2, backend="gloo")
    for _ in range(3):
        with b.step():
            for _ in range(12):
                b.host_collective(1_500, name="gloo:all_gather", call="c10d::_allgather_base_")
            for _ in range(4):
                b.cpu("aten::linear", 2_000)
    return b


def test_layers_gathered_one_by_one_get_prefetch(load_built):
    f = _finding(load_built, find_rule("exposed-allgather").positive())
    assert "Prefetching each all-gather under the compute before it would hide up to" in f.message
    assert "Prefetch" in f.advice


def test_gathers_with_no_work_before_them_get_cheaper_transfers(load_built):
    f = _finding(load_built, _gathers_first())
    assert "Prefetching would hide only" in f.message and "almost no work before these all-gathers" in f.message
    assert f.evidence.numbers["hideable_ms_per_step"] < 0.1 * f.evidence.numbers["exposed_ms_per_step"]
    assert "shard over fewer ranks" in f.advice and "Prefetch the next layer" not in f.advice

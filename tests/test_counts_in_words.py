"""The report's counts in words: a count of one takes the singular noun, any other count the plural (a
median over an even number of steps can fall between two counts)."""

from __future__ import annotations

from gpuadvise.analyzer.measure.basics.perstep import count_of


def test_a_count_of_one_takes_the_singular():
    assert count_of(1, "small host→device copy", "small host→device copies") == "1 small host→device copy"
    assert count_of(2, "kernel") == "2 kernels" and count_of(1.5, "fill kernel") == "1.5 fill kernels"
    assert count_of(0, "graph node") == "0 graph nodes"


def _steps_line(tmp_path, steps: int) -> str:
    from fixtures.builder import TraceBuilder
    from gpuadvise.analyzer.report import markdown
    from gpuadvise.analyzer.run.engine import analyze_paths

    b = TraceBuilder()
    for _ in range(steps):
        with b.step():
            with b.op("aten::linear"):
                b.kernel("ampere_sgemm_128x64_nn", 400)
    path = b.write(tmp_path / f"steps{steps}.json")
    text = markdown.render(analyze_paths([path]))
    return next(line for line in text.splitlines() if line.startswith("- **Steps:**"))


def test_one_step_is_not_a_range_and_has_no_median(tmp_path):
    line = _steps_line(tmp_path, 1)
    assert line.startswith("- **Steps:** 1 (ProfilerStep#0), ") and "median" not in line and "–" not in line


def test_several_steps_show_their_range_and_median(tmp_path):
    assert _steps_line(tmp_path, 3).startswith("- **Steps:** 3 (ProfilerStep#0–#2), median ")


def test_one_pageable_copy_is_one_copy(tmp_path):
    from fixtures.builder import TraceBuilder
    from gpuadvise.analyzer.read.loader import load_trace
    from gpuadvise.analyzer.run.single import analyze_model
    from gpuadvise.rules import find_rule

    b = TraceBuilder()
    with b.step():
        with b.op("aten::copy_"):
            b.copy("HtoD", src="Pageable", dst="Device", nbytes=64 << 20)
        with b.op("aten::linear"):
            b.kernel("ampere_sgemm_128x64_nn", 400)
    report = analyze_model(load_trace(b.write(tmp_path / "one_copy.json"), cache=False),
                           rules=[find_rule("pageable-memcpy")])
    (f,) = report.findings
    assert f.message.startswith("1 host↔device copy (")
    assert "goes through pageable host memory, so it blocks" in f.message


def test_a_trace_of_one_step_quotes_that_steps_figures_not_medians(tmp_path):
    from gpuadvise.analyzer.read.loader import load_trace
    from gpuadvise.analyzer.run.single import analyze_model
    from gpuadvise.rules.launch_bound import tiny_kernels

    report = analyze_model(load_trace(tiny_kernels(steps=1).write(tmp_path / "one_step.json"), cache=False))
    by_topic = {f.topic: f for f in report.findings}
    assert by_topic["launch-bound"].message.startswith("200 kernels in the step, ")
    assert "(in the step; share of its idle time)" in by_topic["low-gpu-utilization"].message
    for f in report.findings:
        assert "a median" not in f.message.lower(), f.message

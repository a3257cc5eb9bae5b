"""The report's counts in words: a count of one takes the singular noun, any other count the plural (a
median over an even number of steps can fall between two counts)."""

from __future__ import annotations

from gpuadvise.analyzer.measure.perstep import count_of


def test_a_count_of_one_takes_the_singular():
    assert count_of(1, "small host→device copy", "small host→device copies") == "1 small host→device copy"
    assert count_of(2, "kernel") == "2 kernels" and count_of(1.5, "fill kernel") == "1.5 fill kernels"
    assert count_of(0, "graph node") == "0 graph nodes"

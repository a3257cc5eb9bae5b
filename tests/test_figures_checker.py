"""The one-figure-one-computation checker (tests/_figures_support.py) catches what a reader caught on real
runs: the sentences and tables below are the ones a new user found in reports of the PyTorch DDP tutorial
and build-nanogpt under torchrun on a CPU; each must be named, and the corrected wording must pass."""

from __future__ import annotations

import pytest

from _figures_support import Said, disagreements, signed_columns, wording


@pytest.mark.parametrize("text", [
    "Slower by -42.7 %",
    "(traced step 5.8 ms vs 3.5 ms unprofiled (1.67×): no correction needed)",
    "3 steps, median 5.8 ms (unprofiled 3.5 ms: no measurable profiler overhead (1.67×))",
    "161 steps recorded; median step 2.38 ms early (steps 6–292), 2.73 ms late (steps 282–301); no lasting change "
    "beyond chance.",
    "161 steps recorded; median step 2.38 ms early (steps 3–29), 2.73 ms late (steps 142–161); the step got faster "
    "during the run, and no slower.",
    "a step up from step 70 to step 88, to 1.20 ms (-27 %, the median of steps 70–88)",
    "the step got 0.60× slower",
    "The single-process (`num_workers=0`) DataLoader takes 10.8% of the median step: a median 0.3 ms of each 6.0 ms "
    "step is spent waiting for the next batch. Building each batch takes 0.60 ms of that wait in the training process.",
])
def test_each_wrong_statement_is_named(text):
    assert wording(text, "report")


@pytest.mark.parametrize("text", [
    "Work vs the others: −42.7 %",
    "(traced step 5.8 ms vs 3.5 ms unprofiled (1.67×): not corrected, as there is no GPU timeline to replay)",
    "161 steps recorded; median step 2.38 ms early (steps 3–29), 2.73 ms late (steps 142–161); no lasting slow-down "
    "beyond chance.",
    "a step up from step 70 to step 88, to 2.74 ms (+67 %, the median of steps 70–88)",
    "The single-process (`num_workers=0`) DataLoader takes 10.8% of the median step: a median 0.6 ms of each 6.0 ms "
    "step is spent waiting for the next batch. Building each batch takes 0.30 ms of that wait in the training process.",
])
def test_the_corrected_statement_passes(text):
    assert not wording(text, "report")


def test_a_negative_number_in_a_direction_column_is_named():
    table = ("**The rank the job waited for, per step**\n\n| Step | Rank | Slower by |\n|---:|---:|---:|\n"
             "| #12 | 1 | -2.2 % |\n")
    assert signed_columns(table, "markdown")
    assert not signed_columns(table.replace("Slower by", "Work vs the others"), "markdown")


def test_one_quantity_stated_with_two_values_is_named_within_rounding():
    wait = ("wait ms per step", "rank0.json")
    # rank 0's wait: 297.46 ms in the job table, 763.39 ms in the waits per collective (the measured case)
    assert disagreements([Said(wait, 297.46, 2, "job table"), Said(wait, 763.39, 2, "waits per collective")])
    # the same figure printed at two precisions agrees
    assert not disagreements([Said(wait, 297.46, 2, "job table"), Said(wait, 297.5, 1, "text"),
                              Said(wait, 297.457, 3, "JSON")])
    comm = ("comm ms per step", "rank0.json")
    assert disagreements([Said(comm, 0.0, 2, "Steps table"), Said(comm, 367.0, 2, "job table")])

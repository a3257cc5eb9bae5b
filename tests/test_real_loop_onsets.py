"""A drift's onset and its range on real loops, not made-up series: the step records of CPU training loops whose host
work starts growing at a known step, by a list scanned, sorted or compared pairwise every step, a fixed extra pass,
or a scan cut back once, each recorded by `gpuadvise profile --when-slower 50` on a busy or a quiet machine
(bench/bench_changepoints.py --loops; the records are bench/real-loops/runs.jsonl.gz). Their growth is not the
code's law (a short list's pairs cost less each than a long one's) and their noise is the machine's load, not a
model's: the range must hold the true onset there too."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from gpuadvise.analyzer.measure.longrun.longrun import RunAnalysis
from gpuadvise.analyzer.read.steprecord import load_step_record

RUNS = Path(__file__).resolve().parents[1] / "bench" / "real-loops" / "runs.jsonl.gz"
GROWING = ("linear", "n log n", "quadratic", "step", "dip")


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, list[tuple[dict, object]]]:
    """law → [(the run's plan: its length and true onset, the report's levels)], every run the file holds."""
    tmp = tmp_path_factory.mktemp("loops") / "steps.jsonl"
    out = defaultdict(list)
    with gzip.open(RUNS, "rt", encoding="utf-8") as fh:
        for line in fh:
            run = json.loads(line)
            tmp.write_text(run.pop("steps_jsonl"))
            out[run["law"]].append((run, RunAnalysis(record=load_step_record(tmp), k=20).levels))
    return out


def _range(lv) -> tuple[int, int] | None:
    """The steps the report dates the onset to (one step when it gives no range); None when it names no drift."""
    if lv is None or lv.began_at is None:
        return None
    return tuple(lv.began_between) if lv.began_between else (lv.began_at, lv.began_at)


@pytest.mark.parametrize("law", GROWING)
def test_the_onsets_range_holds_the_step_where_the_work_began_in_95_percent_of_real_loops(judged, law):
    runs = judged[law]
    assert len(runs) >= 20
    missed = [(plan["at"], _range(lv)) for plan, lv in runs
              if _range(lv) is None or not _range(lv)[0] <= plan["at"] <= _range(lv)[1]]
    assert len(missed) <= 0.05 * len(runs), missed


def test_where_the_range_is_a_tenth_of_the_run_or_less_the_onset_is_within_5_percent_of_it(judged):
    narrow = []
    for law in GROWING:
        for plan, lv in judged[law]:
            found = _range(lv)
            if found and found[1] - found[0] <= 0.1 * plan["steps"]:
                narrow.append((law, plan["at"], lv.began_at, abs(lv.began_at - plan["at"]) / plan["steps"]))
    assert len(narrow) >= 20  # the step law's are dated to the step: the check is not empty
    wrong = [row for row in narrow if row[3] > 0.05]
    assert len(wrong) <= 0.05 * len(narrow), wrong


def test_the_range_lies_within_the_steps_recorded(judged):
    outside = [(law, plan["run"], plan["steps"], _range(lv)) for law, runs in judged.items() for plan, lv in runs
               if _range(lv) and not 1 <= _range(lv)[0] <= _range(lv)[1] <= plan["steps"]]
    assert not outside, outside


def test_a_steady_loop_on_a_busy_machine_is_not_called_a_drift(judged):
    runs = judged["steady"]
    assert len(runs) >= 20
    drifts = [(plan["run"], lv.shape, lv.began_at) for plan, lv in runs if lv and lv.began_at is not None]
    assert len(drifts) <= 0.05 * len(runs), drifts

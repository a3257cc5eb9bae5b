"""Evidence in people's words (analyzer/report/evidence.py): the labels, units and values a reader sees
for a finding's evidence keys, and the time ranges shown beside their steps. Every rule's fixtures in
every renderer: tests/test_rules.py::test_every_renderer_shows_the_evidence_in_words."""

from __future__ import annotations

import numpy as np
import pytest

from gpuadvise.analyzer.model.findings import Evidence, Finding, Impact
from gpuadvise.analyzer.report import evidence
from gpuadvise.analyzer.report.finding import finding_lines


@pytest.mark.parametrize("key, value, shown", [
    ("outlier_steps", [], ("outlier steps", "none")),
    ("outlier_steps", [3, 4], ("outlier steps", "#3, #4")),
    ("autograd_nodes_per_step", [343, 50], ("autograd nodes per step", "343, 50")),  # counts, not step numbers
    ("single_process", True, ("single-process loader", "yes")),
    ("cudnn_benchmark", False, ("cudnn.benchmark", "no")),
    ("dataloader_share_pct", 98.2, ("DataLoader share", "98.2 %")),
    ("handover_floor_ms", 0, ("handover floor", "0 ms")),
    ("blocked_ms_per_step", np.float64(0.9521), ("blocked", "0.952 ms per step")),
    ("conv_pct_of_step", 83.94, ("conv", "83.9 % of step")),
    ("allocator_ms_in_iterations", 4.4, ("allocator in iterations", "4.4 ms")),
    ("saving_with_feeding_work_pct", None, ("saving with feeding work", "–")),
    ("recorded_settings", {}, ("settings recorded", "none")),
    ("saving_by_fix_pct", {"bf16": 91.2, "tf32": 83.9}, ("saving by fix", "bf16 91.2 %, TF32 83.9 %")),
    ("saving_range_by_fix_pct", {"bf16": [85.6, 91.2]}, ("saving range by fix", "bf16 85.6–91.2 %")),
    ("bytes", 268435456, ("bytes copied", "256 MiB")),
    ("peak_allocated_gib", 20.5, ("peak allocated", "20.5 GiB")),
    ("profiler_overhead_x", 1.5, ("profiler overhead", "1.5×")),
    ("share_of_recorded_pct", 46253.5, ("share of recorded", "46 254 %")),
    # digits grouped from five on, whether the number came as an integer or a float: one column reads alike
    ("live_at_peak_mib", 4056.4, ("live at peak", "4056 MiB")),
    ("allocated_mib", 2304.0, ("allocated", "2304 MiB")),
    ("runtime_calls", 31524, ("runtime calls", "31 524")),
    ("mean_us", 999.5, ("mean", "1000 µs")),  # not "1e+03"
])
def test_a_key_and_its_value_read_as_words(key, value, shown):
    assert evidence.named(key, value) == shown


def test_a_list_of_tables_names_each_entry_first():
    rows = [{"what": "kernel launch calls", "kind": "launch", "ms_per_step": 2.4, "share_of_idle_pct": 70.5}]
    assert evidence.value(rows) == "kernel launch calls: kind launch, 2.4 ms per step, share of idle 70.5 %"


def test_an_offenders_table_has_its_unit_in_the_heading():
    assert [evidence.column(k) for k in ("name", "total_ms", "busy_pct", "count")] == \
        ["name", "total (ms)", "busy (%)", "count"]
    assert [evidence.cell(k, v) for k, v in (("total_ms", 3.808), ("op", ""), ("static_graph", False))] == \
        ["3.81", "–", "no"]


def test_time_ranges_are_shown_in_step_order_beside_their_steps():
    # the rule lists the worst first; the reader follows the steps
    e = Evidence(steps=[3, 4, 5], time_ranges_ms=[(1045.99, 1642.18), (1.01, 528.97), (538.88, 1036.23)])
    e.place_ranges([(3, 0.0, 530.0), (4, 530.0, 1040.0), (5, 1040.0, 1700.0)])
    assert e.range_steps == [5, 3, 4]
    assert evidence.where(e.steps, e.time_ranges_ms, e.range_steps) == \
        ["step 3: 1.01–528.97 ms", "step 4: 538.88–1036.23 ms", "step 5: 1045.99–1642.18 ms"]
    # a range outside every step, and ranges whose steps are not known, keep their own order
    e.place_ranges([(3, 0.0, 530.0)])
    assert evidence.where(e.steps, e.time_ranges_ms, e.range_steps) == \
        ["step 3: 1.01–528.97 ms", "outside the steps: 1045.99–1642.18 ms, 538.88–1036.23 ms"]
    assert evidence.where([], [(2.0, 3.0), (0.5, 1.0)], []) == ["2.00–3.00 ms, 0.50–1.00 ms"]


def test_the_finding_shows_words_and_the_json_keeps_its_keys():
    e = Evidence(steps=[0, 1], time_ranges_ms=[(32.0, 52.0), (0.0, 20.0)],
                 numbers={"dataloader_share_pct": 62.5, "single_process": True, "outlier_steps": []})
    e.place_ranges([(0, 0.0, 32.0), (1, 32.0, 64.0)])
    f = Finding("GA102", "dataloader-stall", "high", "Training waits on the DataLoader", "62.5% of the step", e,
                Impact(62.5, "replay"), advice="use workers")
    text = "\n".join(finding_lines(f))
    assert "- Where: step 0: 0.00–20.00 ms; step 1: 32.00–52.00 ms" in text
    assert "- DataLoader share: 62.5 %" in text and "- single-process loader: yes" in text
    assert "- outlier steps: none" in text
    d = f.to_dict()["evidence"]
    assert d["numbers"] == {"dataloader_share_pct": 62.5, "single_process": True, "outlier_steps": []}
    assert set(d) == {"steps", "time_ranges_ms", "items", "sources", "numbers"}

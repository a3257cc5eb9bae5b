"""A DataLoader that starts its workers anew each epoch: the step record notes each start, and a slowdown
that follows them and comes back is named as the loader restarting (fix: persistent_workers=True), not as a
drift of the run."""

from __future__ import annotations

import pytest

from gpuadvise.analyzer import run as analysis
from gpuadvise.analyzer.read.steprecord import load_step_record
from gpuadvise.fixtures.longrun import RunFolder, Window, trace_for
from gpuadvise.harness.steps.record import StepRecord
from gpuadvise.rules.step_time_drift import _loader_steps


def _drift_findings(tmp_path, blips: list[int], starts: list[tuple[int, int]], facts: dict | None = None):
    """160 steps of 2 ms; 7 steps of 8 ms from each step in `blips`; DataLoader worker starts at `starts`."""
    ms = {n: 2.0 + 0.01 * (n % 3) for n in range(1, 161)}
    for b in blips:
        for n in range(b, b + 7):
            ms[n] = 8.0 + 0.01 * (n % 3)
    w1 = Window(1, "schedule", start=3)
    w1.trace = _loader_steps(trace_for(w1), wait_us=100.0)
    folder = RunFolder(ms, [w1], facts=facts, worker_starts=starts).write(tmp_path / "run")
    reports = analysis.analyze([str(folder)])
    return [f for run in reports.long_runs for f in run.findings if f.topic == "step-time-drift"]


EPOCHS = [(1, 2), (41, 2), (81, 2), (121, 2)]  # 40 steps an epoch, 2 workers started with each


def test_a_slowdown_after_every_epochs_worker_start_is_the_loader_restarting(tmp_path):
    facts = {"dataloaders": [{"created_at": "train.py:30", "num_workers": 2, "pin_memory": False, "batch_size": 32,
                              "prefetch_factor": 2, "persistent_workers": False}]}
    [f] = _drift_findings(tmp_path, [41, 81, 121], EPOCHS, facts)
    assert "this is the loader restarting, not a drift" in f.message
    assert "worker starts at steps 1, 41, 81, 121" in f.message
    assert f.advice == "Keep the workers between epochs: pass `persistent_workers=True` to the DataLoader at train.py:30."
    assert "persistent_workers=True" in f.fix
    # the restarts after the first cost 3 × 7 steps × 6 ms of the run's unprofiled time: what the fix saves
    n = f.evidence.numbers
    assert n["restart_cost_ms"] == pytest.approx(3 * 7 * 6.0, abs=0.5)
    assert f.impact.est_step_saving_pct < 100 * 3 * 7 * 6.0 / (160 * 2.0)  # a share of the run, not of a slow step


def test_one_slow_stretch_at_one_epoch_start_of_several_is_still_a_drift(tmp_path):
    [f] = _drift_findings(tmp_path, [81], EPOCHS)  # the other epochs' starts ran at full speed
    assert "not a drift" not in f.message
    assert "It began as a DataLoader started 2 worker processes at step 81" in f.message


def test_without_worker_starts_a_slowdown_says_nothing_of_the_loader(tmp_path):
    [f] = _drift_findings(tmp_path, [41, 81, 121], [])
    assert "DataLoader" not in f.message


def test_the_step_record_notes_each_epochs_worker_start(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.utils.data.dataloader as dl

    monkeypatch.setattr(dl._MultiProcessingDataLoaderIter, "__init__", dl._MultiProcessingDataLoaderIter.__init__)
    record = StepRecord(tmp_path / "steps.jsonl")
    step = [0]
    record.watch_worker_starts(torch, lambda: step[0])
    data = torch.arange(8.0)
    for persistent, epochs_at in ((False, (3, 7)), (True, (11, 15))):
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, persistent_workers=persistent)
        for at in epochs_at:
            step[0] = at
            for _ in loader:
                record.add(step[0], "wait", 1.0, None)
                step[0] += 1
    record.close()
    # two epochs without persistent workers: two starts; with them: the first epoch's only
    assert load_step_record(tmp_path / "steps.jsonl").worker_starts == [(3, 1), (7, 1), (11, 1)]

"""A big trace's rules shared with a forked child (analyzer/run/rulequeue.py): every task's result comes
back in order, whichever process ran it; a child that dies costs only time; and the reports are the same,
byte for byte, as when one process runs every rule."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpuadvise.analyzer.read import forked
from gpuadvise.analyzer.report import formats
from gpuadvise.analyzer.run import rulequeue
from gpuadvise.analyzer.run.engine import analyze_paths

from _corpus_support import TRACES
from _model_digest import fixture_traces

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the rules are shared with a forked child only where there is fork")


@pytest.fixture
def two_processes(monkeypatch):
    """Rules shared on any trace, as on a big one on two cores."""
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "2")
    monkeypatch.setattr(rulequeue, "MIN_EVENTS", 0)
    # the queue never forks a process that runs threads; an idle one an earlier test left in this worker
    # (Dask's offload pool) must not make this a one-process run
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)


def _slow(i):
    def task():
        time.sleep(0.02)  # long enough that the child claims tasks before the parent has taken them all
        return i, os.getpid()
    return task


def test_every_result_comes_back_in_order_from_both_processes(two_processes):
    results = rulequeue.run_each([_slow(i) for i in range(12)], split=True)
    assert [i for i, _ in results] == list(range(12))
    assert len({pid for _, pid in results}) == 2, "the child took none of the tasks"
    assert os.getpid() in {pid for _, pid in results}


def test_the_tasks_named_first_are_taken_first(two_processes):
    def task(i):
        def run():
            started = time.monotonic()
            time.sleep(0.03)
            return i, started
        return run

    results = rulequeue.run_each([task(i) for i in range(8)], split=True, first=[6, 3])
    assert [i for i, _ in results] == list(range(8))  # still in the tasks' order
    started = {i: t for i, t in results}
    assert max(started[6], started[3]) < min(t for i, t in started.items() if i not in (6, 3))


def test_without_split_every_task_runs_here(two_processes):
    results = rulequeue.run_each([_slow(i) for i in range(4)], split=False)
    assert results == [(i, os.getpid()) for i in range(4)]


def test_a_child_that_dies_costs_only_time(two_processes):
    parent = os.getpid()

    def task(i):
        def run():
            if os.getpid() != parent:
                os._exit(9)  # the child dies on the first task it takes
            time.sleep(0.01)
            return i
        return run

    assert rulequeue.run_each([task(i) for i in range(6)], split=True) == list(range(6))


def test_an_unpicklable_result_is_redone_here(two_processes):
    parent = os.getpid()

    def task():
        time.sleep(0.02)
        return (lambda: None) if os.getpid() != parent else "here"  # a lambda cannot cross back

    assert rulequeue.run_each([task for _ in range(4)], split=True) == ["here"] * 4


def test_the_child_never_writes_to_the_terminal(two_processes, capfd):
    """`view` owns the terminal: what a rule prints or warns in the child is dropped."""
    import sys
    import warnings

    parent = os.getpid()

    def noisy():
        time.sleep(0.02)
        if os.getpid() != parent:
            print("printed by the child", file=sys.stderr)
            warnings.warn("warned by the child")
            return "child"
        return "parent"

    results = rulequeue.run_each([noisy for _ in range(6)], split=True)
    assert "child" in results
    err = capfd.readouterr().err
    assert "by the child" not in err


def test_an_error_here_stops_the_child_and_propagates(two_processes, monkeypatch):
    def boom():
        raise KeyError("a bug in this process")

    children = []
    real = forked.Forked.__init__
    monkeypatch.setattr(forked.Forked, "__init__", lambda self, work: real(self, work) or children.append(self.pid))
    tasks = [boom] + [_slow(i) for i in range(5)]
    with pytest.raises(KeyError):
        rulequeue.run_each(tasks, split=True)
    assert len(children) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(children[0], os.WNOHANG)  # the child was stopped and reaped: no zombie left behind


def test_worth_splitting_only_big_traces_with_two_processes(monkeypatch):
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "2")
    assert rulequeue.worth_splitting(rulequeue.MIN_EVENTS)
    assert not rulequeue.worth_splitting(rulequeue.MIN_EVENTS - 1)
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "1")  # a job's worker when the ranks fill the CPUs
    assert not rulequeue.worth_splitting(10 * rulequeue.MIN_EVENTS)


def _json_reports(paths: list[str]) -> list[str]:
    return [formats.render(analyze_paths([p], cache=False), "json") for p in paths]


def test_rule_fixtures_report_the_same_with_rules_shared(tmp_path, monkeypatch):
    """Every rule's positive trace (where its finding, with all its numbers, is made), one process against
    two: the same report to the byte."""
    paths = [str(p) for key, p in fixture_traces(tmp_path).items() if key.endswith(":positive")]
    one = _json_reports(paths)
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "2")
    monkeypatch.setattr(rulequeue, "MIN_EVENTS", 0)
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    forks = []
    real = forked.Forked.__init__
    monkeypatch.setattr(forked.Forked, "__init__", lambda self, work: forks.append(1) or real(self, work))
    two = _json_reports(paths)
    assert len(forks) >= len(paths), "the rules were not shared"
    for path, a, b in zip(paths, one, two):
        assert a == b, f"{path}: the report changed when its rules were shared"
    assert any(json.loads(a)["findings"] for a in one)  # the fixtures do find things


REAL = ["kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
        "kineto/tb_plugin/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
        "h100/launch-before"]  # a run folder: its run.json facts and calibration too


@pytest.mark.parametrize("rel", REAL)
def test_real_traces_report_the_same_with_rules_shared(rel, monkeypatch):
    path = TRACES / rel
    if not path.exists():
        pytest.skip(f"trace corpus not found at {TRACES}")
    one = _json_reports([str(path)])
    monkeypatch.setenv("GPUADVISE_LOAD_WORKERS", "2")
    monkeypatch.setattr(rulequeue, "MIN_EVENTS", 0)
    monkeypatch.setattr(forked.threading, "active_count", lambda: 1)
    assert _json_reports([str(path)]) == one

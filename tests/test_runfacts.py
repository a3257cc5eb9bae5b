"""The typed run.json readers rules use (analyzer/model/runfacts.py): right values from a well-formed
run.json, nothing (never an exception) from a hand-edited broken one, and no rule reading the raw dict."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuadvise.analyzer.model import runfacts
from gpuadvise.fixtures.runjson import run_json

RULES = Path(__file__).resolve().parents[1] / "rules"


def _facts() -> dict:
    f = run_json(env={"CUDA_LAUNCH_BLOCKING": "1"}, settings={"cudnn_benchmark": False}, param_devices={"cpu": 3, "cuda": 5})
    f["dataloaders"] = [{"created_at": "train.py:12", "num_workers": 0, "pin_memory": False, "batch_size": 64,
                         "prefetch_factor": None, "persistent_workers": False}]
    f["wrappers"] = [{"kind": "DataParallel", "created_at": "train.py:20"},
                     {"kind": "DistributedDataParallel", "created_at": "train.py:30"}]
    f["autocast"] = [{"created_at": "train.py:40", "device_type": "cuda", "dtype": "torch.bfloat16"}]
    return f


def test_well_formed_run_json_reads_as_written():
    f = _facts()
    assert runfacts.flag(f, "cudnn_benchmark") is False
    assert runfacts.env_vars(f) == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert runfacts.cuda_available(f) is True
    assert runfacts.device_name(f) == "NVIDIA A100-SXM4-80GB"
    assert runfacts.param_devices(f) == {"cpu": 3, "cuda": 5}
    assert runfacts.autocast_dtypes(f) == ["torch.bfloat16"]
    [dl] = runfacts.dataloaders(f)
    assert (dl.created_at, dl.num_workers, dl.pin_memory, dl.batch_size, dl.prefetch_factor) == ("train.py:12", 0, False, 64, None)
    assert [w.created_at for w in runfacts.wrappers(f, kind="DataParallel")] == ["train.py:20"]
    assert len(runfacts.wrappers(f)) == 2
    [opt] = runfacts.optimizers(f, cls="AdamW")
    assert opt.params == 8 and opt.param_devices == {"cpu": 3, "cuda": 5} and opt.foreach is None
    assert opt.as_dict()["class"] == "AdamW"
    assert runfacts.optimizers(f, cls="SGD") == []


def test_a_recorded_site_inside_a_library_is_never_read_as_the_users():
    """An older run.json placed a Trainer's DataLoader in transformers' own file; today's harness records
    the user's line and the framework call between."""
    f = _facts()
    f["dataloaders"] = [{"created_at": "/env/lib/python3.11/site-packages/transformers/trainer.py:1021", "num_workers": 0},
                        {"created_at": "train.py:40", "created_via": "`get_train_dataloader` in transformers", "num_workers": 0}]
    old, new = runfacts.dataloaders(f)
    assert old.created_at == "?" and old.where == "?"
    assert new.where == "train.py:40 (through `get_train_dataloader` in transformers)"
    # run.json's relative sites are relative to the run's working folder: a user's own `torch/` folder
    assert runfacts.site("train.py:40") == "train.py:40" and runfacts.site("torch/nn/x.py:3") == "torch/nn/x.py:3"
    assert runfacts.site("/usr/lib/python3/dist-packages/torch/nn/x.py:3") is None


@pytest.mark.parametrize("broken", [
    {}, [], "x", None,
    {"settings": [1], "environment": "gpu", "dataloaders": {"a": 1}, "wrappers": "DataParallel", "optimizers": 3, "autocast": 7},
    {"settings": {"cudnn_benchmark": "yes"}, "dataloaders": [1, "a", {"num_workers": "4", "pin_memory": 1}],
     "wrappers": [None, {"kind": 3}], "optimizers": [{"class": 1, "param_devices": {"cpu": "8", "cuda": True}}],
     "environment": {"cuda_available": "true", "device": {"name": 5}, "machine": {"env": {"A": 1}}}},
])
def test_hand_edited_run_json_never_breaks_a_reader(broken):
    assert runfacts.flag(broken, "cudnn_benchmark") is None
    assert runfacts.env_vars(broken) == {}
    assert runfacts.cuda_available(broken) is None
    assert runfacts.device_name(broken) is None
    assert runfacts.param_devices(broken) == {}
    assert runfacts.settings_read_at(broken) is None
    for dl in runfacts.dataloaders(broken):  # a dict entry with wrong types reads as unknown values
        assert dl.num_workers is None and dl.pin_memory is None
    assert all(w.kind == "?" for w in runfacts.wrappers(broken))
    assert all(o.cls == "?" and o.param_devices == {} for o in runfacts.optimizers(broken))


def test_no_rule_reads_run_json_as_a_raw_dict():
    raw = re.compile(r"\bfacts\s*(\.get\(|\[)")
    offenders = [f"{p.name}:{i}" for p in sorted(RULES.glob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert offenders == [], "rules read run.json through analyzer/model/runfacts.py only"

"""What a folder on the command line turns into: traces, their ranks, their run facts."""

import json

from gpuadvise.analyzer.read.sources import resolve
from gpuadvise.rules import find_rule


def test_multi_rank_run_folder_pairs_each_trace_with_its_own_run_json(tmp_path):
    stall = find_rule("dataloader-stall").positive()
    stall.write(tmp_path / "trace.json.gz")
    stall.write(tmp_path / "trace.rank1.json.gz")
    (tmp_path / "run.json").write_text(json.dumps({"rank": 0, "dataloaders": [{"created_at": "train.py:10"}]}))
    (tmp_path / "run.rank1.json").write_text(json.dumps({"rank": 1, "dataloaders": [{"created_at": "train.py:11"}]}))
    sources = resolve([str(tmp_path)])
    assert sorted(s.path.name for s in sources) == ["trace.json.gz", "trace.rank1.json.gz"]  # run*.json are no traces
    by_name = {s.path.name: s for s in sources}
    assert by_name["trace.rank1.json.gz"].rank == 1
    assert by_name["trace.rank1.json.gz"].facts["dataloaders"][0]["created_at"] == "train.py:11"
    assert by_name["trace.json.gz"].facts["dataloaders"][0]["created_at"] == "train.py:10"

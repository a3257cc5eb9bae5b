"""Which frame of a stack is the user's (analyzer/model/frames.py): library code is judged by this
Python's install roots, by path markers for traces recorded elsewhere, and by GPUADVISE_LIBRARY_PATHS for
vendored libraries; every stack format the tool reads goes through the same judge."""

from __future__ import annotations

import json
import os
import sysconfig
import threading

import pytest

from gpuadvise.analyzer.model import frames


@pytest.mark.parametrize("path", [
    "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py",
    "/usr/lib/python3/dist-packages/transformers/trainer.py",
    "/usr/lib/python3.11/threading.py",  # another machine's standard library
    "torch/nn/modules/module.py",  # Kineto writes installed files relative to their sys.path entry
    "transformers/models/bert/modeling_bert.py",
    "threading.py", "multiprocessing/pool.py",  # the standard library, stripped the same way
    "/home/dev/pytorch/torch/autograd/__init__.py",  # a source build of torch
    "/sgl-workspace/sglang/python/sglang/srt/model_runner.py",  # a framework's checkout
    "<frozen runpy>", "<built-in method run_backward>", "",
])
def test_library_frames(path):
    assert frames.is_library(path)


@pytest.mark.parametrize("path", [
    "train.py", "/home/me/proj/train.py", "models/net.py", "datasets/imagenet.py", "test.py",
    "<ipython-input-3-5f2c>",  # a notebook cell
])
def test_user_frames(path):
    assert not frames.is_library(path)


def test_this_pythons_install_roots_are_library_code():
    assert frames.is_library(threading.__file__)
    assert frames.is_library(os.path.join(sysconfig.get_paths()["purelib"], "anything", "x.py"))
    assert frames.is_library(frames.__file__)  # gpuadvise's own frames are never the user's


def test_vendored_libraries_are_configurable(monkeypatch, tmp_path):
    vendored = tmp_path / "proj" / "third_party" / "apexlike" / "fused.py"
    assert not frames.is_library(str(vendored))
    monkeypatch.setenv(frames.ENV, os.pathsep.join(["third_party", str(tmp_path / "elsewhere")]))
    assert frames.is_library(str(vendored))
    assert frames.is_library(str(tmp_path / "elsewhere" / "lib.py"))
    assert not frames.is_library(str(tmp_path / "proj" / "train.py"))


@pytest.mark.parametrize("text, want", [
    ("train.py(42): step", frames.Frame("train.py", 42, "step")),
    ("train.py:42", frames.Frame("train.py", 42)),
    ("a/b/c.py:12 (forward)", frames.Frame("a/b/c.py", 12, "forward")),
    ('File "/x/model.py", line 31, in forward', frames.Frame("/x/model.py", 31, "forward")),
    ("nn.Module: Linear_0", None),  # with_stack module events are not frames
    ("", None),
])
def test_every_recorded_frame_format_is_read(text, want):
    assert frames.parse(text) == want


def test_the_first_user_frame_and_the_library_call_beside_it():
    stack = ["/env/lib/python3.11/site-packages/transformers/trainer.py(1021): train", "/home/me/train.py(40): main",
             "/home/me/train.py(55): <module>"]
    chosen = frames.pick(stack)
    assert chosen.site == "/home/me/train.py:40"
    assert chosen.described() == "/home/me/train.py:40 (calls `train` in transformers)"
    # outermost first (a traceback, python_function spans by start): the innermost user frame still wins
    assert frames.pick(list(reversed(stack)), innermost_first=False).site == "/home/me/train.py:40"
    only_torch = frames.pick(["torch/optim/adam.py(90): _init_group"])
    assert only_torch.user is None and only_torch.described() == "no frame in your code (inside `_init_group` in torch)"


def test_a_recorded_site_is_kept_only_when_it_is_the_users():
    assert frames.user_site("train.py:40") == "train.py:40"
    assert frames.user_site("datasets/loader.py:9") == "datasets/loader.py:9"  # relative to the run's folder
    assert frames.user_site("/env/lib/python3.11/site-packages/transformers/trainer.py:1021") is None
    assert frames.user_site(None) is None


def test_the_live_stack_skips_library_frames():
    # json's decoder (standard library) calls the hook: the user's frame is this test, json's beside it
    chosen = json.loads("{}", object_hook=lambda _: frames.live(1))
    assert chosen.user.file == __file__ and chosen.user.function == "test_the_live_stack_skips_library_frames"
    assert frames.package(chosen.library.file) == "json"


def test_library_sites_in_an_older_run_json_never_reach_a_finding(tmp_path):
    """run.json from a harness that did not judge frames: a DataLoader built inside a framework, a module
    compiled through torch's own wrapper. The findings still come, pointing only into the user's code."""
    from _cli_support import library_pointers
    from gpuadvise.analyzer.report.json import document
    from gpuadvise.analyzer.run import analyze
    from gpuadvise.fixtures.compiled import compiled_facts, compiled_loop

    inside_torch = "/env/lib/python3.11/site-packages/torch/_dynamo/external_utils.py:67"
    b = compiled_loop()
    b.facts = compiled_facts([{"step": 0, "seconds": 4.0}] + [
        {"step": s, "seconds": 1.5, "where": inside_torch,
         "recompile_reason": f"0/{i}: tensor 'args[0]' size mismatch at index 0. expected {s}, actual {s + 2}"}
        for i, s in enumerate((2, 4, 6))])
    b.facts["compiled"]["graph_breaks"] = [{"where": "/env/lib/python3.11/site-packages/transformers/x.py:9",
                                           "reason": "Unsupported Tensor.item() call", "count": 3, "steps": [8]}]
    doc = json.loads(json.dumps(document(analyze([str(b.write_run_folder(tmp_path / "run"))]))))
    found = {f["topic"]: f for f in doc["findings"]}
    assert {"compile-recompiles", "compile-graph-breaks"} <= set(found)
    assert "a frame inside torch" in found["compile-recompiles"]["message"]
    assert "code inside transformers" in found["compile-graph-breaks"]["message"]
    for f in doc["findings"]:
        assert not library_pointers(f), (f["topic"], library_pointers(f))


def test_a_users_folder_called_torch_on_this_machine_is_theirs(tmp_path):
    script = tmp_path / "src" / "torch" / "make_loader.py"
    script.parent.mkdir(parents=True)
    script.write_text("")
    assert not frames.is_library(str(script))
    # the same path in a trace from another machine reads as a source build of torch
    assert frames.is_library(str(tmp_path / "elsewhere" / "torch" / "nn" / "functional.py"))


def test_a_framework_built_object_is_placed_at_the_users_call_with_the_framework_beside_it(tmp_path, monkeypatch):
    """The harness's constructor patch: a DataLoader a framework builds for the user (Trainer's
    get_train_dataloader) is created at the user's line, through the framework's call."""
    from gpuadvise.harness.facts import general as harness_facts

    lib = tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "fakefw"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("def get_train_dataloader(cls):\n    return cls()\n")
    monkeypatch.syspath_prepend(str(lib.parent))
    import fakefw

    class Loader:
        def __init__(self):
            pass

    seen = []
    harness_facts._wrap_init(Loader, lambda obj, a, k, where: seen.append(where))
    fakefw.get_train_dataloader(Loader)
    Loader()
    through, direct = seen
    assert through["created_at"].endswith(f"test_frames.py:{_line_of('fakefw.get_train_dataloader(Loader)')}")
    assert through["created_via"] == "`get_train_dataloader` in fakefw"
    assert direct["created_at"].endswith(f"test_frames.py:{_line_of('Loader()')}") and "created_via" not in direct


def _line_of(statement: str) -> int:
    """The line of this file that holds exactly `statement`."""
    lines = open(__file__).read().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if ln.strip() == statement)


# A fresh Python that imports gpuadvise from a copy of the checkout, mapped the way the editable install maps
# it (pyproject.toml's package-dir: each import package to its own folder), and judges the copy's files.
_JUDGE_A_COPY = r"""
import importlib.abc, importlib.util, json, os, sys

root, mapping = sys.argv[1], json.loads(sys.argv[2])


class Mapped(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in mapping:
            return None
        folder = os.path.join(root, mapping[name])
        return importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])


sys.meta_path.insert(0, Mapped())
from gpuadvise.analyzer.model import frames

assert frames.__file__.startswith(root), frames.__file__
files = {name: os.path.join(root, *name.split("/")) for name in (
    "tests/test_model.py", "examples/train.py", "gpuadvise/harness/facts/general.py", "analyzer/model/frames.py",
    "rules/base.py", "fixtures/builder.py")}
space = {}  # the live stack: a harness frame called from the example's code
exec(compile("def hook(frames):\n    return frames.live(0)\n", files["gpuadvise/harness/facts/general.py"], "exec"), space)
exec(compile("def build(hook, frames):\n    return hook(frames)\n", files["examples/train.py"], "exec"), space)
chosen = space["build"](space["hook"], frames)
print(json.dumps({
    "library": {name: frames.is_library(path) for name, path in files.items()},
    "package": frames.package(files["gpuadvise/harness/facts/general.py"]),
    "live": [os.path.relpath(f.file, root) if f else None for f in (chosen.user, chosen.library)],
    "picked": frames.pick([f"{files['gpuadvise/harness/facts/general.py']}(120): __init__",
                           f"{files['tests/test_model.py']}(9): test_build"]).site,
}))
"""


def _package_dirs() -> dict[str, str]:
    import tomllib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


@pytest.mark.slow  # one fresh Python, for both copies
def test_a_checkout_called_gpuadvise_keeps_its_tests_and_examples_the_users(tmp_path):
    """Cloned the ordinary way, the checkout's folder is called `gpuadvise`: its tests and examples are still
    user code and only its package folders are gpuadvise's own, as in a checkout called otherwise. Each copy
    is imported the way the editable install maps it, in a Python that never saw the worktree's package."""
    import shutil
    import subprocess
    import sys

    mapping = _package_dirs()
    assert set(mapping) == set(frames.OWN_PACKAGES)  # the packages frames.py looks up are those pyproject maps
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {}
    for name in ("gpuadvise", "my-checkout"):
        copy = tmp_path / name
        for folder in set(mapping.values()):
            shutil.copytree(os.path.join(here, folder), copy / folder,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
        for user_file in ("tests/test_model.py", "examples/train.py"):
            (copy / user_file).parent.mkdir(parents=True, exist_ok=True)
            (copy / user_file).write_text("")
    script = "import runpy, sys\n" + "\n".join(
        f"sys.argv = ['judge', {str(tmp_path / n)!r}, {json.dumps(json.dumps(mapping))}]\n"
        f"runpy.run_path({str(tmp_path / 'judge.py')!r}, run_name='__main__')\n"
        f"[sys.modules.pop(m) for m in [m for m in sys.modules if m == 'gpuadvise' or m.startswith('gpuadvise.')]]\n"
        f"sys.meta_path.pop(0)" for n in ("gpuadvise", "my-checkout"))
    (tmp_path / "judge.py").write_text(_JUDGE_A_COPY)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name, line in zip(("gpuadvise", "my-checkout"), proc.stdout.strip().splitlines()):
        results[name] = json.loads(line)
    for name, got in results.items():
        assert got["library"] == {"tests/test_model.py": False, "examples/train.py": False,
                                  "gpuadvise/harness/facts/general.py": True, "analyzer/model/frames.py": True,
                                  "rules/base.py": True, "fixtures/builder.py": True}, name
        assert got["package"] == "gpuadvise", name
        # the example's frame, not skipped as gpuadvise's; the harness's frame inside it is
        assert got["live"] == ["examples/train.py", "gpuadvise/harness/facts/general.py"], name
        assert got["picked"].endswith("tests/test_model.py:9"), name


def test_gpuadvise_frames_from_another_machine_are_known_by_the_packages_layout():
    """A trace recorded elsewhere names that machine's paths: gpuadvise's own frames are those under a
    `gpuadvise` folder followed by a name the package holds, in a checkout of any name or an install."""
    assert frames.is_library("/home/u/src/gpuadvise/gpuadvise/harness/facts/general.py")
    assert frames.is_library("/home/u/src/checkout/gpuadvise/harness/steps/sources.py")
    assert frames.is_library("gpuadvise/harness/session/bootstrap.py")  # written relative to its sys.path entry
    assert frames.package("/home/u/src/gpuadvise/gpuadvise/harness/facts/general.py") == "gpuadvise"
    # a checkout called gpuadvise there: its examples and tests are the user's
    assert not frames.is_library("/home/u/src/gpuadvise/examples/train_stall.py")
    assert not frames.is_library("/home/u/src/gpuadvise/tests/test_profile.py")
    assert not frames.is_library("gpuadvise/examples/train_stall.py")

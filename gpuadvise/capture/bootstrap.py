"""The child process of `gpuadvise profile`: runs the user's script as `python script.py` would,
under a profiling session. Usage (internal): python -m gpuadvise.capture.bootstrap CONFIG.json (-m MODULE | SCRIPT) [ARGS...]
"""

from __future__ import annotations

import json
import os
import runpy
import sys

from .session import Session, StopAfterCapture, set_active


def main() -> None:
    config_path, target = sys.argv[1], sys.argv[2:]
    with open(config_path) as fh:
        config = json.load(fh)
    try:
        os.unlink(config_path)
    except OSError:
        pass
    session = Session(config)
    set_active(session)
    session.start()
    code = 0
    try:
        if target[0] == "-m":
            module, args = target[1], target[2:]
            sys.argv = [module] + args  # runpy replaces argv[0] with the module's file, as python -m does
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            script, args = target[0], target[1:]
            sys.argv = [script] + args
            # python script.py puts the script's folder first on sys.path (not the current folder)
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            run_script(script)
    except StopAfterCapture:
        code = 0
        print("gpuadvise> stopping the script after the capture (--stop-after-capture)", file=sys.stderr, flush=True)
    except SystemExit as exc:
        code = exc.code
        session.finish(exit_code=_exit_status(code))
        raise
    except KeyboardInterrupt:
        session.finish(exit_code=130)
        raise  # Python prints the traceback and dies by SIGINT, as the unwrapped script would
    except BaseException:
        session.finish(exit_code=1)
        raise  # the script's own traceback, printed by Python as usual
    session.finish(exit_code=_exit_status(code))
    sys.exit(code)


def run_script(script: str) -> None:
    """Run a .py file as `python script.py` does: a fresh `__main__` module whose `__file__` is the path
    joined to the current folder (not normalised), with sys.argv[0] left as typed. Folders and zip
    files (which python runs through their __main__.py) go through runpy."""
    if os.path.isdir(script) or not script.endswith((".py", ".pyw")) and _is_zip(script):
        runpy.run_path(script, run_name="__main__")
        return
    import builtins
    import importlib.machinery
    import importlib.util
    import io
    import types

    path = os.path.join(os.getcwd(), script)
    with io.open_code(path) as fh:
        source = importlib.util.decode_source(fh.read())
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __package__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main  # pickling and multiprocessing find the script's classes here
    exec(code, main.__dict__)


def _is_zip(path: str) -> bool:
    import zipfile

    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


if __name__ == "__main__":
    main()

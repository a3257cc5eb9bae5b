"""The child process of `gpuadvise profile`: runs the user's script as `python script.py` would,
under a profiling session. Usage (internal): python -m gpuadvise.harness.session.bootstrap CONFIG.json (-m MODULE | SCRIPT) [ARGS...]
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import signal
import sys

from .session import Session, StopAfterCapture, set_active
from .usertrace import print_user_traceback

# exit status of a `-m MODULE` that cannot be found, as `python -m` gives; the parent then removes
# the run folder it made, since nothing ran
NO_MODULE = 1


def main() -> None:
    config_path, target = sys.argv[1], sys.argv[2:]
    with open(config_path) as fh:
        config = json.load(fh)
    try:
        os.unlink(config_path)
    except OSError:
        pass
    if target[0] == "-m" and not _module_exists(target[1]):
        # python -m's own words; checked before the session starts, so no run.json is written
        print(f"{sys.executable}: No module named {target[1]}", file=sys.stderr)
        sys.exit(NO_MODULE)
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
    except KeyboardInterrupt as exc:
        session.finish(exit_code=130)
        print_user_traceback(exc)
        # die by SIGINT, as the unwrapped script would (Python does the same for an uncaught Ctrl-C)
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException as exc:
        session.finish(exit_code=1)
        print_user_traceback(exc)  # the traceback `python train.py` would print: none of our frames
        sys.exit(1)
    session.finish(exit_code=_exit_status(code))
    sys.exit(code)


def _module_exists(name: str) -> bool:
    """Whether `python -m name` would find something to run (a parent package that fails to import
    counts as found: its error is the user's own, shown by the run)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False
    except Exception:
        return True


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

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
            runpy.run_path(script, run_name="__main__")
    except StopAfterCapture:
        code = 0
        print("gpuadvise> stopping the script after the capture (--stop-after-capture)", file=sys.stderr, flush=True)
    except SystemExit as exc:
        code = exc.code
        session.finish(exit_code=_exit_status(code))
        raise
    except BaseException:
        session.finish(exit_code=1)
        raise  # the script's own traceback, printed by Python as usual
    session.finish(exit_code=_exit_status(code))
    sys.exit(code)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


if __name__ == "__main__":
    main()

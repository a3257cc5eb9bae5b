"""Fidelity probe: prints, as one JSON line, what a script can see of how it was started.

Run it as `python probe.py ARGS` and as `gpuadvise profile ... probe.py ARGS`; the lines must match.
"""

import json
import os
import sys


def _stdin():
    try:
        readable = sys.stdin is not None and not sys.stdin.closed and sys.stdin.readable()
        return readable, sys.stdin.read() if readable else None
    except (OSError, ValueError) as exc:
        return False, repr(exc)


readable, data = _stdin()
print(json.dumps({
    "argv": sys.argv,
    "name": __name__,
    "file": __file__,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "stdin_readable": readable,
    "stdin": data,
}))

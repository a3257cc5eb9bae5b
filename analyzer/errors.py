"""Errors a user can cause, and the exit codes the CLI maps them to.

A user mistake (missing file, not a trace, unwritable output) is an `InputError`: the CLI prints its
one-line message and exits with `EXIT_INPUT`. Anything else is our bug and exits with `EXIT_INTERNAL`.
"""

EXIT_OK = 0
EXIT_GATE = 1  # a CI gate tripped: --fail-on, --fail-on-regression (the input was fine)
EXIT_INPUT = 2  # bad path, unreadable or malformed input, unwritable output
EXIT_INTERNAL = 3  # a bug in gpuadvise


class InputError(Exception):
    """A problem with what the user gave us, reported as one line naming the file."""

    def __init__(self, path, problem: str):
        self.path = str(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)


class AnalysisCancelled(BaseException):
    """Raised by a progress callback to stop an analysis at once: whoever asked for it has given up (an
    assistant's cancelled request). Like KeyboardInterrupt it is no error: no handler of errors catches it
    (a progress display's, a rule's), the reader's forked workers are stopped on the way out, and nothing
    is cached."""


def human_size(n: float) -> str:
    """A byte count as people read it in an error message (1.5 GiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"

"""The `gpuadvise` command: one small module per subcommand, each beside the code it drives.

| command | module | drives |
|---|---|---|
| analyze | analyzer/run/cli.py | read → model → measure → rules → report |
| compare | analyzer/compare/cli.py | two analyses → what changed, predicted vs measured |
| profile | gpuadvise/harness/cli.py | the user's script under torch.profiler, then analyze |
| trigger | gpuadvise/harness/windows/trigger_command.py | a window now, in a running `profile --on-signal` job |
| view | gpuadvise/tui/cli.py | the Textual browser of an analysis |
| doctor | gpuadvise/doctor/cli.py | the machine and torch build checks (facts shared with run.json) |
| rules, explain | rules/cli.py | the rule catalog |
| mcp | gpuadvise/mcp/cli.py | the same analysis as tools an AI assistant calls (Model Context Protocol, stdio) |

A subcommand module exposes `main(argv) -> int`; it raises `InputError` for a user
mistake, which becomes one line on stderr and exit 2; anything else it lets escape is our bug (exit 3).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

from gpuadvise.version import __version__
from gpuadvise.analyzer.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_OK, InputError

# name → (module, function, one-line help); modules are imported only when their command runs.
COMMANDS = {
    "analyze": ("gpuadvise.analyzer.run.cli", "main", "analyse a trace, a folder of per-rank traces, or a run folder"),
    "compare": ("gpuadvise.analyzer.compare.cli", "main", "compare two runs: did the fix work as predicted, did anything regress"),
    "profile": ("gpuadvise.harness.cli", "main", "run a training script under the profiler and report"),
    "trigger": ("gpuadvise.harness.windows.trigger_command", "main", "ask a running `profile --on-signal` job to record a window now"),
    "view": ("gpuadvise.tui.cli", "main", "browse findings and the trace in a terminal UI"),
    "doctor": ("gpuadvise.doctor.cli", "main", "check this machine and its torch build: versions, GPUs, flags, env vars"),
    "rules": ("gpuadvise.rules.cli", "rules_main", "list the rule catalog"),
    "explain": ("gpuadvise.rules.cli", "explain_main", "show one rule's documentation"),
    "mcp": ("gpuadvise.mcp.cli", "main", "serve the analysis to an AI assistant: an MCP server over stdio"),
}

USAGE = "usage: gpuadvise [-h] [--version] COMMAND [ARGS ...]"

# Other spellings users type (British English, the help text's own "analyse"): run the command.
ALIASES = {"analyse": "analyze"}


def _help() -> str:
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "Find out why PyTorch training leaves the GPU idle, and what to change.", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, _, text) in COMMANDS.items()]
    lines += ["", "`gpuadvise COMMAND -h` shows a command's options.",
              "options:", "  -h, --help  show this help and exit", "  --version   show the version and exit"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # no command is a mistake, as for git: the usage on stderr, exit 2
        sys.stderr.write(_help())
        return EXIT_INPUT
    if argv[0] in ("-h", "--help"):
        sys.stdout.write(_help())
        return EXIT_OK
    if argv[0] == "--version":
        print(f"gpuadvise {__version__}")
        return EXIT_OK
    name, rest = ALIASES.get(argv[0], argv[0]), argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS) + list(ALIASES), n=1)
        hint = f"; did you mean {ALIASES.get(close[0], close[0])!r}?" if close else ""
        print(f"{USAGE}\ngpuadvise: error: unknown command {name!r} (choose from {', '.join(COMMANDS)}){hint}",
              file=sys.stderr)
        return EXIT_INPUT
    module, func, _ = COMMANDS[name]
    return run_guarded(lambda: getattr(importlib.import_module(module), func)(rest))


def run_guarded(command) -> int:
    """Run a subcommand: a user mistake is one line and exit 2, our bug one line and exit 3."""
    try:
        return command()
    except InputError as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("gpuadvise: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gpuadvise analyze … | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
        return 141  # as a shell tool killed by SIGPIPE
    except Exception as exc:  # our bug: say so in one line, keep the traceback for GPUADVISE_DEBUG
        if os.environ.get("GPUADVISE_DEBUG"):
            raise
        print(f"{error_line(exc)} (set GPUADVISE_DEBUG=1 for details)", file=sys.stderr)
        return EXIT_INTERNAL


def error_line(exc: BaseException) -> str:
    """The one line a command's failure is told in: the user's mistake (`InputError`), or our bug."""
    if isinstance(exc, InputError):
        return f"gpuadvise: error: {exc}"
    return f"gpuadvise: internal error: {type(exc).__name__}: {exc}"


# Commands whose process has nothing left to do once `main` returns: their output is written (atomically)
# and they start nothing that outlives them.
_LEAVE_AT_ONCE = {"analyze"}


def console() -> None:
    """The `gpuadvise` executable: `main`, then exit. After `analyze` the process leaves without tearing
    the interpreter down: freeing a big trace's model object by object and finalizing pandas and numpy
    takes about 0.1 s that nobody waits for (stdout and stderr are flushed first). Every other command —
    `profile` above all, which runs the user's script and its atexit handlers — exits the ordinary way."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and ALIASES.get(argv[0], argv[0]) in _LEAVE_AT_ONCE:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: the reader has what it wanted
                pass
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":  # pragma: no cover
    console()

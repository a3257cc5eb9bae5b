"""`gpuadvise mcp`: serve the analysis to an AI assistant over stdio (the assistant starts this command;
docs/mcp.md has each assistant's configuration). Exit codes follow the other commands: 0 when the client
closed the connection, 2 bad input (the `mcp` extra missing: one line on stderr)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from gpuadvise.analyzer.errors import EXIT_OK, InputError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuadvise mcp",
        description="An MCP server over stdin/stdout for AI assistants (Claude Code, Claude Desktop, Cursor, VS Code, "
                    "…): gpuadvise's findings, tables and comparisons as tools, the rules as resources. The "
                    "assistant starts it; relative paths are read from the folder it is started in.")
    p.add_argument("--folder", metavar="DIR",
                   help="the working folder: relative paths are read from it and the profile tool runs scripts in it "
                        "(default: the folder the assistant starts the server in; for clients that start it elsewhere, "
                        "such as Claude Desktop)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.folder is not None:
        if not os.path.isdir(args.folder):
            raise InputError(args.folder, "no such folder")
        os.chdir(args.folder)
    if importlib.util.find_spec("mcp") is None:  # the `mcp` extra is optional
        from gpuadvise.analyzer.install import install_command

        raise InputError(None, f"`gpuadvise mcp` needs the MCP SDK; {install_command('mcp')}")
    if sys.stdin.isatty():  # a person at a terminal: the server would wait silently for a client's messages
        print("gpuadvise mcp: serving the Model Context Protocol on stdin/stdout for an assistant to start "
              "(see docs/mcp.md); Ctrl-D ends it", file=sys.stderr)
    from .server import serve

    serve()
    return EXIT_OK

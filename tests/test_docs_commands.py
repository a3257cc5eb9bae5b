"""Every `gpuadvise` command and option the documentation mentions is one the command really has.

The pages (docs/, README.md) are read as a user reads them: each `gpuadvise COMMAND …` in a code block
or a code span is checked against that command's own argparse parser (built in-process, the parser
`gpuadvise COMMAND --help` prints), its options one by one and, for an option with fixed choices, the
values written after it; an option written on its own (`--when-slower PCT`) must belong to some command.
The other way round, every command and every option of every command is documented somewhere, so a new
option without a word in the manual fails here too.
"""

from __future__ import annotations

import argparse
import importlib
import re
from functools import lru_cache
from pathlib import Path

import pytest

from _docs_support import REPO, lines, pages
from gpuadvise.cli import ALIASES, COMMANDS

# The function that builds each command's parser, in the module COMMANDS names; `build_parser` unless listed.
PARSER_BUILDERS = {"rules": "build_rules_parser", "explain": "build_explain_parser"}

# Options of other programs the pages mention, and the program: the paragraph that mentions one must
# name its program, so a reader never takes it for a gpuadvise option.
FOREIGN = {
    "--multi_gpu": "accelerate",
    "-n": "pytest", "--dist": "pytest", "--durations": "pytest", "--hypothesis-profile": "pytest",
    "--cap-add": "container",  # docker's; the page says "in containers"
}

COMMAND = re.compile(r"(?<![\w./-])gpuadvise\s+([a-z][a-z-]*)")
OPTION = re.compile(r"(?<![\w./<-])(--?[a-zA-Z][\w-]*)")


@lru_cache(maxsize=None)
def parser(command: str) -> argparse.ArgumentParser:
    module, _, _ = COMMANDS[command]
    return getattr(importlib.import_module(module), PARSER_BUILDERS.get(command, "build_parser"))()


def options(command: str) -> dict[str, argparse.Action]:
    return {s: a for a in parser(command)._actions for s in a.option_strings}


def code_pieces(text: str):
    """(code, paragraph) for each line of a fenced block and each inline code span, with the paragraph
    (or block) it stands in."""
    block, paragraph = [], []
    for line, fence in list(lines(text)) + [("", None)]:
        if fence is None and block:
            for code in block:
                yield code, "\n".join(block)
            block = []
        if fence is not None:
            block.append(line.strip())
        elif line.strip():
            paragraph.append(line)
        else:
            joined = " ".join(paragraph)
            for span in re.findall(r"`([^`]+)`", joined):
                yield span, joined
            paragraph = []


def command_segments(code: str):
    """(command, the words after it that belong to it) for each `gpuadvise COMMAND` in a piece of code."""
    for m in COMMAND.finditer(code):
        rest = code[m.end():]
        rest = re.split(r"\s#|\s\|\s|\s>>?\s|&&|;|\)$", rest)[0]  # a comment, a pipe, a redirect, the next command
        name = ALIASES.get(m.group(1), m.group(1))
        if name == "profile":  # the script's own arguments start at the script or the module
            rest = re.split(r"(?:^|\s)(?:\[?--\]?(?=\s)|\S+\.py\b)", rest)[0]
            rest = re.sub(r"(?:^|\s)-m\s+\S+.*", "", rest)
        yield name, m.group(1), rest


def command_problems(files: list[Path], root: Path = REPO) -> list[str]:
    """What is wrong with the `gpuadvise COMMAND …` written in `files`, one line each."""
    problems = []
    for page in files:
        where = page.relative_to(root)
        for code, _ in code_pieces(page.read_text(encoding="utf-8")):
            for name, written, rest in command_segments(code):
                if name not in COMMANDS:
                    problems.append(f"{where}: `gpuadvise {written}` is not a command ({code!r})")
                    continue
                opts = options(name)
                words = re.split(r"\s+", rest.replace("[", " ").replace("]", " ").strip())
                for i, word in enumerate(words):
                    m = OPTION.fullmatch(word.split("=", 1)[0])
                    if not m:
                        continue
                    action = opts.get(m.group(1))
                    if action is None:
                        problems.append(f"{where}: `gpuadvise {name}` has no option {m.group(1)} ({code!r})")
                    elif action.choices and "=" not in word and i + 1 < len(words):
                        for value in re.split(r"\\?\|", words[i + 1]):
                            if re.fullmatch(r"[a-z][a-z-]*", value) and value not in action.choices:
                                problems.append(f"{where}: `gpuadvise {name} {m.group(1)}` takes no {value!r} "
                                                f"(choices: {', '.join(action.choices)})")
    return problems


def test_every_command_mentioned_exists_and_its_options_too():
    problems = command_problems(pages())
    assert not problems, "\n".join(problems)


def alone_problems(files: list[Path], root: Path = REPO) -> list[str]:
    """What is wrong with the options written on their own (`--when-slower PCT`) in `files`."""
    known = {s for c in COMMANDS for s in options(c)}
    problems = []
    for page in files:
        where = page.relative_to(root)
        for code, context in code_pieces(page.read_text(encoding="utf-8")):
            if COMMAND.search(code) or not code.startswith("-"):
                continue
            option = OPTION.match(code)
            if option is None or option.group(1) in known:
                continue
            program = FOREIGN.get(option.group(1))
            if program is None:
                problems.append(f"{where}: `{code}` is no option of any gpuadvise command")
            elif program not in context.lower():
                problems.append(f"{where}: `{code}` is {program}'s option, but its paragraph does not say so")
    return problems


def test_every_option_written_alone_is_a_gpuadvise_option_or_names_its_program():
    problems = alone_problems(pages())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("paragraph, expected", [
    ("Record more with `--when-slower 20`.", None),
    ("Set `--no-such-thing` to go faster.", "no option of any gpuadvise command"),
    ("Pass `--multi_gpu` to start several processes.", "accelerate's option"),
    ("`accelerate launch` takes `--multi_gpu` for several processes.", None),
])
def test_the_check_of_options_alone_catches_what_a_reader_would(paragraph, expected, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{paragraph}\n", encoding="utf-8")
    found = alone_problems([page], tmp_path)
    assert (found == []) if expected is None else (len(found) == 1 and expected in found[0]), found


def test_every_command_and_option_is_documented():
    """The other way round: a command or an option nobody wrote a word about fails."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages())
    mentioned = {name for p in pages() for code, _ in code_pieces(p.read_text(encoding="utf-8"))
                 for name, _, _ in command_segments(code)}
    missing = [f"gpuadvise {c}" for c in COMMANDS if c not in mentioned]
    for command in COMMANDS:
        for action in parser(command)._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            if not any(re.search(rf"`[^`]*(?<![\w-]){re.escape(s)}(?![\w-])[^`]*`", text) for s in action.option_strings):
                missing.append(f"gpuadvise {command} {'/'.join(action.option_strings)}")
    assert not missing, "documented nowhere in docs/ or README.md:\n" + "\n".join(missing)


@pytest.mark.parametrize("snippet, expected", [
    ("gpuadvise analyze RUN --fail-on high", []),
    ("gpuadvise analyze RUN --no-such-option", ["--no-such-option"]),
    ("gpuadvise analyze RUN --format yaml", ["yaml"]),
    ("gpuadvise analyze RUN --format text\\|md", []),
    ("gpuadvise profile -o runs/x train.py --lr 3e-4", []),  # the script's own options are not profile's
    ("gpuadvise profile --bogus train.py", ["--bogus"]),
    ("gpuadvise frobnicate RUN", ["frobnicate"]),
])
def test_the_check_catches_what_a_reader_would(snippet, expected, tmp_path):
    """The checker itself, on pages written for it: a wrong option, value or command is reported."""
    page = tmp_path / "page.md"
    page.write_text(f"Run `{snippet}` now.\n\n```sh\n{snippet}   # a comment --not-an-option\n```\n", encoding="utf-8")
    found = command_problems([page], tmp_path)
    assert len(found) == 2 * len(expected)  # once in the span, once in the block
    for word in expected:
        assert all(word in line for line in found)

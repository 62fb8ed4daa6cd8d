"""The parts of a command line as deny and ask rules read them: as widely as possible.

A part is one argv that might run: every wrapper layer (`timeout 5 git push` gives
`timeout 5 git push` and `git push`), what a shell string holds (pipelines, lists,
subshells, substitutions, if/for/while and function bodies), what `eval`, `su -c`,
`sudo`, `find -exec`, `git bisect run`, `git rebase -x` ... start, and, for a string
bashlex cannot parse, every run of words between shell punctuation. Allow rules never
read parts: they read `dispatcher.policy.reading`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.policy.git_reading import git_nested_commands, git_settings_in_variables
from dispatcher.policy.program_facts import (
    COMMAND_VARIABLE,
    PRIVILEGE_WRAPPERS,
    SHELLS,
    WrapperSpec,
)
from dispatcher.policy.programs import Nested, option_values
from dispatcher.policy.shell import (
    UnreadableCommand,
    command_name,
    dash_quoting,
    decode_ansi_c,
    find_exec_commands,
    option_value,
    parse_trees,
    shell_invocation,
    shell_readings,
    unwrap_once,
    word_value,
)

MAX_DEPTH = 8
MAX_LAYERS = 32
# A command this long that cannot be parsed is one part (guessing tries every word as a
# start: quadratic). The guard blocks any shell string over shell.MAX_SHELL_TEXT.
MAX_GUESSED_TEXT = 8 * 1024
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# `su -c STRING` / `runuser [USER] -c STRING` run a shell string.
SU_SPEC = WrapperSpec("cgGsw", frozenset({"command", "session-command", "group", "shell"}))


@dataclass(frozen=True)
class Part:
    """One argv a command line might run."""

    argv: tuple[str, ...]


@dataclass(frozen=True)
class CommandParts:
    parts: tuple[Part, ...]
    unparsed: str | None = None  # why the parts are only guessed from the text


@functools.lru_cache(maxsize=2048)
def command_parts(argv: tuple[str, ...]) -> CommandParts:
    """Every part of an argv (no shell), or guesses when it cannot be parsed."""
    try:
        parts = _argv_parts(list(argv), 0)
    except (UnreadableCommand, RecursionError) as error:
        return CommandParts(tuple(_guess_parts(argv)), str(error) or "nested too deeply")
    return CommandParts(tuple(dict.fromkeys(parts)))


def _argv_parts(argv: list[str], depth: int) -> list[Part]:
    if depth > MAX_DEPTH:
        raise UnreadableCommand(f"more than {MAX_DEPTH} nested shells or wrappers")
    parts: list[Part] = []
    layer: list[str] | None = argv
    for _ in range(MAX_LAYERS):
        if not layer:
            return parts
        parts.append(Part(tuple(layer)))
        parts.extend(_started_by(layer, depth))
        layer = unwrap_once(layer)
    raise UnreadableCommand(f"more than {MAX_LAYERS} nested wrapper commands")


def _started_by(argv: list[str], depth: int) -> list[Part]:
    """The parts one layer starts by itself: a shell's string, eval's words, su -c,
    sudo's operand, and `nested_commands` (find -exec, git bisect run ...)."""
    name = command_name(argv[0])
    parts: list[Part] = []
    if name in SHELLS:
        invocation = shell_invocation(argv)
        if invocation.command_string is not None:
            parts.extend(parse_shell(invocation.command_string, depth + 1, name))
        elif invocation.c_flag:
            raise UnreadableCommand(f"'{name} -c' without a visible command string")
    if name == "eval" and len(argv) > 1:
        parts.extend(parse_shell(" ".join(argv[1:]), depth + 1))
    if name in ("su", "runuser"):
        text = option_value(argv[1:], SU_SPEC, "c", "command")
        if text is None:
            text = option_value(argv[1:], SU_SPEC, "", "session-command")
        if text is not None:
            parts.extend(parse_shell(text, depth + 1))
    if name in PRIVILEGE_WRAPPERS:
        operand = _privileged_operand(argv, PRIVILEGE_WRAPPERS[name])
        if operand:
            parts.extend(_argv_parts(operand, depth + 1))
    assignments = [arg for arg in argv[1:] if ASSIGNMENT.match(arg)] if name == "env" else []
    for nested in [*nested_commands(argv), *variable_commands(assignments)]:
        parts.extend(_nested_parts(nested, depth))
    return parts


def _nested_parts(nested: Nested, depth: int) -> list[Part]:
    if nested.text is not None:
        return parse_shell(nested.text, depth + 1)
    return _argv_parts(list(nested.argv), depth + 1) if nested.argv else []


def variable_commands(assignments: Sequence[str]) -> list[Nested]:
    """The commands variables set for a command carry: a program runs the value of
    `GIT_SSH_COMMAND`, `PAGER`, `GIT_CONFIG_VALUE_n` ... as a command, and git runs the
    commands of the settings in `GIT_CONFIG_PARAMETERS`."""
    found = [
        Nested(text=assignment.split("=", 1)[1])
        for assignment in assignments
        if COMMAND_VARIABLE.match(assignment)
    ]
    return found + git_settings_in_variables(assignments)


def _privileged_operand(argv: list[str], with_value: str) -> list[str]:
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[i + 1 :]
        if arg.startswith("-") and len(arg) > 1:
            i += 2 if arg[-1] in with_value and len(arg) == 2 else 1
        elif ASSIGNMENT.match(arg):
            i += 1
        else:
            return argv[i:]
    return []


def _guess_parts(argv: Sequence[str]) -> list[Part]:
    """For a command that cannot be parsed: every plausible simple command in its text.
    Splits on shell punctuation and tries every word as a start."""
    text = " ".join(argv)
    if len(text) > MAX_GUESSED_TEXT:
        return [Part(tuple(argv))]
    # as bash decodes `$'...'`, and as dash reads it (a `$` and a quoted string)
    texts = (decode_ansi_c(text, strict=False), dash_quoting(text))
    pieces = [
        piece
        for read in texts
        for piece in re.split(r"[;&|()`\n{}<>]|\$\(|\bthen\b|\bdo\b|\belse\b", read)
    ]
    parts: list[Part] = []
    for piece in pieces:
        words = [re.sub(r"[\"'\\]", "", word) for word in piece.split()]
        words = [w for w in words if w]
        parts.extend(Part(tuple(words[start:])) for start in range(len(words)))
    return parts


def parse_shell(text: str, depth: int, shell: str = "sh") -> list[Part]:
    """Every simple command in a shell string (pipelines, lists, subshells, `$( )`,
    backticks, process substitution, if/for/while bodies, functions), as parts; read as
    `shell` reads it (sh, dash or a shell not known: both as bash and as dash)."""
    if depth > MAX_DEPTH:
        raise UnreadableCommand(f"more than {MAX_DEPTH} nested shells")
    parts: list[Part] = []
    for reading in shell_readings(text, shell):
        if not reading.strip():
            continue
        for tree in parse_trees(reading):  # also refuses substitutions bashlex would not show
            _walk(tree, parts, depth, reading)
    return parts


def _walk(node: Any, parts: list[Part], depth: int, text: str) -> None:
    if getattr(node, "kind", "") == "command":
        words = [word_value(part, text) for part in node.parts if part.kind == "word"]
        if words:
            parts.extend(_argv_parts(words, depth + 1))
        assignments = [word_value(p, text) for p in node.parts if p.kind == "assignment"]
        for nested in variable_commands(assignments):
            parts.extend(_nested_parts(nested, depth))
    for name in ("parts", "list"):
        for child in getattr(node, name, None) or []:
            _walk(child, parts, depth, text)
    for name in ("command", "output", "heredoc", "body"):
        child = getattr(node, name, None)
        if child is not None and hasattr(child, "kind"):
            _walk(child, parts, depth, text)


def nested_commands(argv: Sequence[str]) -> list[Nested]:
    """The commands `argv` starts by itself, read widely: `find -exec CMD ;`, git's
    `bisect run CMD`, `rebase -x CMD`, `grep -O CMD`, `submodule foreach CMD`, config
    values git runs (`-c core.fsmonitor=CMD`, `git config core.pager CMD`) and alias
    definitions; `trap CMD`, `alias x=CMD`, `mapfile -C CMD`, `compgen -C CMD`, `hash -p PATH name`."""
    if not argv:
        return []
    name, args = command_name(argv[0]), list(argv[1:])
    if name in ("find", "gfind"):
        return [Nested(tuple(command)) for command in find_exec_commands(list(argv))]
    if name == "git":
        return git_nested_commands(args)
    if name == "trap":
        operands = [arg for arg in args if not arg.startswith("-")]
        return [Nested(text=operands[0])] if operands else []
    if name == "alias":
        return [Nested(text=arg.split("=", 1)[1]) for arg in args if "=" in arg]
    if name in ("compgen", "complete"):  # `-C CMD`: a command that lists completions
        return [Nested(text=value) for value in option_values(args, "C", ())]
    if name in ("mapfile", "readarray"):
        return [Nested(text=value) for value in option_values(args, "C", ())]
    if name == "hash":
        return [Nested((value,)) for value in option_values(args, "p", ())]
    return []

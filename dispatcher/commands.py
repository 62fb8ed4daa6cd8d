"""Reading argv lists and shell strings the way the command guard needs them.

Nothing here decides anything: these helpers only say what a command line would run.
`dispatcher.guards.command_blocklist` applies the policy. Every helper is pure (no I/O)
and raises `UnreadableCommand` when it cannot tell what would run, so the guard can
fail closed.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import bashlex

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh"})
MAX_WRAPPERS = 32


class UnreadableCommand(Exception):
    """The command cannot be read statically; the message says why."""


@dataclass(frozen=True)
class WrapperSpec:
    """How a wrapper's own options look, so the wrapped command can be found after them."""

    short_with_value: str = ""
    long_with_value: frozenset[str] = frozenset()
    leading_operands: int = 0  # operands before the command (timeout's DURATION)


WRAPPERS: dict[str, WrapperSpec] = {
    "env": WrapperSpec("uCS", frozenset({"unset", "chdir", "split-string"})),
    "timeout": WrapperSpec("sk", frozenset({"signal", "kill-after"}), leading_operands=1),
    "nice": WrapperSpec("n", frozenset({"adjustment"})),
    "nohup": WrapperSpec(),
    "xargs": WrapperSpec(
        "adEILnPs",
        frozenset(
            {"arg-file", "delimiter", "eof", "replace", "max-lines", "max-args", "max-procs"}
            | {"max-chars", "process-slot-var"}
        ),
    ),
    "command": WrapperSpec(),
    "builtin": WrapperSpec(),
    "exec": WrapperSpec("a"),
    "time": WrapperSpec("fo", frozenset({"format", "output"})),
    "stdbuf": WrapperSpec("ioe", frozenset({"input", "output", "error"})),
    "setsid": WrapperSpec(),
    "busybox": WrapperSpec(),
}


# What the shell would expand in a word: $VAR, ${...}, $(...), `...`, and {a,b} braces.
EXPANSIONS = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|`[^`]*`|\$\w+|\$")
BRACES = re.compile(r"\{[^{}]*,[^{}]*\}")
GLOB_CHARACTERS = re.compile(r"[*?\[]")


def could_be(word: str, literal: str) -> bool:
    """True when `word` is `literal`, or might become it once a shell expands it.

    Globs (`su?o`), braces (`{push,x}`) and expansions (`$x`) are read as wildcards, so
    this over-approximates: it is for deciding what to block, never what to allow.
    """
    if word == literal:
        return True
    pattern = BRACES.sub("*", EXPANSIONS.sub("*", word))
    return bool(GLOB_CHARACTERS.search(pattern)) and fnmatch.fnmatchcase(literal, pattern)


def matching_name(word: str, names: frozenset[str] | tuple[str, ...]) -> str | None:
    """The first of `names` (sorted) that `word` could be, or None."""
    return next((name for name in sorted(names) if could_be(word, name)), None)


def is_computed(word: str) -> bool:
    """True when a word holds a parameter or command expansion ($x, ${x}, $(...), `...`)."""
    return "$" in word or "`" in word


def command_name(word: str) -> str:
    """The name a command is known by: `/usr/bin/sudo` counts as `sudo`."""
    return posixpath.basename(word.rstrip("/")) if word else ""


def skip_options(args: list[str], spec: WrapperSpec) -> int:
    """Index of the first operand in `args`, reading options getopt-style per `spec`."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return i + 1
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            i += 2 if name in spec.long_with_value and "=" not in arg else 1
        elif arg.startswith("-") and len(arg) > 1:
            i += 1 + _short_cluster_takes_next(arg[1:], spec.short_with_value)
        else:
            return i
    return i


def _short_cluster_takes_next(letters: str, with_value: str) -> int:
    """1 if the cluster `-abc` ends in an option whose value is the next argument."""
    for position, letter in enumerate(letters):
        if letter in with_value:
            return 1 if position == len(letters) - 1 else 0
    return 0


def unwrap(argv: list[str]) -> list[str]:
    """The command a chain of wrappers (`env`, `timeout 5`, `nice -n 5`, `xargs` ...) runs.

    Returns [] when the wrappers run nothing (`env` alone, `command -v x`).
    Raises UnreadableCommand when the chain is implausibly deep.
    """
    for _ in range(MAX_WRAPPERS):
        if not argv:
            return []
        name = command_name(argv[0])
        spec = WRAPPERS.get(name)
        if spec is None:
            return argv
        rest = argv[1:]
        if name == "command" and rest[:1] and rest[0] in ("-v", "-V"):
            return []  # a lookup, not a run
        if name == "env":
            rest = _expand_env_split_string(rest)
        start = skip_options(rest, spec) + spec.leading_operands
        rest = rest[start:]
        if name == "env":
            while rest and "=" in rest[0] and not rest[0].startswith("="):
                rest = rest[1:]  # NAME=value assignments
        argv = rest
    raise UnreadableCommand(f"more than {MAX_WRAPPERS} nested wrapper commands")


def _expand_env_split_string(args: list[str]) -> list[str]:
    """`env -S 'a b'` runs `a b`: splice the split string in where the option was."""
    for i, arg in enumerate(args):
        if not arg.startswith("-") or arg == "--":
            return args
        text: str | None = None
        if arg in ("-S", "--split-string"):
            text = args[i + 1] if i + 1 < len(args) else ""
            tail = args[i + 2 :]
        elif arg.startswith("--split-string="):
            text, tail = arg.split("=", 1)[1], args[i + 1 :]
        elif arg.startswith("-S"):
            text, tail = arg[2:], args[i + 1 :]
        if text is not None:
            try:
                return [*args[:i], *shlex.split(text), *tail]
            except ValueError as error:
                raise UnreadableCommand(f"env -S string cannot be split: {error}") from error
    return args


@dataclass(frozen=True)
class ShellInvocation:
    """What a shell (`sh`, `bash` ...) was asked to run."""

    command_string: str | None  # the STRING of `-c STRING`
    script: str | None  # a script operand (`bash build.sh`)
    reads_stdin: bool  # no -c and no script: commands come from standard input
    c_flag: bool = False  # -c was given (with or without its STRING)


def shell_invocation(argv: list[str]) -> ShellInvocation:
    """Read a shell's arguments: `-c STRING`, a script operand, or standard input."""
    args, i = argv[1:], 0
    c_flag = s_flag = False
    while i < len(args):
        arg = args[i]
        if arg in ("--", "-"):
            i += 1
            break
        if arg in ("--rcfile", "--init-file"):
            i += 2
        elif arg.startswith("--"):
            i += 1
        elif arg[:1] in ("-", "+") and len(arg) > 1:
            letters = arg[1:]
            # `-$x` might be `-c`: read a computed or wildcard cluster as one that is
            unknown = is_computed(letters) or bool(GLOB_CHARACTERS.search(letters))
            c_flag = c_flag or (arg[0] == "-" and ("c" in letters or unknown))
            s_flag = s_flag or (arg[0] == "-" and "s" in letters)
            i += 2 if letters[-1] in "oO" else 1
        else:
            break
    operands = args[i:]
    if c_flag:
        return ShellInvocation(operands[0] if operands else None, None, False, c_flag=True)
    if s_flag or not operands or operands[0] in ("-", "/dev/stdin"):
        return ShellInvocation(None, None, True)
    return ShellInvocation(None, operands[0], False)


@dataclass(frozen=True)
class ScriptCommand:
    """One simple command found in a shell string, wherever it sits (pipeline, $(...), if)."""

    argv: list[str]
    piped_from: list[list[str]] = field(default_factory=list)  # earlier pipeline stages
    stdin_text: bool = False  # fed by a here-string or here-document


def parse_script(text: str) -> list[ScriptCommand]:
    """Every simple command in the shell string `text`, in source order.

    Raises UnreadableCommand when bashlex cannot parse it (arithmetic, `case`, `time` ...).
    """
    try:
        trees = bashlex.parse(text)
    except Exception as error:  # bashlex raises several unrelated types
        raise UnreadableCommand(f"the shell string cannot be parsed ({error})") from error
    found: list[ScriptCommand] = []
    for tree in trees:
        found.extend(_commands_in(tree, []))
    return found


def _commands_in(node: Any, piped_from: list[list[str]]) -> Iterator[ScriptCommand]:
    """Walk a bashlex tree; pipeline stages after the first know what feeds them."""
    kind = getattr(node, "kind", "")
    if kind == "pipeline":
        upstream = list(piped_from)
        for stage in node.parts:
            if stage.kind in ("pipe", "reservedword"):
                continue
            stage_commands = list(_commands_in(stage, list(upstream)))
            yield from stage_commands
            upstream.extend(command.argv for command in stage_commands)
        return
    if kind == "command":
        words = [part.word for part in node.parts if part.kind == "word"]
        redirects = [part for part in node.parts if part.kind == "redirect"]
        stdin_text = any(part.type in ("<<", "<<<") for part in redirects)
        if words:
            yield ScriptCommand(words, piped_from, stdin_text)
    for child in _children(node):
        yield from _commands_in(child, piped_from if kind != "command" else [])


def _children(node: Any) -> Iterator[Any]:
    for name in ("parts", "list"):
        yield from getattr(node, name, None) or []
    for name in ("command", "output", "heredoc"):
        child = getattr(node, name, None)
        if child is not None and hasattr(child, "kind"):
            yield child


def find_exec_commands(argv: list[str]) -> list[list[str]]:
    """The commands `find ... -exec CMD ... ;` (and -execdir, -ok, -okdir) would run."""
    found: list[list[str]] = []
    args = argv[1:]
    i = 0
    while i < len(args):
        if args[i] in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(args) and args[end] not in (";", "+"):
                end += 1
            found.append(args[i + 1 : end])
            i = end
        i += 1
    return found

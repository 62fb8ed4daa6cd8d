"""Reading argv lists and shell strings widely: everything a command line could run.

This is the generous reading that deny and ask rules and the command guard need (any
part, any wrapper, any spelling): it over-approximates. Allow rules and grants use the
strict reader in `dispatcher.policy.reading` instead. Nothing here decides anything;
every helper is pure (no I/O) and raises `UnreadableCommand` when it cannot tell what
would run, so the guard can fail closed.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import posixpath
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dispatcher.policy.program_facts import (
    PACKAGE_RUNNER,
    PACKAGE_RUNNER_SUBCOMMANDS,
    WIDE_WRAPPERS,
    WrapperSpec,
)
from dispatcher.policy.program_facts import SHELLS as SHELLS  # what dispatcher.analytics reads

# Shells that read `$'...'` as ANSI-C quoting. Any other (sh, which is dash on Debian, and
# a string whose shell is not known) is read both ways (see `shell_readings`).
ANSI_C_SHELLS = frozenset({"bash", "zsh", "ksh", "ksh93", "mksh", "lksh"})
MAX_WRAPPERS = 32
# The largest shell string the wide reading parses: bashlex is slow per character
# (most for many short words, operators and expansions: `a;a;a;...`), so a longer string,
# or one of more words, operators and expansions, is unreadable and the guard blocks it
# (a string under both limits costs about half a second at most).
MAX_SHELL_TEXT = 32 * 1024
MAX_SHELL_TOKENS = 2000
# words, operators, and each `$` or backtick (an expansion is a node of its own)
SHELL_TOKEN = re.compile(r"[^\s;&|()<>$`]+|[;&|()<>]+|[$`]")


def too_big_to_read(text: str) -> str | None:
    """Why the shell string `text` is too big for the wide reading, or None."""
    if len(text) > MAX_SHELL_TEXT:
        return (
            f"the shell string is too long to check ({len(text)} characters, over {MAX_SHELL_TEXT})"
        )
    tokens = sum(1 for _ in itertools.islice(SHELL_TOKEN.finditer(text), MAX_SHELL_TOKENS + 1))
    if tokens > MAX_SHELL_TOKENS:
        return (
            f"the shell string has too many words and operators to check (over {MAX_SHELL_TOKENS})"
        )
    return None


class UnreadableCommand(Exception):
    """The command cannot be read statically; the message says why."""


WRAPPERS = WIDE_WRAPPERS
PACKAGE_RUNNER_SPEC = PACKAGE_RUNNER


# What the shell would expand in a word: $VAR, ${...}, $(...), `...`, and {a,b} braces.
EXPANSIONS = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|`[^`]*`|\$\w+|\$")
BRACES = re.compile(r"\{[^{}]*,[^{}]*\}")
GLOB_CHARACTERS = re.compile(r"[*?\[]")
SPECIAL_CHARACTERS = re.compile(r"[*?\[{$`]")


def could_be(word: str, literal: str) -> bool:
    """True when `word` is `literal`, or might become it once a shell expands it.

    Globs (`su?o`), braces (`{push,x}`) and expansions (`$x`) are read as wildcards, so
    this over-approximates: it is for deciding what to block, never what to allow.
    """
    if word == literal:
        return True
    if not SPECIAL_CHARACTERS.search(word):
        return False  # a literal word: only itself
    pattern = BRACES.sub("*", EXPANSIONS.sub("*", word))
    return bool(GLOB_CHARACTERS.search(pattern)) and fnmatch.fnmatchcase(literal, pattern)


def matching_name(word: str, names: frozenset[str] | tuple[str, ...]) -> str | None:
    """The first of `names` (sorted) that `word` could be, or None."""
    return next((name for name in sorted(names) if could_be(word, name)), None)


def is_computed(word: str) -> bool:
    """True when a word holds a parameter or command expansion ($x, ${x}, $(...), `...`)."""
    return "$" in word or "`" in word


def command_name(word: str) -> str:
    """The name a command is known by: `/usr/bin/sudo` counts as `sudo`, and so does zsh's
    `=sudo` (which zsh expands to sudo's path). Lower-cased: on a case-insensitive file
    system (macOS's default, where a hook's command runs) `SUDO` and `Git` run sudo and git."""
    if word.startswith("=") and len(word) > 1:
        word = word[1:]
    return posixpath.basename(word.rstrip("/")).lower() if word else ""


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

    Returns [] when the wrappers run nothing (`env` alone, `command -v x`). A wrapper that
    runs a shell string (`flock F -c STRING`, `watch 'a b'`) gives `['sh', '-c', STRING]`;
    one that starts an interactive shell (`chroot /`, `script`) gives `['sh']`.
    Raises UnreadableCommand when the chain is implausibly deep.
    """
    return unwrap_chain(argv)[0]


def unwrap_chain(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """`unwrap`, plus the names of the wrappers looked through, outermost first."""
    names: list[str] = []
    for _ in range(MAX_WRAPPERS):
        if not argv:
            return [], tuple(names)
        name = command_name(argv[0])
        inner = _unwrap_once(name, argv[1:])
        if inner is None:
            return argv, tuple(names)
        names.append(name)
        argv = inner
    raise UnreadableCommand(f"more than {MAX_WRAPPERS} nested wrapper commands")


def unwrap_once(argv: list[str]) -> list[str] | None:
    """What the wrapper `argv[0]` runs ([] for nothing), or None when it is no wrapper."""
    return _unwrap_once(command_name(argv[0]), argv[1:]) if argv else None


def _unwrap_once(name: str, rest: list[str]) -> list[str] | None:
    """What the wrapper `name` with arguments `rest` runs, or None when it is no wrapper."""
    if name.startswith("git-") and len(name) > 4:
        # git's own programs (`/usr/lib/git-core/git-push` is git): `git-X` runs `git X`
        return ["git", name[4:], *rest]
    if name == "corepack":
        return _corepack_command(rest)
    if name == "jobs":
        return _jobs_command(rest)
    if name == "env":
        return _env_command(rest)
    if name in PACKAGE_RUNNER_SUBCOMMANDS:
        at = _runner_subcommand(name, rest)
        return None if at is None else _run_package(rest[at + 1 :])
    spec = WRAPPERS.get(name)
    if spec is None:
        return None
    if name == "command" and rest[:1] and rest[0] in ("-v", "-V"):
        return []  # a lookup, not a run
    if name == "script":
        text = option_value(rest, spec, "c", "command")
        return ["sh"] if text is None else ["sh", "-c", text]
    if name in ("npx", "pnpx", "bunx"):
        return _run_package(rest)
    if name == "sg":
        return _sg_command(rest)
    start = skip_options(rest, spec)
    options, rest = rest[:start], rest[start:]
    for _ in range(spec.leading_operands):
        if rest and rest[0] != "--" and re.fullmatch(spec.leading_pattern or ".*", rest[0]):
            rest = rest[1:]
    if name == "flock":
        return _flock_command(rest)
    if name == "watch" and rest:
        executes = any(o == "--exec" or (o[:2] != "--" and "x" in o) for o in options)
        return rest if executes else ["sh", "-c", " ".join(rest)]
    if not rest and spec.shell_when_empty:
        return ["sh"]
    return rest


def _jobs_command(rest: list[str]) -> list[str] | None:
    """bash's `jobs -x CMD ARGS` runs CMD; any other `jobs` is no wrapper (None)."""
    for i, arg in enumerate(rest):
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return None
        if "x" in arg:
            return rest[i + 1 :]
    return None


def _flock_command(rest: list[str]) -> list[str]:
    """`flock FILE CMD ...` runs CMD; `flock FILE -c STRING` runs a shell string."""
    if len(rest) < 2:
        return []  # `flock FD`: locks, runs nothing
    if rest[1] in ("-c", "--command"):
        return ["sh", "-c", *rest[2:3]]
    if rest[1].startswith("--command="):
        return ["sh", "-c", rest[1].split("=", 1)[1]]
    return rest[1:]


def _sg_command(rest: list[str]) -> list[str]:
    """`sg [-] GROUP [-c] COMMAND`: COMMAND is a string for `/bin/sh -c`."""
    if rest[:1] == ["-"]:
        rest = rest[1:]
    rest = rest[1:]  # GROUP
    if rest[:1] == ["-c"]:
        rest = rest[1:]
    return ["sh", "-c", " ".join(rest)] if rest else ["sh"]


def _runner_subcommand(name: str, args: list[str]) -> int | None:
    """Index of `exec` in `npm [options] exec ...` (`x`, `dlx` ...), or None."""
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        if arg in PACKAGE_RUNNER_SUBCOMMANDS[name]:
            return i
        if arg.startswith("-"):
            continue
        previous = args[i - 1] if i else ""
        if not (previous.startswith("--") and "=" not in previous):
            return None  # the subcommand is another one (`npm test`)
    return None


def _run_package(args: list[str]) -> list[str]:
    """What `npx [options] PKG ARGS`, `npm exec -- PKG ARGS`, `npx -c STRING` run."""
    text = option_value(args, PACKAGE_RUNNER_SPEC, "c", "call")
    if text is not None:
        return ["sh", "-c", text]
    rest = args[skip_options(args, PACKAGE_RUNNER_SPEC) :]
    if not rest:
        return []
    program = rest[0]
    if "@" in program[1:]:  # `npm@10` runs `npm`
        program = program[0] + program[1:].split("@", 1)[0]
    return [program, *rest[1:]]


def option_value(args: list[str], spec: WrapperSpec, short: str, long: str) -> str | None:
    """The value of option `-X VALUE` / `-XVALUE` / `--long VALUE` / `--long=VALUE` in
    `args`, read getopt-style with options anywhere (before `--`); None when absent."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return None
        if arg.startswith("--"):
            option, equals, value = arg[2:].partition("=")
            if option == long:
                return value if equals else (args[i + 1] if i + 1 < len(args) else "")
            i += 2 if option in spec.long_with_value and not equals else 1
            continue
        if arg.startswith("-") and len(arg) > 1:
            for position, letter in enumerate(arg[1:], start=2):
                if letter == short:
                    if position < len(arg):
                        return arg[position:]
                    return args[i + 1] if i + 1 < len(args) else ""
                if letter in spec.short_with_value:
                    i += 1 if position < len(arg) else 2
                    break
            else:
                i += 1
            continue
        i += 1
    return None


# GNU env's long options; True = takes a value. Any unique prefix works (`--sp 'x'`).
ENV_LONG_OPTIONS = {
    "ignore-environment": False, "null": False, "unset": True, "chdir": True,
    "split-string": True, "block-signal": False, "default-signal": False,
    "ignore-signal": False, "list-signal-handling": False, "debug": False,
}  # fmt: skip


def _env_command(args: list[str]) -> list[str]:
    """What `env [OPTION]... [NAME=VALUE]... [COMMAND [ARG]...]` runs, read like getopt:
    clusters (`-iS`, `-0S`, `-vu X`), values attached or not, abbreviated long options,
    and `-S STRING` split into words that are read as options and command again."""
    args, i = list(args), 0
    for _ in range(MAX_WRAPPERS * 4):
        if i >= len(args):
            break
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg == "-":
            i += 1
            continue
        if arg.startswith("--"):
            typed, equals, value = arg[2:].partition("=")
            names = [name for name in ENV_LONG_OPTIONS if typed and name.startswith(typed)]
            if "split-string" in names:
                text = value if equals else (args[i + 1] if i + 1 < len(args) else "")
                args[i:] = [*_split_env_string(text), *args[i + (1 if equals else 2) :]]
                continue
            takes_value = any(ENV_LONG_OPTIONS[name] for name in names)
            i += 2 if takes_value and not equals else 1
            continue
        if not arg.startswith("-"):
            break
        for position, letter in enumerate(arg[1:], start=2):
            if letter in "uC":
                i += 1 if position < len(arg) else 2
                break
            if letter == "S":
                attached = arg[position:]
                text = attached or (args[i + 1] if i + 1 < len(args) else "")
                rest = args[i + (1 if attached else 2) :]
                args[i:] = [*_split_env_string(text), *rest]
                break
        else:
            i += 1
    else:
        raise UnreadableCommand("env options nest too deeply")
    while i < len(args) and "=" in args[i] and not args[i].startswith("="):
        i += 1  # NAME=value assignments
    return args[i:]


def _split_env_string(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise UnreadableCommand(f"env -S string cannot be split: {error}") from error


def _corepack_command(args: list[str]) -> list[str] | None:
    """`corepack [options] npm|pnpm|yarn[@version] ARGS` runs that package manager."""
    rest = args[skip_options(args, WrapperSpec()) :]
    if not rest:
        return []
    tool = rest[0].split("@", 1)[0]
    if tool in ("npm", "npx", "pnpm", "pnpx", "yarn", "yarnpkg"):
        return [tool, *rest[1:]]
    return None


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
    assignments: tuple[str, ...] = ()  # NAME=value words before the command


def parse_trees(text: str) -> list[Any]:
    """bashlex's trees for the shell string `text`, when they show every command it runs.

    Raises UnreadableCommand when bashlex cannot parse it (arithmetic, `case`, `time` ...)
    or would hide a command substitution (see `hidden_substitution`). Cached: callers must
    not change the trees.
    """
    trees = _parse_trees(text)
    if isinstance(trees, UnreadableCommand):
        raise UnreadableCommand(str(trees))
    return list(trees)


@functools.lru_cache(maxsize=2048)
def _parse_trees(text: str) -> tuple[Any, ...] | UnreadableCommand:
    too_big = too_big_to_read(text)
    if too_big is not None:
        return UnreadableCommand(too_big)
    try:
        return tuple(_parse_trees_uncached(text))
    except UnreadableCommand as error:
        return error
    except RecursionError:
        return UnreadableCommand("the shell string nests too deeply to check")


def _parse_trees_uncached(text: str) -> list[Any]:
    hidden = hidden_substitution(text)
    if hidden is not None:
        raise UnreadableCommand(hidden)
    import bashlex  # (here, not at load: its parser tables cost every process's start-up)

    try:
        trees: list[Any] = bashlex.parse(text)
    except Exception as error:  # bashlex raises several unrelated types
        raise UnreadableCommand(f"the shell string cannot be parsed ({error})") from error
    for tree in trees:
        heredoc = _heredoc_with_substitution(tree)
        if heredoc:
            raise UnreadableCommand("a here-document runs a command substitution")
    return trees


# A word-initial tilde prefix (`~user`) that holds an expansion: bashlex keeps it whole,
# unread (`HEAD~$(x)` is no tilde prefix, and bashlex reads it).
TILDE_EXPANSION = re.compile(r"(?<![\w.@^+/~-])~[^/\s;&|<>]*?[$`]")


# `${a[i]}` evaluates `i` as arithmetic, and `i` may hold `a[$(cmd)]`; `${a[0]}`, `${a[@]}`
# and `${a[*]}` do not.
TRANSFORMATION = re.compile(r"[#!]?\w+(\[[^\]]*\])?@[A-Za-z]")  # ${x@P}, ${a[0]@P}
SUBSCRIPT = re.compile(r"^[#!]?\w+\[(?![0-9]+\]|[@*]\])")


def hidden_substitution(text: str) -> str | None:
    """Why bashlex would not show every command substitution in `text`, or None.

    bashlex does not read inside `${...}` nor a `~` prefix, so `${x:-$(cmd)}`,
    `${x#`cmd`}`, `${x:-${y:-$(cmd)}}`, `${!x}` (indirection can evaluate a subscript)
    and `~$(cmd)` hide `cmd`; `${x@P}` expands a prompt string (running the `$(cmd)`
    it holds) and `${a[i]}` evaluates `i`, which may hold `a[$(cmd)]`. Quotes are read
    so that a body is never cut short; a plain `${HOME}` is fine.
    """
    i, n = 0, len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith("${", i):
            body = _parameter_body(text, i + 2)
            shown = text[i : i + 2 + len(body) + 1]
            if "$(" in body or "`" in body or "${" in body or body.startswith("!"):
                return f"a command or expansion inside a parameter expansion ({shown!r})"
            if TRANSFORMATION.match(body):
                return f"a parameter transformation that can run commands ({shown!r})"
            if SUBSCRIPT.search(body):
                return f"an array subscript evaluated as arithmetic ({shown!r})"
        elif text[i] == "~" and TILDE_EXPANSION.match(text, i):
            return f"an expansion in a tilde prefix ({text[i : i + 12]!r}...)"
        i += 1
    return None


def _parameter_body(text: str, start: int) -> str:
    """The text of `${...}` from `start` to its closing brace, the longest a shell could read:
    with single quotes read as quotes and as literal characters (bash differs inside double
    quotes), the later closing brace wins; no closing brace means the rest of the text."""
    ends = [_closing_brace(text, start, single_quotes) for single_quotes in (True, False)]
    return text[start : max(ends)]


def _closing_brace(text: str, start: int, single_quotes: bool) -> int:
    i, n, quote = start, len(text), ""
    while i < n:
        char = text[i]
        if quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            i += 1
        elif quote == '"':
            quote = "" if char == '"' else quote
        elif char == '"' or (char == "'" and single_quotes):
            quote = char
        elif char == "}":
            return i
        i += 1
    return n


def _heredoc_with_substitution(tree: Any) -> bool:
    """A here-document body may run `$(...)` or backticks, which bashlex does not parse.
    (Walked with a stack: a long word of many quoted pieces is a deep tree.)"""
    stack = [tree]
    while stack:
        node = stack.pop()
        if getattr(node, "kind", "") == "heredoc":
            value = str(getattr(node, "value", ""))
            if "$(" in value or "`" in value or hidden_substitution(value) is not None:
                return True
            continue
        stack.extend(getattr(node, "parts", None) or [])
        stack.extend(getattr(node, "list", None) or [])
        for name in ("command", "output", "heredoc", "body"):
            child = getattr(node, name, None)
            if child is not None and hasattr(child, "kind"):
                stack.append(child)
    return False


def parse_script(text: str) -> list[ScriptCommand]:
    """Every simple command in the shell string `text`, in source order.

    Raises UnreadableCommand when it cannot be read (see `parse_trees`).
    """
    trees = parse_trees(text)
    found: list[ScriptCommand] = []
    for tree in trees:
        found.extend(_commands_in(tree, [], text))
    return found


def _commands_in(node: Any, piped_from: list[list[str]], text: str) -> Iterator[ScriptCommand]:
    """Walk a bashlex tree; pipeline stages after the first know what feeds them."""
    kind = getattr(node, "kind", "")
    if kind == "pipeline":
        upstream = list(piped_from)
        for stage in node.parts:
            if stage.kind in ("pipe", "reservedword"):
                continue
            stage_commands = list(_commands_in(stage, list(upstream), text))
            yield from stage_commands
            upstream.extend(command.argv for command in stage_commands)
        return
    if kind == "command":
        words = [word_value(part, text) for part in node.parts if part.kind == "word"]
        assignments = tuple(
            word_value(part, text) for part in node.parts if part.kind == "assignment"
        )
        redirects = [part for part in node.parts if part.kind == "redirect"]
        stdin_text = any(part.type in ("<<", "<<<") for part in redirects)
        if words:
            yield ScriptCommand(words, piped_from, stdin_text, assignments)
    for child in _children(node):
        yield from _commands_in(child, piped_from if kind != "command" else [], text)


def word_value(node: Any, text: str) -> str:
    """A word's value after quote removal. bashlex removes only a word's outer quotes
    (`'a '"'"'b c'"'"''` reads `a '"'"'b c'"'"'`), so a word holding quotes is read again
    from its source text, as POSIX quote removal reads it; bashlex's word is kept when
    that does not give exactly one word (an expansion with blanks inside: `$(a b)`)."""
    word = str(node.word)
    start, end = getattr(node, "pos", (0, 0))
    raw = text[start:end]
    inner = raw[1:-1] if len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\"" else raw
    if not any(quote in inner for quote in "'\"\\"):
        return word  # no quotes, or one quoted piece: bashlex's word is right
    try:
        tokens = shlex.split(raw)
    except ValueError:
        return word
    return tokens[0] if len(tokens) == 1 else word


def _children(node: Any) -> Iterator[Any]:
    for name in ("parts", "list"):
        yield from getattr(node, name, None) or []
    for name in ("command", "output", "heredoc"):
        child = getattr(node, name, None)
        if child is not None and hasattr(child, "kind"):
            yield child


def find_exec_commands(argv: list[str]) -> list[list[str]]:
    """The commands `find ... -exec CMD ... ;` (and -execdir, -ok, -okdir) could run, read
    widely: CMD ends at `;`, but GNU find ends it at a `+` only right after `{}` (any
    other `+` is an argument: `-exec env -u + sudo id ;` runs `env -u + sudo id`) and BSD
    find at any word starting with `;`, so CMD is taken to each such word and to `;`, and
    the words after the first end are searched for more actions too."""
    found: list[list[str]] = []
    args = argv[1:]
    for i, arg in enumerate(args):
        if arg not in ("-exec", "-execdir", "-ok", "-okdir"):
            continue
        end = i + 1
        while end < len(args) and args[end] != ";":
            if args[end] == "+" or args[end].startswith(";"):
                found.append(args[i + 1 : end])
            end += 1
        found.append(args[i + 1 : end])
    return found


# --- ANSI-C quoting -------------------------------------------------------------------------------

ANSI_C_ESCAPES = {
    "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n",
    "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?",
}  # fmt: skip


def shell_readings(text: str, shell: str = "sh") -> list[str]:
    """The texts to parse (with bashlex, which reads bash) to see every command `shell`
    could run from the string `text`: with `$'...'` decoded for a shell in ANSI_C_SHELLS;
    for sh, dash and a shell not known, also as dash reads it (`$'\\' ; cmd # '` runs
    `cmd` there). Raises UnreadableCommand for an unterminated `$'...'`, and for a string
    over the size limits (`too_big_to_read`)."""
    too_big = too_big_to_read(text)
    if too_big is not None:
        raise UnreadableCommand(too_big)
    decoded = decode_ansi_c(text)
    if shell in ("bash", "zsh"):
        return [decoded]
    if shell in ANSI_C_SHELLS:  # ksh's family: `&>` may be `&` and `>` (see dash_quoting)
        split = dash_quoting(decoded)
        return [decoded] if split == decoded else [decoded, split]
    plain = dash_quoting(text)
    return [decoded] if plain == decoded else [decoded, plain]


def dash_quoting(text: str) -> str:
    """`text` as dash reads it, spelled for bash: dash has no `$'...'` nor `$"..."`, so an
    unquoted `$'` or `$"` is a literal `$` and a quote (`\\$'`, `\\$"` for bash); nor
    `&>`, which it reads as `&` and `>` (`true &>/dev/null sudo id` runs `sudo id`)."""
    out: list[str] = []
    i, n = 0, len(text)
    quote: str | None = None
    while i < n:
        char = text[i]
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            out.append(text[i : i + 2])
            i += 2
            continue
        elif quote == '"':
            quote = None if char == '"' else quote
        elif char == "$" and text[i + 1 : i + 2] in ("'", '"'):
            out.append("\\$")
            i += 1
            continue
        elif char == "&" and text[i + 1 : i + 2] == ">" and text[i - 1 : i] != ">":
            out.append("& ")
            i += 1
            continue
        elif char in "'\"":
            quote = char
        out.append(char)
        i += 1
    return "".join(out)


def decode_ansi_c(text: str, strict: bool = True) -> str:
    """Rewrite `$'...'` (ANSI-C quoting) and `$"..."` as plain single/double quoting.

    bashlex does not decode `$'\\x72m'`; after this it reads `'rm'`.
    """
    out: list[str] = []
    i, n = 0, len(text)
    quote: str | None = None
    while i < n:
        char = text[i]
        if quote == "'":
            out.append(char)
            quote = None if char == "'" else quote
            i += 1
            continue
        if char == "\\" and i + 1 < n:
            out.append(text[i : i + 2])
            i += 2
            continue
        if quote == '"':
            out.append(char)
            quote = None if char == '"' else quote
            i += 1
            continue
        if char == "$" and i + 1 < n and text[i + 1] == "'":
            decoded, i = read_ansi_c(text, i + 2, strict)
            out.append("'" + decoded.replace("'", "'\\''") + "'")
            continue
        if char == "$" and i + 1 < n and text[i + 1] == '"':
            i += 1  # $"..." is a translated string: read it as "..."
            continue
        if char in "'\"":
            quote = char
        out.append(char)
        i += 1
    return "".join(out)


def ansi_c_end(text: str, i: int) -> int | None:
    """Index of the quote closing `$'...'` whose body starts at `text[i]`, found as bash's
    lexer finds it: the first `'` not escaped, each `\\X` pair skipped whole (so `$'\\c'`
    ends at its second quote, and `$'\\''` does not end there). None when it does not end."""
    n = len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2
        elif char == "'":
            return i
        else:
            i += 1
    return None


def read_ansi_c(text: str, i: int, strict: bool) -> tuple[str, int]:
    """Decode the body of `$'...'` from `text[i]` (after the opening quote): (the decoded
    text, the index after the closing quote). The end is found first (`ansi_c_end`), and
    only the body is decoded: no escape reaches past it. Raises UnreadableCommand when it
    does not end and `strict`."""
    end = ansi_c_end(text, i)
    if end is None:
        if strict:
            raise UnreadableCommand("an unterminated $'...' string")
        return decode_ansi_c_body(text[i:]), len(text)
    return decode_ansi_c_body(text[i:end]), end + 1


def decode_ansi_c_body(body: str) -> str:
    """What bash makes of the body of `$'...'` (bash 5.2's `ansicstr`)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        char = body[i]
        if char != "\\" or i + 1 >= n:
            out.append(char)
            i += 1
            continue
        code = body[i + 1]
        if code in ANSI_C_ESCAPES:
            out.append(ANSI_C_ESCAPES[code])
            i += 2
        elif code in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1 :]).group(0)  # type: ignore[union-attr]
            out.append(chr(int(digits, 8) & 0xFF))
            i += 1 + len(digits)
        elif code in "xuU":
            limit = {"x": 2, "u": 4, "U": 8}[code]
            digits = re.match(rf"[0-9A-Fa-f]{{0,{limit}}}", body[i + 2 :]).group(0)  # type: ignore[union-attr]
            if not digits:
                out.append("\\" + code)
            else:
                out.append(chr(int(digits, 16)))
            i += 2 + len(digits)
        elif code == "c" and i + 2 < n:
            # `\cX` is the control character of X (bash reads X as one byte); `\c\\`
            # is that of a backslash (both backslashes are used); `\c` ending the body
            # stays literal.
            target = body[i + 2]
            i += 3
            if target == "\\" and body[i : i + 1] == "\\":
                i += 1
            byte = target.upper().encode()[0] if target.isascii() else target.encode()[0]
            out.append("\x7f" if target == "?" else chr(byte & 0x1F))
        else:
            out.append("\\" + code)
            i += 2
    return "".join(out)

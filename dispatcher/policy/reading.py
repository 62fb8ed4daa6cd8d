"""Reading a command by what is allowed: the reader allow rules and session grants rely on.

`read_command(argv)` returns the simple commands an argv runs, each as literal words, or
why it cannot vouch for all of it (`Reading.unreadable`). It understands only:

- an argv (no shell), or the string of `sh -c` / `bash -c` / `dash -c` (exactly those
  names, with harmless options only), in which: literal words after quote removal
  ('...', "...", backslashes, and $'...' in bash strings only: dash, which is sh on
  Debian, has no ANSI-C quoting), simple commands joined by `|`, `&&`, `||`, `;` and
  newlines, comments, redirections to /dev/null or between descriptors (`2>&1`, `>&2`,
  `3>&-`), and `NAME=value` prefixes for a few harmless variables;
- wrappers named exactly (`env`, `timeout`, `nice`, `nohup`, `xargs`, `time`, `stdbuf`,
  `ionice`, `taskset`, `chrt`, `command`, `builtin`, `exec`, `watch`) with options known
  to be harmless; `find -exec CMD` and `git bisect run CMD` add CMD;
- programs, minus the forms `dispatcher.policy.programs` knows run code given inline or,
  for a program an allow rule names for reading, write a file it names (`sort -o F`,
  `uniq IN OUT`, `yq -i`).

Anything else makes the whole command unreadable: every expansion (`$x`, `${x@P}`, `$(..)`,
backticks, `$((..))`, `<(..)`, globs, braces, `~`, zsh's `=cmd`), every other
redirection, here-documents and here-strings, `&`, subshells, groups, `if`/`for`/`while`/
`case`, functions, a shell or wrapper named by a path (`./bash`, `/usr/bin/env`), and the
builtins that evaluate strings or run commands (`eval`, `source`, `trap`, `declare`,
`read`, `jobs -x` ...).
The reader never runs anything and never guesses: what it returns is what would run.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

from dispatcher.policy.git_reading import read_git
from dispatcher.policy.program_facts import (
    CODE_OPTIONS,
    COPYING_PROGRAMS,
    EVALUATING_BUILTINS,
    INLINE_CODE_OPTIONS,
    INSPECTING_PROGRAMS,
    LOOKED_THROUGH_SHELLS,
    OPAQUE_PROGRAMS,
    OTHER_SHELLS,
    READS_CODE_FROM_STDIN,
    SAFE_SHELL_OPTIONS,
    SHELL_FLAGS,
    SHELL_LONG_FLAGS,
    STRICT_WRAPPERS,
    WRITES,
    WRITES_NO_NAMED_FILE,
    names_git_control,
    names_git_directory_operand,
    names_known_program,
    names_runtime_input,
)
from dispatcher.policy.programs import (
    Command,
    Context,
    ProgramReader,
    check_assignment,
    check_writes,
    interpreter_kind,
    parse_options,
    read_builtin_set,
    read_code_options,
    read_find,
    read_inline_code_options,
    read_interpreter,
    read_jobs,
    read_make,
    read_printf,
    read_stdin_interpreter,
    read_test,
    read_wait,
    unreadable,
)
from dispatcher.policy.sed_awk import read_awk, read_sed
from dispatcher.policy.shell import UnreadableCommand, read_ansi_c

logger = logging.getLogger(__name__)

MAX_DEPTH = 8
MAX_TEXT = 32 * 1024  # as the wide reading (shell.MAX_SHELL_TEXT)
MAX_COMMANDS = 1000  # simple commands in one string (reading each has a cost)

__all__ = ["Command", "Reading", "read_command", "split_shell"]


@dataclass(frozen=True)
class Reading:
    """What an argv runs: its simple commands, or why it cannot be read completely."""

    commands: tuple[Command, ...] = ()
    unreadable: str | None = None


@functools.lru_cache(maxsize=4096)
def read_command(argv: tuple[str, ...]) -> Reading:
    """Read an argv (as run_command runs it: no shell). Pure and cached."""
    try:
        commands = _read_argv(list(argv), 0, fed=False, appended=False)
    except UnreadableCommand as error:
        return Reading((), str(error))
    except RecursionError:
        return Reading((), "the command nests too deeply")
    except Exception:  # a reader's bug must not allow anything: fail closed
        logger.exception("the command reader failed on %r", argv[:20])
        return Reading((), "the reader failed on this command")
    if not commands:
        return Reading((), "the command runs nothing")
    return Reading(tuple(commands))


def program_name(word: str) -> str:
    return word.rstrip("/").rsplit("/", 1)[-1] if word else ""


def _read_argv(argv: list[str], depth: int, *, fed: bool, appended: bool) -> list[Command]:
    if depth > MAX_DEPTH:
        raise unreadable(f"more than {MAX_DEPTH} nested shells or wrappers")
    if not argv:
        return []
    name = argv[0]
    base = program_name(name)
    special = base in STRICT_WRAPPERS or base in LOOKED_THROUGH_SHELLS or base in OTHER_SHELLS
    if special and name != base:
        raise unreadable(
            f"'{name}' names a shell or wrapper by its path; only its exact name "
            f"('{base}') is read through"
        )
    if name in STRICT_WRAPPERS:
        return _read_wrapper(argv, depth, fed=fed, appended=appended)
    if name in LOOKED_THROUGH_SHELLS:
        return _read_shell(argv, depth, fed=fed, appended=appended)
    if name in OTHER_SHELLS:
        return _read_other_shell(argv, fed=fed, appended=appended)
    control = next((word for word in argv if names_git_control(word)), None)
    if control is not None:
        raise unreadable(
            f"'{control}' names git's hooks or configuration, which decide what git runs next"
        )
    if base not in WRITES_NO_NAMED_FILE and base != "git":  # git: git_reading (`git mv`)
        _check_git_directory_operands(argv, base, appended=appended)
    if base not in INSPECTING_PROGRAMS:
        copier = base.lower() in COPYING_PROGRAMS
        known = next((n for w in argv[1:] if (n := names_known_program(w, bare=copier))), None)
        if known is not None:
            raise unreadable(
                f"'{base}' on the program '{known}': a copy under another name would not be "
                "read as that program"
            )
    if base in EVALUATING_BUILTINS:
        raise unreadable(f"'{base}' evaluates strings or changes how later commands are read")
    if base in OPAQUE_PROGRAMS:
        raise unreadable(f"'{base}': {OPAQUE_PROGRAMS[base]}")
    if base in WRITES:
        check_writes(argv, WRITES[base], appended=appended)
    reader = reader_for(base)
    if reader is None:
        return [Command(tuple(argv), extra_args=appended)]

    def recurse(argv: list[str], *, fed: bool, appended: bool) -> list[Command]:
        return _read_argv(argv, depth + 1, fed=fed, appended=appended)

    return reader(argv, Context(recurse, fed, appended))


def _check_git_directory_operands(argv: list[str], base: str, *, appended: bool) -> None:
    """A program that may write the files it names must not name `HEAD`, `commondir` or
    `gitdir` (nor take names xargs appends at run time): such a file makes its directory
    a git directory, whose `config` (an ordinary file name, freely written) then decides
    what an allowed `git status` runs (see program_facts.WRITES_NO_NAMED_FILE)."""
    named = next((word for word in argv[1:] if names_git_directory_operand(word)), None)
    if named is not None:
        raise unreadable(
            f"'{base} ... {named}' may write a file that makes its directory a git directory"
        )
    if appended:
        raise unreadable(
            f"'xargs {base}': the names appended at run time may make a directory a git "
            "directory (only programs that write no file they name are read under xargs)"
        )


# --- wrappers and shells ------------------------------------------------------------------------


def _read_wrapper(argv: list[str], depth: int, *, fed: bool, appended: bool) -> list[Command]:
    name, args = argv[0], argv[1:]
    spec = STRICT_WRAPPERS[name]
    if name == "nice" and args[:1] and re.fullmatch(r"-\d+", args[0]):
        args = args[1:]  # the old form `nice -10 CMD`
    seen, start = parse_options(args, spec.options, name)
    rest = args[start:]
    if name == "command" and ("v" in seen or "V" in seen):
        return [Command(tuple(argv))]  # a lookup, not a run
    if spec.operand:
        if not rest or not re.fullmatch(spec.operand, rest[0]):
            raise unreadable(f"'{name}' without the operand it needs before the command")
        rest = rest[1:]
    if name == "env":
        while rest and "=" in rest[0]:
            check_assignment(rest[0], "env")
            rest = rest[1:]
    inner_appended = appended or name == "xargs"
    if not rest:
        if name == "xargs":
            rest = ["echo"]
        elif spec.needs_command or appended:
            raise unreadable(f"'{name}' without a command to run")
        else:
            return [Command(tuple(argv))]  # `env`, `nice`, `time`: run nothing of note
    if name == "watch" and "x" not in seen and "exec" not in seen:
        # watch runs the string with `sh -c`: read it as sh (dash) would be
        return _read_string(" ".join(rest), depth + 1, fed=False, dialect="sh")
    return _read_argv(rest, depth + 1, fed=fed and name != "xargs", appended=inner_appended)


def _read_shell(argv: list[str], depth: int, *, fed: bool, appended: bool) -> list[Command]:
    """sh/bash/dash: `-c STRING` is read; a script operand is a plain command."""
    name, args = argv[0], argv[1:]
    command_string = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("--", "-"):
            break
        if arg.startswith("--"):
            if arg[2:] not in SHELL_LONG_FLAGS:
                raise unreadable(f"'{name} {arg}' is not an option known to be harmless")
            continue
        if arg[:1] not in ("-", "+") or len(arg) < 2:
            i -= 1
            break
        for position, letter in enumerate(arg[1:], start=2):
            if letter == "c" and arg[0] == "-":
                command_string = True
            elif letter == "o" and position == len(arg):
                if i >= len(args) or args[i] not in SAFE_SHELL_OPTIONS:
                    raise unreadable(f"'{name} -o' with an option not known to be harmless")
                i += 1
            elif letter not in SHELL_FLAGS:
                raise unreadable(
                    f"'{name} {arg[0]}{letter}' is not an option known to be harmless "
                    "(it may load startup files or read commands from elsewhere)"
                )
    operands = args[i:]
    if command_string:
        if not operands:
            raise unreadable(f"'{name} -c' without its command string")
        return _read_string(operands[0], depth + 1, fed=fed, dialect=shell_dialect(name))
    return _shell_script(argv, operands, fed=fed, appended=appended)


def _read_other_shell(argv: list[str], *, fed: bool, appended: bool) -> list[Command]:
    """zsh, ksh, fish ...: not read through; a plain command only when it runs a script."""
    name = argv[0]
    options = [arg for arg in argv[1:] if arg[:1] in ("-", "+")]
    operands = [arg for arg in argv[1:] if arg[:1] not in ("-", "+")]
    if options:
        raise unreadable(f"'{name} {options[0]}': only sh, bash and dash command strings are read")
    return _shell_script(argv, operands, fed=fed, appended=appended)


def _shell_script(
    argv: list[str], operands: list[str], *, fed: bool, appended: bool
) -> list[Command]:
    name = argv[0]
    if operands and names_runtime_input(operands[0]):
        raise unreadable(f"'{name} {operands[0]}' runs a script produced at run time")
    if not operands and (fed or appended):
        raise unreadable(f"'{name}' reads the commands it runs from its input")
    return [Command(tuple(argv), extra_args=appended)]


# --- shell strings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShellCommand:
    """One simple command of a shell string in the strict grammar."""

    words: tuple[str, ...]
    assignments: tuple[str, ...] = ()
    piped: bool = False  # a later stage of a pipeline: its input is the previous stage
    stdin_redirected: bool = False  # `< /dev/null`


def shell_dialect(name: str) -> str:
    """How a looked-through shell quotes: "bash", or "sh" for sh and dash (Debian's sh is
    dash, which has no `$'...'` nor `$"..."`: it reads `$'\\'` as `$` and a quoted `\\`)."""
    return "bash" if name == "bash" else "sh"


def _read_string(text: str, depth: int, *, fed: bool, dialect: str) -> list[Command]:
    if depth > MAX_DEPTH:
        raise unreadable(f"more than {MAX_DEPTH} nested shells")
    found: list[Command] = []
    for command in split_shell(text, dialect):
        for assignment in command.assignments:
            check_assignment(assignment, "the command")
        inner_fed = command.piped or (fed and not command.stdin_redirected)
        found.extend(_read_argv(list(command.words), depth + 1, fed=inner_fed, appended=False))
    return found


RESERVED = frozenset(
    {"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until"}
    | {"do", "done", "in", "function", "coproc", "{", "}", "!", "[[", "]]"}
)
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")  # `NAME=value`, `NAME+=value`
BLANKS = " \t"
ENDS_WORD = " \t\n;&|()<>"


@functools.lru_cache(maxsize=2048)
def split_shell(text: str, dialect: str = "bash") -> tuple[ShellCommand, ...]:
    """The simple commands of a shell string, when it holds nothing but literal words,
    pipes, lists, comments and harmless redirections. Raises UnreadableCommand naming
    the first construct outside that grammar. `dialect` "sh" (dash) has no `$'...'`."""
    if len(text) > MAX_TEXT:
        raise unreadable("the shell string is too long to read")
    commands = tuple(_Splitter(text, ansi_c=dialect == "bash").commands())
    if len(commands) > MAX_COMMANDS:
        raise unreadable(f"the shell string holds more than {MAX_COMMANDS} commands")
    return commands


class _Splitter:
    def __init__(self, text: str, *, ansi_c: bool = True) -> None:
        self.text, self.i = text, 0
        self.ansi_c = ansi_c
        self.found: list[ShellCommand] = []
        self.words: list[str] = []
        self.assignments: list[str] = []
        self.piped = False
        self.stdin_redirected = False
        self.redirected = False
        self.dangling = ""  # an operator waiting for its command (`ls |`)

    def commands(self) -> list[ShellCommand]:
        text = self.text
        while True:
            while self.i < len(text) and (
                text[self.i] in BLANKS or text.startswith("\\\n", self.i)
            ):
                self.i += 2 if text[self.i] == "\\" else 1
            if self.i >= len(text):
                break
            char = text[self.i]
            if char == "#":  # only reached where a word would start: a comment
                end = text.find("\n", self.i)
                self.i = len(text) if end < 0 else end
            elif char == "\n":
                self.i += 1
                if not self.dangling:
                    self._finish(allow_empty=True)
            elif char == ";":
                if text.startswith((";;", ";&"), self.i):
                    raise unreadable("';;' belongs to a 'case' command")
                self.i += 1
                self._finish(allow_empty=False)
            elif char in "&|":
                self._operator(char)
            elif char in "()":
                raise unreadable("a subshell, group or function definition ('(')")
            elif char in "<>":
                self._redirect(None)
            else:
                self._word()
        if self.dangling:
            raise unreadable(f"the shell string ends after '{self.dangling}'")
        self._finish(allow_empty=True)
        return self.found

    def _operator(self, char: str) -> None:
        two = self.text[self.i : self.i + 2]
        if two in ("&&", "||"):
            self.i += 2
            self._finish(allow_empty=False)
            self.dangling = two
        elif two == "&>" and not self.ansi_c:
            # dash (sh) has no `&>`: `ls &>/dev/null rm -rf x` runs `ls` in the background,
            # then `rm -rf x` with its output to /dev/null
            raise unreadable("'&>' in a string for sh (dash reads it as '&' and '>')")
        elif two == "&>":
            self._redirect(None)
        elif char == "&":
            raise unreadable("'&' runs a command in the background")
        elif two == "|&":
            raise unreadable("'|&' pipes standard error too")
        else:
            self.i += 1
            self._finish(allow_empty=False, next_piped=True)
            self.dangling = "|"

    def _finish(self, *, allow_empty: bool, next_piped: bool = False) -> None:
        """End the current simple command; the next one is piped into when `next_piped`."""
        if not self.words:
            if self.assignments or self.redirected:
                raise unreadable("a command made only of assignments or redirections")
            if not allow_empty or self.dangling:
                raise unreadable("an empty command between operators")
            return
        self.found.append(
            ShellCommand(
                tuple(self.words),
                tuple(self.assignments),
                piped=self.piped,
                stdin_redirected=self.stdin_redirected,
            )
        )
        self.words, self.assignments = [], []
        self.redirected = self.stdin_redirected = False
        self.dangling = ""
        self.piped = next_piped

    def _word(self) -> None:
        start = self.i
        value, literal_prefix = self._read_word()
        next_char = self.text[self.i : self.i + 1]
        plain = literal_prefix == len(value) and self.i - start == len(value)
        if next_char in ("<", ">") and value.isdigit() and plain:
            self._redirect(value)  # `2>`: an io number
            return
        self.dangling = ""
        if not self.words and ASSIGNMENT.match(value) and literal_prefix > value.index("="):
            self.assignments.append(value)
            return
        if not self.words and value in RESERVED:
            raise unreadable(f"the shell keyword '{value}' (compound commands are not read)")
        if not self.words and value.startswith("="):
            raise unreadable("a command name starting with '=' (zsh expands '=cmd' to a path)")
        self.words.append(value)

    def _read_word(self) -> tuple[str, int]:
        """(the word after quote removal, how many leading characters were unquoted)."""
        text, out = self.text, list[str]()
        literal_prefix, quoted_yet = 0, False
        start = self.i
        while self.i < len(text) and text[self.i] not in ENDS_WORD:
            char = text[self.i]
            if char == "\\":
                if text.startswith("\\\n", self.i):
                    self.i += 2
                    continue
                out.append(text[self.i + 1 : self.i + 2] or "\\")
                self.i += 2
                quoted_yet = True
                continue
            if char == "'":
                end = text.find("'", self.i + 1)
                if end < 0:
                    raise unreadable("an unterminated single quote")
                out.append(text[self.i + 1 : end])
                self.i = end + 1
                quoted_yet = True
                continue
            if char == '"':
                out.append(self._double_quoted())
                quoted_yet = True
                continue
            if char == "$":
                if text.startswith("$'", self.i) and not self.ansi_c:
                    raise unreadable(
                        "$'...' in a string for sh (dash reads it as '$' and a quoted "
                        "string, bash as ANSI-C quoting)"
                    )
                if text.startswith("$'", self.i):
                    decoded, self.i = read_ansi_c(text, self.i + 2, strict=True)
                    if "\x00" in decoded:
                        raise unreadable("a NUL character in $'...' (the shell cuts the word)")
                    out.append(decoded)
                    quoted_yet = True
                    continue
                raise unreadable("an expansion or substitution ('$')")
            if char == "`":
                raise unreadable("a command substitution ('`')")
            if char in "*?[":
                raise unreadable(f"a glob pattern ({char!r}) that the shell may expand")
            if char in "{}":
                raise unreadable(f"brace expansion or a group ({char!r})")
            at_start = self.i == start
            if char == "~" and (at_start or text[self.i - 1] in "=:"):
                raise unreadable("a tilde expansion ('~')")
            out.append(char)
            self.i += 1
            if not quoted_yet:
                literal_prefix += 1
        return "".join(out), literal_prefix

    def _double_quoted(self) -> str:
        text, out = self.text, list[str]()
        self.i += 1
        while self.i < len(text):
            char = text[self.i]
            if char == '"':
                self.i += 1
                return "".join(out)
            if char in "$`":
                raise unreadable(f"an expansion inside double quotes ({char!r})")
            if char == "\\" and self.i + 1 < len(text):
                following = text[self.i + 1]
                if following in '$`"\\':
                    out.append(following)
                    self.i += 2
                    continue
                if following == "\n":
                    self.i += 2
                    continue
            out.append(char)
            self.i += 1
        raise unreadable("an unterminated double quote")

    REDIRECTS = ("&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<&", "<>", ">", "<")

    def _redirect(self, fd: str | None) -> None:
        text = self.text
        operator = next(op for op in self.REDIRECTS if text.startswith(op, self.i))
        self.i += len(operator)
        if operator.startswith("<<"):
            raise unreadable("a here-document or here-string")
        while self.i < len(text) and text[self.i] in BLANKS:
            self.i += 1
        if text.startswith("(", self.i):
            raise unreadable(f"a process substitution ('{operator}(')")
        if self.i >= len(text) or text[self.i] in ENDS_WORD:
            raise unreadable(f"'{operator}' without a target")
        target, _ = self._read_word()
        self.redirected = True
        self.dangling = ""
        reads = operator[0] == "<" and fd in (None, "0")
        if operator in (">&", "<&") and (target.isdigit() or target == "-"):
            if reads:
                self.stdin_redirected = False  # a descriptor: could be anything
            return
        if operator == "<&" or (operator == ">&" and fd is not None):
            raise unreadable(f"'{operator}{target}' is not a descriptor")
        if target != "/dev/null":
            raise unreadable(f"a redirection to '{target}' (only /dev/null is read)")
        if reads:
            self.stdin_redirected = True


# --- which reader reads which program --------------------------------------------------------------------------------

PROGRAM_READERS: dict[str, ProgramReader] = {
    "set": read_builtin_set,
    "test": read_test,
    "[": read_test,
    "printf": read_printf,
    "wait": read_wait,
    "jobs": read_jobs,
    "awk": read_awk,
    "gawk": read_awk,
    "mawk": read_awk,
    "nawk": read_awk,
    "original-awk": read_awk,
    "sed": read_sed,
    "gsed": read_sed,
    "find": read_find,
    "gfind": read_find,
    "make": read_make,
    "gmake": read_make,
    "git": read_git,
    **dict.fromkeys(INLINE_CODE_OPTIONS, read_inline_code_options),
    **dict.fromkeys(CODE_OPTIONS, read_code_options),
    **dict.fromkeys(READS_CODE_FROM_STDIN - set(INLINE_CODE_OPTIONS), read_stdin_interpreter),
}


def reader_for(name: str) -> ProgramReader | None:
    """How to read a command whose program's basename is `name` (None: a plain program)."""
    found = PROGRAM_READERS.get(name)
    if found is None and interpreter_kind(name):
        return read_interpreter
    return found

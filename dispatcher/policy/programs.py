"""How the strict reader reads one program, by the facts of `program_facts`.

`dispatcher.policy.reading` asks `reader_for(name)` how to read one simple command. A
reader returns the simple commands it runs (itself, plus what it starts: `find -exec CMD`,
`git bisect run CMD`) or raises `UnreadableCommand` naming what it cannot vouch for. What
is known about each program (its harmless options, the options that carry code) is a row
of `dispatcher.policy.program_facts`; here is only the code that applies a row.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dispatcher.policy.program_facts import (
    CODE_OPTIONS,
    INLINE_CODE_OPTIONS,
    INPUT_IS_CODE,
    INTERPRETER_NAMES,
    INTERPRETERS,
    READS_CODE_FROM_STDIN,
    SAFE_SHELL_OPTIONS,
    SAFE_VARIABLE,
    SHELL_FLAGS,
    WRITES_NO_NAMED_FILE,
    Interpreter,
    Options,
    Writes,
    names_runtime_input,
)
from dispatcher.policy.shell import UnreadableCommand


@dataclass(frozen=True)
class Command:
    """One simple command the reader understood: literal words, nothing left to expand."""

    argv: tuple[str, ...]
    extra_args: bool = False  # xargs appends words it reads at run time


class Recurse(Protocol):
    """Read a command another one starts (a wrapper's operand, `find -exec CMD`)."""

    def __call__(self, argv: list[str], *, fed: bool, appended: bool) -> list[Command]: ...


@dataclass(frozen=True)
class Context:
    """How the command being read is placed: its input, and who reads it further."""

    read: Recurse
    fed: bool  # its standard input comes from a pipe (not /dev/null)
    appended: bool  # xargs appends words read from its input


ProgramReader = Callable[[list[str], Context], list[Command]]


def unreadable(why: str) -> UnreadableCommand:
    return UnreadableCommand(why)


# --- variables ------------------------------------------------------------------------------


def check_assignment(word: str, where: str) -> None:
    """Raise unless `word` (NAME=VALUE) sets a variable known to be harmless."""
    name = word.split("=", 1)[0].removesuffix("+")  # `NAME+=value` appends
    if not SAFE_VARIABLE.fullmatch(name):
        raise unreadable(
            f"{where} sets {name}, which is not a variable known to be harmless "
            "(it may change which program runs or what it loads)"
        )


# --- options --------------------------------------------------------------------------------


def parse_options(args: Sequence[str], spec: Options, what: str) -> tuple[list[str], int]:
    """(the option letters and long names seen, index of the first operand).

    Options end at the first operand or `--`. Long options must be spelled in full (an
    abbreviation is unreadable: it might name another option). Raises UnreadableCommand
    for an option `spec` does not list.
    """
    seen: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return seen, i + 1
        if arg.startswith("--"):
            name, equals, _ = arg[2:].partition("=")
            if name in spec.long_flags and not equals:
                i += 1
            elif name in spec.long_valued:
                i += 1 if equals else 2
            else:
                raise unreadable(f"'{what} {arg}' is not an option known to be harmless")
            seen.append(name)
            continue
        if not arg.startswith("-") or arg == "-":
            return seen, i
        i += 1
        for position, letter in enumerate(arg[1:], start=2):
            if letter in spec.valued:
                seen.append(letter)
                if position == len(arg):
                    i += 1  # the value is the next word
                break
            if letter not in spec.flags:
                raise unreadable(f"'{what} -{letter}' is not an option known to be harmless")
            seen.append(letter)
    if i > len(args):
        raise unreadable(f"'{what}' ends with an option that needs a value")
    return seen, i


def long_prefix(arg: str, *names: str, shortest: int = 2) -> str | None:
    """The long option of `names` that `--arg[=v]` could abbreviate (GNU getopt accepts
    any unique prefix), or None."""
    if not arg.startswith("--"):
        return None
    typed = arg[2:].split("=", 1)[0]
    if len(typed) < shortest:
        return None
    return next((name for name in names if name.startswith(typed)), None)


def short_cluster_has(arg: str, letters: str) -> bool:
    """True when `arg` is a `-abc` cluster holding one of `letters`."""
    return arg.startswith("-") and not arg.startswith("--") and any(c in arg[1:] for c in letters)


def before_double_dash(args: Sequence[str]) -> list[str]:
    return list(args[: list(args).index("--")]) if "--" in args else list(args)


# --- wrappers that are looked through ---------------------------------------------------------


# --- builtins ------------------------------------------------------------------------------


def read_builtin_set(argv: list[str], ctx: Context) -> list[Command]:
    """`set` with harmless options only (`set -e`, `set -euo pipefail`)."""
    args, i = argv[1:], 0
    while i < len(args):
        arg = args[i]
        if arg[:1] not in ("-", "+") or arg in ("-", "--", "+"):
            raise unreadable("'set' with operands changes the positional parameters")
        for position, letter in enumerate(arg[1:], start=2):
            if letter == "o" and position == len(arg):
                i += 1
                if i >= len(args) or args[i] not in SAFE_SHELL_OPTIONS:
                    raise unreadable("'set -o' with an option not known to be harmless")
            elif letter not in SHELL_FLAGS:
                raise unreadable(f"'set {arg}' is not an option known to be harmless")
        i += 1
    return [Command(tuple(argv))]


def read_test(argv: list[str], ctx: Context) -> list[Command]:
    """`test` and `[`: `-v NAME` (and `-R`) evaluate a subscript (`-v 'a[$(cmd)]'`)."""
    if any(arg in ("-v", "-R") for arg in argv[1:]):
        raise unreadable(f"'{argv[0]} -v' evaluates an array subscript as arithmetic")
    return [Command(tuple(argv))]


def read_printf(argv: list[str], ctx: Context) -> list[Command]:
    if argv[1:2] and argv[1].startswith("-v"):
        raise unreadable("'printf -v' assigns to a name that may hold a subscript")
    return [Command(tuple(argv))]


def read_jobs(argv: list[str], ctx: Context) -> list[Command]:
    """`jobs -x CMD ARGS` runs CMD (job specs in ARGS replaced by process groups)."""
    for arg in argv[1:]:
        if arg == "--" or not arg.startswith("-"):
            break
        if "x" in arg:
            raise unreadable("'jobs -x' runs the command that follows it")
    return [Command(tuple(argv))]


def read_wait(argv: list[str], ctx: Context) -> list[Command]:
    if any(arg.startswith("-") and "p" in arg for arg in argv[1:]):
        raise unreadable("'wait -p' assigns to a name that may hold a subscript")
    return [Command(tuple(argv))]


# --- programs that never read as allowed ------------------------------------------------------

# --- interpreters given inline code -----------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def interpreter_kind(name: str) -> str | None:
    return next((kind for pattern, kind in INTERPRETER_NAMES if pattern.fullmatch(name)), None)


def read_interpreter(argv: list[str], ctx: Context) -> list[Command]:
    """python/perl/ruby/php/lua/node: inline code or an unknown option is unreadable; a
    script (or `-m MOD`) is a plain command; no script reads code from the input."""
    name = argv[0].rsplit("/", 1)[-1]
    kind = interpreter_kind(name) or name
    spec = INTERPRETERS[kind]
    args, i = argv[1:], 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or arg == "-" or not arg.startswith("-"):
            break
        i += 1
        if arg.startswith("--"):
            option, equals, _ = arg[2:].partition("=")
            if option in spec.long_flags and not equals:
                continue
            if option in spec.long_valued and equals:
                continue
            raise unreadable(f"'{name} {arg}' is not an option known to be harmless")
        i, done = _interpreter_cluster(name, kind, spec, arg, args, i)
        if done:
            return [Command(tuple(argv), extra_args=ctx.appended)]
    operands = args[i:]
    if operands[:1] == ["--"]:
        operands = operands[1:]
    if operands and names_runtime_input(operands[0]):
        raise unreadable(f"'{name} {operands[0]}' runs a program produced at run time")
    if not operands and (ctx.fed or ctx.appended):
        raise unreadable(f"'{name}' reads the program it runs from its input")
    return [Command(tuple(argv), extra_args=ctx.appended)]


def _interpreter_cluster(
    name: str, kind: str, spec: Interpreter, arg: str, args: Sequence[str], i: int
) -> tuple[int, bool]:
    """Read one `-abc` cluster; (next index, True when `-m MOD` ended the options)."""
    for position, letter in enumerate(arg[1:], start=2):
        if letter in spec.code:
            raise unreadable(f"'{name} -{letter}' runs code given on the command line")
        if letter in spec.module:
            module = arg[position:] or (args[i] if i < len(args) else "")
            if module in spec.code_modules:
                raise unreadable(f"'{name} -m {module}' runs code given as an argument")
            return i, True
        if letter in spec.attached:
            return i, False
        if letter in spec.valued:
            return (i if position < len(arg) else i + 1), False
        if letter not in spec.flags:
            raise unreadable(f"'{name} -{letter}' is not an option known to be harmless")
    return i, False


def read_inline_code_options(argv: list[str], ctx: Context) -> list[Command]:
    """Interpreters known only by their inline-code options (deno eval, Rscript -e ...)."""
    name = argv[0].rsplit("/", 1)[-1]
    options = INLINE_CODE_OPTIONS[name]
    for arg in argv[1:]:
        if arg in options or arg.split("=", 1)[0] in options:
            raise unreadable(f"'{name} {arg}' runs code given on the command line")
    if name == "sqlite3" and len([a for a in argv[1:] if not a.startswith("-")]) > 1:
        raise unreadable(
            "'sqlite3 DB SQL' runs SQL given on the command line (.shell, load_extension)"
        )
    return _plain_or_stdin(argv, ctx, name)


def _plain_or_stdin(argv: list[str], ctx: Context, name: str) -> list[Command]:
    operands = [a for a in argv[1:] if not a.startswith("-")]
    fed = ctx.fed or ctx.appended
    if name in READS_CODE_FROM_STDIN and operands and names_runtime_input(operands[0]):
        raise unreadable(f"'{name} {operands[0]}' runs a program produced at run time")
    if fed and (name in INPUT_IS_CODE or (name in READS_CODE_FROM_STDIN and not operands)):
        raise unreadable(f"'{name}' reads what it runs from its input")
    return [Command(tuple(argv), extra_args=ctx.appended)]


def read_stdin_interpreter(argv: list[str], ctx: Context) -> list[Command]:
    """tclsh, ed, bc, irb ...: no inline option, but code from the input when fed."""
    return _plain_or_stdin(argv, ctx, argv[0].rsplit("/", 1)[-1])


# --- find, make, and programs with one or two code-running options ------------------------------

FIND_WRITES = frozenset({"-delete", "-fprint", "-fprint0", "-fprintf", "-fls"})
FIND_EXECS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def read_find(argv: list[str], ctx: Context) -> list[Command]:
    """find: `-exec CMD ;` adds CMD (read like any command); `-delete` and the `-fprint`
    family write or delete files, which a search an allow rule names does not."""
    if ctx.appended:
        raise unreadable("'xargs find': its expression comes from the input")
    args = argv[1:]
    found = [Command(tuple(argv))]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in FIND_WRITES:
            raise unreadable(f"'find {arg}' deletes or writes files")
        if arg in FIND_EXECS:
            end = _find_exec_end(arg, args, i + 1)
            command = args[i + 1 : end]
            if end == len(args) or not command:
                raise unreadable(f"'find {arg}' without a command ended by ';' or '{{}} +'")
            if command[0] == "{}" or any("{}" in word and word != "{}" for word in command):
                raise unreadable(f"'find {arg}' puts file names inside a word or runs them")
            _check_found_names(arg, command)
            found.extend(ctx.read(command, fed=False, appended=False))
            i = end
        i += 1
    return found


def _check_found_names(action: str, command: Sequence[str]) -> None:
    """The names find passes (`{}`) and the directory `-execdir` runs in are chosen at run
    time, as xargs's are: `-path '*/.gi?/config' -exec sed -i ... {} ;` and `-name
    pre-commit.sample -execdir cp x pre-commit ;` write git's configuration and hooks,
    whose names the reader never saw. Only programs that write no file they name are read
    there (see program_facts.WRITES_NO_NAMED_FILE)."""
    if "{}" not in command and action not in ("-execdir", "-okdir"):
        return
    base = command[0].rstrip("/").rsplit("/", 1)[-1]
    if base not in WRITES_NO_NAMED_FILE:
        raise unreadable(
            f"'find {action} {command[0]}': the files find gives it are chosen at run time "
            "and may be git's configuration or hooks (only programs that write no file "
            "they name are read there)"
        )


def _find_exec_end(action: str, args: Sequence[str], start: int) -> int:
    """Index of the word ending the command of `find ACTION` that starts at `start`: `;`,
    or `+` right after `{}` (-exec and -execdir only). GNU find reads any other `+` as an
    argument (`-exec make test + --eval=X ;` runs `make test + --eval=X`), BSD find ends
    the command at any word starting with `;`: such a word is unreadable."""
    end = start
    while end < len(args):
        word = args[end]
        if word == ";":
            return end
        if word == "+" and end > start and args[end - 1] == "{}" and action in FIND_PLUS:
            return end
        if word == "+" or word.startswith(";"):
            raise unreadable(
                f"'find {action} ... {word}': find does not end the command there the same "
                "way everywhere (only ';' or '{} +' do)"
            )
        end += 1
    return end


FIND_PLUS = frozenset({"-exec", "-execdir"})


def read_make(argv: list[str], ctx: Context) -> list[Command]:
    """make: `--eval`/`-E` is makefile text, and a `NAME=value` operand replaces a variable
    a recipe may run (`CC='rm -rf ~'`, `SHELL=...`): both make it unreadable."""
    for arg in argv[1:]:
        if long_prefix(arg, "eval", shortest=2) or short_cluster_has(arg, "E"):
            raise unreadable("'make --eval' runs makefile text given on the command line")
        if MAKE_ASSIGNMENT.match(arg):
            raise unreadable(
                f"'make {arg.split('=', 1)[0]}=...' replaces a variable its recipes may run"
            )
        for prefix in ("-f", "--file=", "--makefile="):
            if arg.startswith(prefix) and names_runtime_input(arg.removeprefix(prefix)):
                raise unreadable("'make -f -' reads its makefile from its input")
    for word, after in zip(argv[1:], [*argv[2:], ""], strict=False):
        if word in ("-f", "--file", "--makefile") and names_runtime_input(after):
            raise unreadable("'make -f -' reads its makefile from its input")
    return [Command(tuple(argv), extra_args=ctx.appended)]


MAKE_ASSIGNMENT = re.compile(r"[A-Za-z_.][A-Za-z0-9_.\-]*\s*(::?|\+|\?|!)?=")


def read_code_options(argv: list[str], ctx: Context) -> list[Command]:
    name = argv[0].rsplit("/", 1)[-1]
    spec = CODE_OPTIONS[name]
    if ctx.appended:  # `cat list | xargs rg x`, the list holding `--pre=./x`
        raise unreadable(
            f"'xargs {name}': the words it appends may be the options that make it run "
            "another program"
        )
    for arg in before_double_dash(argv[1:]):
        if (
            arg in spec.words
            or arg.startswith(spec.prefixes)
            or any(text in arg.lower() for text in spec.contains)
            or (spec.short and short_cluster_has(arg, spec.short))
            # GNU getopt takes any unique prefix: `sort --co=X` is --compress-program
            or (spec.long and long_prefix(arg, *spec.long, shortest=1))
        ):
            raise unreadable(f"'{name} {arg}' makes it run another program or code it was given")
    if name in ("tar", "gtar", "bsdtar"):
        _read_tar(name, argv[1:])
    if name in ("ex", "vim", "vi", "nvim") and (ctx.fed or ctx.appended):
        raise unreadable(f"'{name}' reads editor commands from its input")
    return [Command(tuple(argv), extra_args=ctx.appended)]


def _read_tar(name: str, args: list[str]) -> None:
    """tar: never extracting (the archive, which the agent may have made, names the files
    written: `.git/config`, a hook) nor renaming members (`--transform` can spell `.git`
    in pieces); the old-style first word (`xIf`) is a cluster of letters too."""
    old_style = args[:1] and args[0][:1] != "-"
    if old_style and set(args[0]) & set("IFx"):
        raise unreadable(f"'{name} {args[0]}' runs another program or extracts files")
    for arg in before_double_dash(args):
        if short_cluster_has(arg, "x") or long_prefix(
            arg, "extract", "get", "transform", "xform", shortest=1
        ):
            raise unreadable(
                f"'{name} {arg}' writes the files the archive names or renames them, "
                "git's configuration and hooks among them"
            )


# --- programs for reading that write a file they name ------------------------------------------


def check_writes(argv: list[str], spec: Writes, *, appended: bool) -> None:
    """Raise when `argv` is a form in which its program (`sort`, `uniq`, `yq` ...: one an
    allow rule names for reading) writes a file it names: a writing option, anywhere before
    `--` (GNU permutes), or the operand it writes (see program_facts.Writes)."""
    name = argv[0].rsplit("/", 1)[-1]
    if appended:
        raise unreadable(f"'xargs {name}': the words it appends may make it write a file they name")
    args = argv[1:]
    for arg in before_double_dash(args):
        if _cluster_holds(arg, spec.short, spec.stops) or (
            spec.long and long_prefix(arg, *spec.long, shortest=1)
        ):
            raise unreadable(f"'{name} {arg}' writes the file it names")
    if spec.operand and len(_operands(args, spec.valued)) >= spec.operand:
        raise unreadable(f"'{name}' writes the file its operand {spec.operand} names")


def _cluster_holds(arg: str, letters: str, stops: str) -> bool:
    """True when `arg` is a `-abc` cluster holding one of `letters` before a letter of
    `stops` (whose value is the rest of the cluster)."""
    if not letters or not arg.startswith("-") or arg.startswith("--"):
        return False
    for letter in arg[1:]:
        if letter in letters:
            return True
        if letter in stops:
            return False
    return False


def _operands(args: Sequence[str], valued: frozenset[str]) -> list[str]:
    """The operands of `args`, counted so that a miscount is one too many: an option takes
    the next word only when spelled exactly as one of `valued`, and every word from the
    first operand on counts (a program that does not permute, or POSIXLY_CORRECT, reads
    `uniq IN -c` as two operands)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return list(args[i + 1 :])
        if not arg.startswith("-") or arg == "-":
            return list(args[i:])
        i += 2 if arg in valued else 1
    return []


# --- npm and friends: publishing -----------------------------------------------------------------

# --- what a command starts, read widely (for deny and ask rules and the guard) -----------------


@dataclass(frozen=True)
class Nested:
    """A command another one starts: an argv (`find -exec`) or a shell string (`-x 'cmd'`)."""

    argv: tuple[str, ...] = ()
    text: str | None = None
    alias: str = ""  # set for a git alias definition (`alias.p=push`): its key


def option_values(args: Sequence[str], short: str, long: tuple[str, ...]) -> list[str]:
    """Every value of `-X VALUE`/`-XVALUE` (X in `short`, anywhere in a cluster) and
    `--long VALUE`/`--long=VALUE` (or an abbreviation) before `--`, read widely."""
    values: list[str] = []
    args = before_double_dash(args)
    for i, arg in enumerate(args):
        following = args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith("--"):
            if long_prefix(arg, *long, shortest=2):
                values.append(arg.split("=", 1)[1] if "=" in arg else following)
        elif arg.startswith("-") and short:
            at = next((k for k, c in enumerate(arg) if k and c in short), None)
            if at is not None:
                values.append(arg[at + 1 :] or following)
    return values

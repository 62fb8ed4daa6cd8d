"""Reading awk programs and sed scripts: which of them only edit text.

An awk program that calls `system`, uses pipes or `getline`, redirects `print`, or loads
extensions, and a sed script with `e`, `w`, `W`, `s///e` or `s///w` (or any command the
scanner does not know), make the command unreadable for allow rules.
"""

from __future__ import annotations

import re

from dispatcher.policy.program_facts import Options
from dispatcher.policy.programs import Command, Context, parse_options, unreadable

# --- awk and sed ------------------------------------------------------------------------------

AWK_OPTIONS = Options(
    "bcCghLMnNOPrsStV",
    "Fvfe",
    frozenset(
        {"sandbox", "posix", "traditional", "re-interval", "characters-as-bytes", "csv"}
        | {"use-lc-numeric", "bignum", "optimize", "no-optimize", "version", "help", "copyleft"}
    ),
    frozenset({"field-separator", "assign", "file", "source", "exec", "include"}),
)
# What makes an awk program run or write something: system(), pipes, getline, gawk's
# @load/@include and indirect calls; and output redirection of print/printf: any `>` after
# the first print (a statement's end cannot be found without parsing strings and regular
# expressions, which may hold `;`, `}` or quotes).
AWK_CODE = re.compile(r"\bsystem\b|\bgetline\b|\|&|(?<!\|)\|(?!\|)|@|\bprintf?\b.*>", re.DOTALL)


def awk_program_problem(program: str) -> str | None:
    """What in an awk program runs or writes something, read after awk's own line
    joining (a backslash-newline joins two lines: `print "x" > \\<newline>"f"`), or None."""
    joined = program.replace("\\\r\n", "").replace("\\\n", "")
    found = AWK_CODE.search(joined)
    return found.group(0)[:40] if found else None


def read_awk(argv: list[str], ctx: Context) -> list[Command]:
    name = argv[0].rsplit("/", 1)[-1]
    if ctx.appended:
        raise unreadable(f"'xargs {name}': the program or its options come from the input")
    args = argv[1:]
    programs: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith("--"):
            option, equals, value = arg[2:].partition("=")
            if option in AWK_OPTIONS.long_flags and not equals:
                i += 1
                continue
            if option not in AWK_OPTIONS.long_valued:
                raise unreadable(f"'{name} {arg}' is not an option known to be harmless")
            value = value if equals else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if equals else 2
            if option == "source":
                programs.append(value)
            elif option in ("file", "exec", "include"):
                _awk_program_file(name, option, value)
            continue
        letter = arg[1]
        if letter in AWK_OPTIONS.valued:
            value = arg[2:] if len(arg) > 2 else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if len(arg) > 2 else 2
            if letter == "e":
                programs.append(value)
            elif letter == "f":
                _awk_program_file(name, "f", value)
            continue
        parse_options([arg], Options(AWK_OPTIONS.flags), name)
        i += 1
    if not programs:
        if i >= len(args):
            raise unreadable(f"'{name}' without a program")
        programs.append(args[i])
    for program in programs:
        found = awk_program_problem(program)
        if found:
            raise unreadable(f"the {name} program runs commands, pipes or writes files ({found!r})")
    return [Command(tuple(argv))]


def _awk_program_file(name: str, option: str, path: str) -> None:
    """A program in a file is not read (the reader reads no files): unreadable."""
    raise unreadable(f"'{name} -{option} {path}': a program in a file cannot be read")


SED_OPTIONS = Options(
    "nErsuzb",
    "lef",
    frozenset(
        {"quiet", "silent", "regexp-extended", "separate", "unbuffered", "null-data", "posix"}
        | {"debug", "sandbox", "follow-symlinks", "binary"}
    ),
    frozenset({"line-length", "expression", "file"}),
)


def read_sed(argv: list[str], ctx: Context) -> list[Command]:
    """sed: options anywhere (GNU permutes); scripts from -e/--expression or the first
    operand are scanned for the commands that run or write (`e`, `s///e`, `w`, `s///w`)."""
    if ctx.appended:
        raise unreadable("'xargs sed': the script or its options come from the input")
    args = argv[1:]
    scripts: list[str] = []
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            operands.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-":
            operands.append(arg)
            continue
        if arg.startswith("--"):
            option, equals, value = arg[2:].partition("=")
            if option == "in-place":
                continue
            if option in SED_OPTIONS.long_flags and not equals:
                continue
            if option not in SED_OPTIONS.long_valued:
                raise unreadable(f"'sed {arg}' is not an option known to be harmless")
            if not equals:
                value = args[i] if i < len(args) else ""
                i += 1
            if option == "expression":
                scripts.append(value)
            if option == "file":
                raise unreadable(f"'sed --file {value}': a script in a file cannot be read")
            continue
        for position, letter in enumerate(arg[1:], start=2):
            if letter == "i":
                break  # -i[SUFFIX]: the rest of the cluster is the suffix
            if letter in SED_OPTIONS.valued:
                value = (
                    arg[position:] if position < len(arg) else (args[i] if i < len(args) else "")
                )
                if position == len(arg):
                    i += 1
                if letter == "e":
                    scripts.append(value)
                if letter == "f":
                    raise unreadable(f"'sed -f {value}': a script in a file cannot be read")
                break
            if letter not in SED_OPTIONS.flags:
                raise unreadable(f"'sed -{letter}' is not an option known to be harmless")
    if not scripts:
        if not operands:
            raise unreadable("'sed' without a script")
        scripts.append(operands[0])
    for script in scripts:
        problem = sed_script_problem(script)
        if problem:
            raise unreadable(f"the sed script {problem}")
    return [Command(tuple(argv))]


def sed_script_problem(script: str) -> str | None:
    """Why a sed script is not only editing text (`e`, `w`, `W`, `s///e`, `s///w`), or None.

    Reads addresses, blocks and each command's arguments; any command it does not know
    is a problem too (fail closed).
    """
    reader = _SedScript(script)
    try:
        return reader.problem()
    except IndexError:
        return "cannot be read to its end"


class _SedScript:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def problem(self) -> str | None:
        text = self.text
        while True:
            self._skip(" \t\n;")
            if self.i >= len(text):
                return None
            self._address()
            self._skip(" \t!")
            if self.i >= len(text):
                return "ends after an address"
            command = text[self.i]
            self.i += 1
            found = self._command(command)
            if found:
                return found

    def _skip(self, chars: str) -> None:
        while self.i < len(self.text) and self.text[self.i] in chars:
            self.i += 1

    def _address(self) -> None:
        for _ in range(2):
            text = self.text
            if self.i < len(text) and (text[self.i].isdigit() or text[self.i] == "$"):
                self.i += 1
                while self.i < len(text) and (text[self.i].isdigit() or text[self.i] in "~+"):
                    self.i += 1
            elif self.i < len(text) and text[self.i] in "/\\":
                if text[self.i] == "\\":
                    self.i += 1
                self._delimited(text[self.i])
                while self.i < len(text) and text[self.i] in "IM":
                    self.i += 1
            self._skip(" \t")
            if self.i < len(text) and text[self.i] == ",":
                self.i += 1
                self._skip(" \t")
                continue
            return

    def _delimited(self, delimiter: str) -> str:
        """Read `DtextD` from self.i (at the opening delimiter); return text."""
        text, start = self.text, self.i + 1
        self.i = start
        while text[self.i] != delimiter:
            self.i += 2 if text[self.i] == "\\" else 1
        self.i += 1
        return text[start : self.i - 1]

    def _command(self, command: str) -> str | None:
        if command in "ewW":
            return f"runs or writes with its '{command}' command"
        if command == "s":
            delimiter = self.text[self.i]
            if delimiter in "\n\\":
                return "has an 's' command it cannot read"
            self._delimited(delimiter)
            self.i -= 1
            self._delimited(delimiter)
            flags = ""
            while self.i < len(self.text) and self.text[self.i] not in ";}\n":
                flags += self.text[self.i]
                self.i += 1
                if flags[-1] == "w":
                    return "writes a file with the 's///w' flag"
            if "e" in flags:
                return "runs the pattern space as a command ('s///e')"
            if set(flags.strip()) - set("gpiImM0123456789 "):
                return f"has 's' flags it does not know ({flags!r})"
            return None
        if command == "y":
            delimiter = self.text[self.i]
            self._delimited(delimiter)
            self.i -= 1
            self._delimited(delimiter)
            return None
        if command in "aicrRbtT:vqQlL":
            self._argument()
            return None
        if command in "{}=dDgGhHnNpPxz":
            return None
        if command == "#":
            end = self.text.find("\n", self.i)
            self.i = len(self.text) if end < 0 else end
            return None
        return f"has a command it does not know ({command!r})"

    def _argument(self) -> None:
        """Skip a text, file name, label or number. It ends at the first `;` or newline:
        sed may read some to the end of the line, but reading less only shows more
        commands, so the scan can only be stricter than sed."""
        while self.i < len(self.text) and self.text[self.i] not in ";\n":
            self.i += 1

"""The strict reader against bash itself: for random shell strings, whatever the reader
calls readable must be exactly what bash runs (traced with `set -x`).

The strings are built from the reader's grammar (words in every quoting style, lists,
pipes, harmless redirections, comments, line continuations) and from characters outside
it; only `true` is ever run, so the test is safe to run anywhere bash is installed.

Then `$'...'` against bash and dash (random `printf` strings run with an empty PATH, so
only the builtin runs), and the builtins and wrappers that run a command (`touch MARK` in
a temporary directory) against bash, read by both readers.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from dispatcher.policy.parts import command_parts
from dispatcher.policy.reading import read_command

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = [
    pytest.mark.backend_independent,
    pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed"),
]

PLAIN = "abcxyzABC0123456789-_./:%+,=@^!#"
PRINTABLE = PLAIN + " ;|&<>()$`\"'*?[]{}~\\"
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
OPERATORS = [" ; ", " && ", " | ", "\n", ";\n", " &&\n", " |\n  ", "; "]
REDIRECTS = ["2>/dev/null", ">/dev/null", "2>&1", "</dev/null", ">/dev/null 2>&1", "1>&2"]


def _segment(rng: random.Random, wild: bool) -> str:
    kind = rng.choice(["plain", "single", "double", "escaped", "ansi"] + ["wild"] * wild)
    text = "".join(rng.choice(PLAIN) for _ in range(rng.randint(1, 4)))
    if kind == "plain":
        return text.lstrip("#") or "a"
    if kind == "single":
        return "'" + "".join(rng.choice(PRINTABLE.replace("'", "")) for _ in range(3)) + "'"
    if kind == "double":
        inner = "".join(rng.choice(PRINTABLE.replace("$", "").replace("`", "")) for _ in range(3))
        return '"' + inner.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if kind == "escaped":
        return "\\" + rng.choice(PRINTABLE)
    if kind == "ansi":
        return "$'" + "".join(f"\\x{ord(rng.choice(PLAIN)):02x}" for _ in range(2)) + "'"
    return rng.choice(["*", "?", "$x", "~", "{a,b}", "a=b", "(", "`true`", "$(true)", "[a]"])


def _word(rng: random.Random, wild: bool) -> str:
    return "".join(_segment(rng, wild) for _ in range(rng.randint(1, 3)))


def _command(rng: random.Random, wild: bool) -> str:
    name = rng.choice(["true", "'true'", '"true"', "\\true", "tr''ue", "$'\\x74rue'"])
    words = [name] + [_word(rng, wild) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.3:
        words.append(rng.choice(REDIRECTS))
    if rng.random() < 0.2:
        words.insert(0, "CI=1")
    glue = rng.choice([" ", " ", "  ", "\t", " \\\n "])
    return glue.join(words)


def random_string(rng: random.Random, wild: bool) -> str:
    commands = [_command(rng, wild) for _ in range(rng.randint(1, 4))]
    text = commands[0]
    for command in commands[1:]:
        text += rng.choice(OPERATORS) + command
    if rng.random() < 0.2:
        text += " # " + _word(rng, wild)
    return text


def traced(text: str) -> list[tuple[str, ...]]:
    """The simple commands bash ran for `text`, from its xtrace (PS4 is '+ ')."""
    done = subprocess.run(
        ["bash", "-x", "-c", text],
        capture_output=True,
        text=True,
        timeout=10,
        env={"PATH": "/usr/bin:/bin", "PS4": "+ "},
    )
    found = [tuple(shlex.split(line[2:])) for line in done.stderr.splitlines() if line[:2] == "+ "]
    # bash traces the assignments before a command on a line of their own
    return [words for words in found if not (len(words) == 1 and ASSIGNMENT.match(words[0]))]


@pytest.mark.parametrize("wild", [False, True], ids=["grammar", "wild"])
def test_what_the_reader_reads_is_what_bash_runs(wild: bool) -> None:
    rng = random.Random(11 + wild)
    readable = 0
    for _ in range(150):
        text = random_string(rng, wild)
        reading = read_command(("bash", "-c", text))
        if reading.unreadable is not None:
            continue
        readable += 1
        expected = Counter(command.argv for command in reading.commands)
        assert Counter(traced(text)) == expected, text
    assert readable >= (100 if not wild else 20), readable


# --- $'...' against bash and dash (the red-team findings F1 and F2) -------------------------

NEEDS_DASH = (
    "The dash comparison needs /bin/dash (Debian and Ubuntu's /bin/sh; "
    "`apt-get install dash` elsewhere)."
)
# Proved bypasses: bash ends `$'\c'` at its second quote, dash reads `$'\'` as `$` and a
# quoted backslash; either way the second printf runs.
HIDDEN = {
    "bash": ["printf '%s\\0' $'\\c' ; printf '%s\\0' HIDDEN # '"],
    "dash": ["printf '%s\\0' $'\\' ; printf '%s\\0' HIDDEN # '"],
}
ANSI_BODY = ["\\", "\\", "c", "a", "x", "1", "4", "?", "'", '"', " ", ";", "#", "n", "e"]


def real_shell(name: str) -> str:
    """The path of the shell `name`, or skip saying how to get it (fail under CI=true)."""
    found = shutil.which(name)
    if found is None:
        message = NEEDS_DASH if name == "dash" else f"{name} is not installed."
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    return found


def _printf_word(rng: random.Random) -> str:
    kind = rng.choice(["plain", "single", "ansi", "ansi", "ansi"])
    if kind == "plain":
        return "".join(rng.choice("abc14") for _ in range(rng.randint(1, 3)))
    if kind == "single":
        return "'" + "".join(rng.choice("ab ;#\\$") for _ in range(3)) + "'"
    return "$'" + "".join(rng.choice(ANSI_BODY) for _ in range(rng.randint(1, 5))) + "'"


def printf_string(rng: random.Random) -> str:
    words = " ".join(_printf_word(rng) for _ in range(rng.randint(1, 3)))
    return f"printf '%s\\0' {words} ; printf '%s\\0' END" + rng.choice(["", " # '"])


def run_in(shell: str, text: str, where: Path) -> tuple[bytes, int]:
    """(standard output, how many commands were not found): PATH is an empty directory,
    so only builtins (printf) run, whatever the random string holds."""
    done = subprocess.run(
        [shell, "-c", text],
        capture_output=True,
        timeout=10,
        cwd=where,
        env={"PATH": str(where / "empty"), "LC_ALL": "C"},
    )
    return done.stdout, done.stderr.count(b"not found")


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["bash", "dash"])
def test_ansi_c_quoting_is_read_as_the_shell_reads_it(name: str, tmp_path: Path) -> None:
    shell = real_shell(name)
    (tmp_path / "empty").mkdir()
    rng = random.Random(5)
    readable = 0
    for text in HIDDEN[name] + [printf_string(rng) for _ in range(300)]:
        reading = read_command((name, "-c", text))
        output, missing = run_in(shell, text, tmp_path)
        if text in HIDDEN[name]:
            assert b"HIDDEN" in output  # the shell does run the second command
        if reading.unreadable is not None:
            continue
        readable += 1
        printed = [command for command in reading.commands if command.argv[0] == "printf"]
        expected = b"".join(
            b"".join(arg.encode("latin-1") + b"\0" for arg in command.argv[2:] or [""])
            for command in printed
        )
        assert (output, missing) == (expected, len(reading.commands) - len(printed)), text
    assert readable >= (150 if name == "bash" else 20), readable


# --- builtins and wrappers that run their arguments (the red-team finding F4) -----------------

# Each runs `touch MARK` in bash; `{}` is where the wrapper or builtin goes.
RUNNERS = [
    ("jobs", "jobs -x touch MARK"),
    ("builtin", "builtin command touch MARK"),
    ("command", "command touch MARK"),
    ("exec", "exec touch MARK"),
    ("eval", "eval touch MARK"),
    ("coproc", "coproc touch MARK; wait"),
    ("time", "time -p touch MARK"),
    ("compgen", "compgen -C 'touch MARK' x"),
    ("trap", "trap 'touch MARK' EXIT"),
    ("nohup", "nohup touch MARK"),
    ("nice", "nice -n 1 touch MARK"),
    ("timeout", "timeout 5 touch MARK"),
    ("stdbuf", "stdbuf -oL touch MARK"),
    ("env", "env -S 'touch MARK'"),
    ("xargs", "echo MARK | xargs touch"),
    ("setsid", "setsid -w touch MARK"),
    ("flock", "flock lock touch MARK"),
    ("flock", "flock lock -c 'touch MARK'"),
    ("ionice", "ionice -c 3 touch MARK"),
    ("taskset", "taskset 1 touch MARK"),
    ("script", "script -qc 'touch MARK' /dev/null"),
]


BASH_BUILTINS = frozenset({"jobs", "builtin", "command", "exec", "eval", "coproc", "time"})
BASH_BUILTINS |= {"compgen", "trap"}


@pytest.mark.parametrize(("program", "text"), RUNNERS, ids=[text for _, text in RUNNERS])
def test_what_runs_a_command_is_read_through(program: str, text: str, tmp_path: Path) -> None:
    if program not in BASH_BUILTINS and shutil.which(program) is None:
        pytest.skip(f"{program} is not installed here")
    subprocess.run(
        ["bash", "-c", text],
        cwd=tmp_path,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=10,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert (tmp_path / "MARK").exists(), "bash did not run the command"
    argv = ("bash", "-c", text)
    reading = read_command(argv)
    # the strict reader: unreadable, or it reads `touch` (xargs appends MARK at run time),
    # or it reads the wrapper as the program (only a rule naming the wrapper allows it)
    programs = [command.argv[0] for command in reading.commands]
    assert reading.unreadable is not None or "touch" in programs or program in programs
    parts = command_parts(argv)
    assert parts.unparsed is not None or "touch" in [part.argv[0] for part in parts.parts]


def test_an_appending_assignment_reaches_the_program(tmp_path: Path) -> None:
    text = "GIT_SSH_COMMAND+='touch MARK' bash -c 'eval \"$GIT_SSH_COMMAND\"'"
    subprocess.run(["bash", "-c", text], cwd=tmp_path, timeout=10, env={"PATH": "/usr/bin:/bin"})
    assert (tmp_path / "MARK").exists()
    reading = read_command(("bash", "-c", "GIT_SSH_COMMAND+='touch MARK' git fetch"))
    assert "sets GIT_SSH_COMMAND" in (reading.unreadable or "")

"""The strict reader against bash itself: for random shell strings, whatever the reader
calls readable must be exactly what bash runs (traced with `set -x`).

The strings are built from the reader's grammar (words in every quoting style, lists,
pipes, harmless redirections, comments, line continuations) and from characters outside
it; only `true` is ever run, so the test is safe to run anywhere bash is installed.
"""

from __future__ import annotations

import random
import re
import shlex
import shutil
import subprocess
from collections import Counter

import pytest

from dispatcher.policy.reading import read_command

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")

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

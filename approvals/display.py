"""Turning agent-supplied text into something a reviewer can trust to read.

Nothing here marks anything safe: every function returns a plain string (or list of
strings) and Django's autoescaping does the HTML escaping when it is rendered.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dispatcher.policy.parts import command_parts
from dispatcher.policy.reading import read_command

# Characters that change how text looks without being visible themselves: C0/C1 controls
# (tab and newline are kept as layout), soft hyphen, combining grapheme joiner, Arabic
# letter mark, Hangul fillers (choseong/jungseong, the compatibility and halfwidth fillers:
# blank, yet letters to a parser), Khmer inherent vowels, Mongolian vowel separator,
# zero-width and joiner characters, line/paragraph separators, bidi embeddings, overrides
# and isolates, word joiner and invisible operators, variation selectors (both blocks),
# BOM, interlinear annotation marks, and the Unicode tag block (used to smuggle hidden
# ASCII).
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufe00-\ufe0f\ufeff"
    "\uffa0\ufff9-\ufffb\U000e0000-\U000e007f\U000e0100-\U000e01ef]"
)


# A queue item folds logged arguments longer than FOLD_AT characters: it shows the first
# FOLD_PREVIEW of them, and "Show all" loads the whole item (the call's own page shows
# everything). Each item of a long queue then stays a few kilobytes.
FOLD_AT = 4000
FOLD_PREVIEW = 1000
FOLD_VALUE = 300  # characters shown of each argument of a folded item


def folded_arguments(raw: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """A folded item's arguments: (name, the first FOLD_VALUE characters of its value,
    how many more there are) for each top-level argument, in the logged order (a string
    as itself, any other value as JSON), and any keys the text repeats (the last value is
    the one shown: it is the one that runs). Text that is not a JSON object is one row
    without a name. Nothing is escaped here: the template shows every part `visible`."""
    duplicates: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append(key)
            result[key] = value
        return result

    try:
        parsed = json.loads(raw, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        return [("", raw[:FOLD_PREVIEW], max(0, len(raw) - FOLD_PREVIEW))], []
    rows = []
    for key, value in parsed.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        rows.append((key, text[:FOLD_VALUE], max(0, len(text) - FOLD_VALUE)))
    return rows, sorted(set(duplicates))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: object) -> str:
    r"""`text` with every invisible or layout-changing character replaced by `\uXXXX`."""
    return _HIDDEN.sub(_escape, str(text))


def pretty_arguments(raw: str) -> tuple[str, list[str]]:
    """The logged argument text re-indented for reading, and any keys it repeats.

    Key order is the logged order. Returns ("", []) when the text is not JSON (the raw
    text is always shown next to it, so nothing is hidden). A repeated key matters: JSON
    parsers keep the last value, which is the one that runs.
    """
    duplicates: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append(key)
            result[key] = value
        return result

    try:
        parsed = json.loads(raw, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        return "", []
    return json.dumps(parsed, indent=2, ensure_ascii=False), sorted(set(duplicates))


def shell_reading(command: str) -> dict[str, Any]:
    """The simple commands a shell string runs, as the command reader (the one rules and
    the blocklist use) sees them, and why it cannot read it completely, if it cannot."""
    argv = ("bash", "-c", str(command))
    reading = read_command(argv)
    if reading.unreadable is None:
        words = [command.argv for command in reading.commands]
    else:  # what deny rules see of it: the parts as well as they can be told apart
        words = [part.argv for part in command_parts(argv).parts]
    parts = [[visible(word) for word in part] for part in words]
    return {"parts": parts, "unreadable": reading.unreadable}


def has_hidden(text: object) -> bool:
    """Does `text` hold a character `visible` would escape? Such text is never put raw in
    an editor, where the reviewer could not see it."""
    return bool(_HIDDEN.search(str(text)))


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def editable_json(raw: str) -> str:
    """The logged arguments as indented JSON for the edit form, with every invisible
    character written as a JSON escape (`\\u202e`): it reads back to the same value, and
    the reviewer sees it. "" when the text is not JSON."""
    pretty = pretty_arguments(raw)[0]
    return _HIDDEN.sub(_json_escape, pretty)

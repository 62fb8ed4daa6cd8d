"""Turning agent-supplied text into something a reviewer can trust to read.

Nothing here marks anything safe: every function returns a plain string (or list of
strings) and Django's autoescaping does the HTML escaping when it is rendered.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

from dispatcher.policy.parts import command_parts
from dispatcher.policy.reading import read_command

# What is shown escaped is decided from Unicode properties of the database Python ships
# (unicodedata), not from a hand list, so a character a list forgot cannot slip through:
# - general categories Cc (controls; tab and newline are kept as layout), Cf (format:
#   zero-width and joiner characters, bidi controls, soft hyphen, the tag block, BOM,
#   interlinear annotation marks, ...), Cs (lone surrogates), Zl and Zp (line and
#   paragraph separators);
# - every space character (Zs) but the plain space: a no-break or thin space reads as a
#   space on the page and is not one to a shell or a parser;
# - bidi controls by bidirectional class (LRE ... PDI), and LRM, RLM, ALM;
# - the default-ignorable code points (DerivedCoreProperties: Other_Default_Ignorable +
#   Cf + Variation_Selector). unicodedata has neither of the two source properties, so
#   their rows of PropList.txt are below, code points that no general category names:
#   the combining grapheme joiner, the Hangul fillers (blank, yet letters to a parser),
#   Khmer inherent vowels, the Mongolian free variation selectors, both blocks of
#   variation selectors, and the reserved default-ignorable ranges (unassigned today,
#   invisible the day they are assigned);
# - U+2800 Braille pattern blank, a "letter" that renders as a space.
_OTHER_DEFAULT_IGNORABLE = (  # PropList.txt: Other_Default_Ignorable_Code_Point
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x2065, 0x2065),
    (0x3164, 0x3164),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),  # E0000, E0002..E001F, E0080..E00FF, E01F0..E0FFF and the tags
)
_VARIATION_SELECTORS = ((0x180B, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF))
_LOOKS_LIKE_SPACE = ((0x2800, 0x2800),)
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Zs"})
_BIDI_CONTROLS = frozenset({"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"})
_LAYOUT = frozenset({"\t", "\n", " "})
# Where categories are looked up: planes 0-1 and 14. Planes 2-3 hold only CJK ideographs,
# 4-13 are unassigned and 15-16 private use (tests/approvals walks all seventeen).
_PLANES = (range(0x0000, 0x20000), range(0xE0000, 0xF0000))


def _by_property(char: str) -> bool:
    category = unicodedata.category(char)
    if category in _HIDDEN_CATEGORIES:
        return char not in _LAYOUT
    return unicodedata.bidirectional(char) in _BIDI_CONTROLS


def _listed() -> set[int]:
    ranges = (*_OTHER_DEFAULT_IGNORABLE, *_VARIATION_SELECTORS, *_LOOKS_LIKE_SPACE)
    return {code for low, high in ranges for code in range(low, high + 1)}


def is_hidden(char: str) -> bool:
    """Is `char` invisible, or does it change how text around it looks (see above)?"""
    return _by_property(char) or ord(char) in _LISTED


def _hidden_pattern() -> re.Pattern[str]:
    """One character class of every hidden code point, built once at import."""
    codes = _LISTED | {code for plane in _PLANES for code in plane if _by_property(chr(code))}
    ranges: list[tuple[int, int]] = []
    for code in sorted(codes):
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    parts = (
        re.escape(chr(low)) if low == high else f"{re.escape(chr(low))}-{re.escape(chr(high))}"
        for low, high in ranges
    )
    return re.compile("[" + "".join(parts) + "]")


_LISTED = _listed()
_HIDDEN = _hidden_pattern()


# A queue item folds logged arguments longer than FOLD_AT characters: it shows the first
# FOLD_PREVIEW of them, and "Show all" loads the whole item (the call's own page shows
# everything). Each item of a long queue then stays a few kilobytes.
FOLD_AT = 4000
FOLD_PREVIEW = 1000
FOLD_VALUE = 300  # characters shown of each argument of a folded item


def _parsed_noting_repeats(raw: str) -> tuple[Any, list[str]]:
    """The JSON text parsed (NOT_JSON when it is not JSON) and the keys an object in it
    repeats (JSON parsers keep the last value, the one that runs)."""
    duplicates: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                duplicates.append(key)
            result[key] = value
        return result

    try:
        return json.loads(raw, object_pairs_hook=hook), duplicates
    except (ValueError, RecursionError):
        return NOT_JSON, []


NOT_JSON = object()


def folded_arguments(raw: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """A folded item's arguments: (name, the first FOLD_VALUE characters of its value,
    how many more there are) for each top-level argument, in the logged order (a string
    as itself, any other value as JSON), and any keys the text repeats (the last value is
    the one shown: it is the one that runs). Text that is not a JSON object is one row
    without a name. Nothing is escaped here: the template shows every part `visible`."""
    parsed, duplicates = _parsed_noting_repeats(raw)
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
    parsed, duplicates = _parsed_noting_repeats(raw)
    if parsed is NOT_JSON:
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

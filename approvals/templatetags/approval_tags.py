"""Filters for showing agent-supplied data. None of them marks anything safe; the one tag,
`session_context`, escapes every value it puts in its markup."""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Iterable
from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from approvals import display
from dispatcher.models import Status

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
def diff_lines(diff: str) -> list[tuple[str, str]]:
    """(css class, line) for each line of a unified diff."""
    lines = []
    for line in str(diff).splitlines():
        if line.startswith(("+++", "---", "@@")):
            kind = "meta"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        lines.append((kind, display.visible(line)))
    return lines


@register.simple_tag
def session_context(history: Iterable[Any]) -> SafeString:
    """The `<li>` of each earlier call of a request's session: its tool, outcome, who
    decided and why (the reason cut at 300 characters, as `truncatechars:300`).

    The one helper here that returns markup: every value in it goes through `html.escape`,
    which is what Django's `escape` (and so autoescaping) runs, after `visible`. Built here
    rather than by a template loop, and with f-strings rather than `format_html`: every
    pushed ask renders it (20 rows), and the loop was most of the fragment's render
    (1.4 of 2.3 ms; with `format_html` 0.52 ms for 20 rows, this 0.11 ms: docs/benchmarks.md,
    "After the full run").
    """
    parts = []
    for call in history:
        reason = f": {_escape(_first_chars(_visible(call.reason), 300))}" if call.reason else ""
        parts.append(
            f"<li><code>{_escape(_visible(call.name))}</code> "
            f'<span class="status status-{_escape(call.status)}">'
            f"{_escape(_STATUS_LABELS.get(call.status, call.status))}</span> "
            f'<span class="muted">{_escape(_visible(call.decided_by or ""))}</span>{reason}</li>'
        )
    return mark_safe("".join(parts))  # noqa: S308 (every part escaped above)


_escape, _visible = html.escape, display.visible
_STATUS_LABELS = {value: str(label) for value, label in Status.choices}


def _first_chars(text: str, length: int) -> str:
    """`Truncator(text).chars(length)`, without its per-character walk when the text is
    short enough that nothing can be cut (combining characters only lower the count)."""
    normalized = unicodedata.normalize("NFC", text)
    if len(normalized) <= length:
        return normalized
    return Truncator(normalized).chars(length)

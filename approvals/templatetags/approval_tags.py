"""Filters for showing agent-supplied data. None of them marks anything safe."""

from __future__ import annotations

from django import template

from approvals import display

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

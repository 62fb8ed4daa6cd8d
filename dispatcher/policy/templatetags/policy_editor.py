"""Filters for the rules editor's fragments. None of them marks anything safe."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def get_choice(choices: dict[str, Any], name: str) -> Any:
    return choices.get(name, {})


@register.filter
def rows_with_problems(rows: list[Any]) -> int:
    return sum(1 for row in rows if row.problems)

"""Filters for showing what the audit log holds. None of them marks anything safe."""

from __future__ import annotations

import json

from django import template

register = template.Library()


@register.filter
def as_json(value: object) -> str:
    """JSON, indented, as text (autoescaping still applies): never a Python repr."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)

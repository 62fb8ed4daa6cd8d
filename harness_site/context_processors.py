"""Template context shared by every page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

ROLES = frozenset({"reviewer", "auditor", "admin"})


def _roles(user: Any) -> frozenset[str]:
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if user.is_superuser:
        return ROLES
    return frozenset(user.groups.filter(name__in=ROLES).values_list("name", flat=True))


def roles(request: HttpRequest) -> dict[str, Any]:
    """`roles`: the signed-in user's roles (groups), read at most once per page, lazily."""
    return {"roles": SimpleLazyObject(lambda: _roles(request.user))}

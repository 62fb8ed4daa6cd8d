"""Template context shared by every page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from audit.roles import roles_of


def roles(request: HttpRequest) -> dict[str, Any]:
    """`roles`: the signed-in user's roles (groups), read at most once per page, lazily."""
    return {"roles": SimpleLazyObject(lambda: roles_of(request.user))}

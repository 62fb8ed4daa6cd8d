"""Every page says its access once, with @role_required: no role check in a view's body,
no page a signed-in user without the role can open. The few views that are not behind a
role say here why."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

# Paths of views with an authentication of their own: the agent API and its hooks (agent
# tokens, never a session), Django's admin (staff only), the people's pages under
# accounts/ (allauth's signing in and out, single sign-on, second factors, sessions: each
# is for anyone signing in, or for the signed-in person's own account), and OAuth
# (agentauth/: public metadata, the token endpoints authenticated by code, PKCE or token,
# and the consent and device pages, which need any signed-in person: a person approves
# their own agent).
OWN_AUTHENTICATION = ("api/", "admin/", "accounts/", ".well-known/", "oauth/")
# Human views reachable without a role, and why.
WITHOUT_A_ROLE = {
    "harness_site.views.home": "the overview: a signed-in user without a role sees a page saying so",
    "approvals.views.link": "one-tap links: the signed token names the person and the call",
    "approvals.notifications.views.service_worker": "the push service worker's static script",
    "agentauth.views.my_agents": "any signed-in person: their own agents",
    "agentauth.views.sign_out": "any signed-in person: their own agent's tokens",
    "agentauth.views.revoke": "any signed-in person: their own agent",
}


def views(
    resolver: URLResolver | None = None, prefix: str = ""
) -> Iterator[tuple[str, Callable[..., Any]]]:
    for pattern in (resolver or get_resolver()).url_patterns:
        if isinstance(pattern, URLResolver):
            yield from views(pattern, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.callback


def name_of(view: Callable[..., Any]) -> str:
    return f"{getattr(view, '__module__', '')}.{getattr(view, '__name__', type(view).__name__)}"


def test_every_human_page_says_its_role_with_role_required() -> None:
    unmarked = [
        (path, name_of(view))
        for path, view in views()
        if not path.startswith(OWN_AUTHENTICATION)
        and name_of(view) not in WITHOUT_A_ROLE
        and getattr(view, "required_role", None) is None
    ]
    assert unmarked == []


def test_the_exemptions_are_views_that_exist() -> None:
    names = {name_of(view) for _, view in views()}
    assert set(WITHOUT_A_ROLE) <= names

"""rtteam's sweep of the human surfaces, beyond tests/teams/test_cross_team.py's walk: every
URL of the URLconf called by a member of one team, with the other team's ids in the path,
in filters (?agent=, ?user=, ?call=, ?team=, ...), with htmx's headers and with every
method (HEAD, OPTIONS, PUT, PATCH, DELETE too), shows and changes nothing of the other
team and never fails (500); and every POST of the URLconf without a CSRF token is refused,
but the machine endpoints that authenticate otherwise (the identity provider's signed
deprovisioning, OAuth's token, revocation and device endpoints)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import Resolver404, resolve

from tests.battery.test_policy_corpus import concrete, patterns
from tests.support.factories import make_user, unique
from tests.teams.test_cross_team import SKIPPED, body, form_of, values_of
from tests.teams.world import TEAM_ROLES, make_team, unchanged

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
# Machine endpoints: a signature, a client's credentials or a token authenticate them.
NO_CSRF = (
    "/accounts/deprovision/",
    "/oauth/token/",
    "/oauth/revoke/",
    "/oauth/device-authorization/",
)


def urls(values: dict[str, str], skipped: tuple[str, ...]) -> list[str]:
    found = []
    for text, _entry in patterns():
        if text.startswith(skipped) or not text:
            continue
        url = concrete(text, values)
        if url is None:
            continue
        try:
            resolve(url)
        except Resolver404:
            continue
        found.append(url)
    return found


@pytest.mark.heavy
@pytest.mark.parametrize("role", TEAM_ROLES)
def test_every_url_with_the_other_teams_ids_filters_htmx_and_any_method_shows_nothing(
    role: str,
) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    client = infra.client(role)
    query = "&".join(
        f"{k}={v}"
        for k, v in {
            "agent": pay.agent.agent.name,
            "user": pay.agent.owner.username,
            "tool": "write_file",
            "call": str(pay.approval.call_id),
            "edit": "1",
            "format": "csv",
            "action": "allow",
            "team": str(pay.team.pk),
        }.items()
    )
    # (the session list shows the filter it was given: the agent's name typed in it)
    markers = [m for m in pay.markers if m != pay.agent.agent.name]
    shown, failed, tried = [], [], 0
    for url in urls(values_of(pay, infra), SKIPPED):
        for method in METHODS:
            for headers in ({}, {"HX-Request": "true", "HX-Trigger": "x"}):
                tried += 1
                call = getattr(client, method)
                if method in ("get", "head", "options"):
                    response = call(f"{url}?{query}", headers=headers)
                elif method == "post":
                    response = call(f"{url}?{query}", form_of(pay, infra), headers=headers)
                else:
                    response = call(
                        url,
                        "a=1",
                        content_type="application/x-www-form-urlencoded",
                        headers=headers,
                    )
                page = body(response)
                where = f"{method.upper()} {url} htmx={bool(headers)} -> {response.status_code}"
                if leaks := [m for m in markers if m in page]:
                    shown.append(f"{where}: {leaks}")
                if response.status_code >= 500:
                    failed.append(where)
    assert tried >= 700
    assert shown == [] and failed == []
    assert unchanged(pay) == []


@pytest.mark.heavy
def test_every_post_without_a_csrf_token_is_refused() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    user = make_user(unique("root"), groups=("reviewer", "auditor", "admin"))
    user.is_superuser = user.is_staff = True
    user.save()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    passed, tried = [], 0
    for url in urls(values_of(pay, infra), ("api/",)):
        for headers in ({}, {"HX-Request": "true"}):
            tried += 1
            response = client.post(url, form_of(pay, infra), headers=headers)
            refused = response.status_code == 403 and b"CSRF" in response.content
            if not refused and url not in NO_CSRF:
                passed.append(f"{url} htmx={bool(headers)} -> {response.status_code}")
    assert tried > 100
    assert passed == []
    assert unchanged(pay) == [] and unchanged(infra) == []

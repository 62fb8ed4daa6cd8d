"""Red team (rt2web) of the device page's review step: what held, pinned."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.test import Client
from oauth2_provider.models import DeviceGrant

from teams.models import Team
from tests.support.oauth import (
    HOOKS,
    harness_hook_client,
    just_signed_in,
    member,
    no_wrong_codes_counted,
)

pytestmark = pytest.mark.django_db
__all__ = ["no_wrong_codes_counted"]


def _code(**extra: str) -> str:
    answer = Client().post(
        "/oauth/device-authorization/",
        urlencode({"client_id": "harness-hook", "resource": HOOKS, **extra}),
        content_type="application/x-www-form-urlencoded",
    )
    assert answer.status_code == 200, answer.content
    return str(answer.json()["user_code"])


def test_approving_without_the_pages_csrf_token_is_refused(no_wrong_codes_counted: None) -> None:
    harness_hook_client()
    person = member()
    team = Team.objects.filter(memberships__user=person).get()
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person)
    just_signed_in(browser, person)
    page = browser.get("/oauth/device/")
    assert page.status_code == 200
    assert page["X-Frame-Options"] == "DENY"  # never framed (a click on Approve)
    code = _code()
    form = {"user_code": code, "action": "accept", "team": str(team.pk), "mode": "standard"}
    assert browser.post("/oauth/device/", form).status_code == 403
    assert browser.post("/oauth/device/", form | {"action": "review"}).status_code == 403
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZATION_PENDING
    token = browser.cookies["csrftoken"].value
    done = browser.post("/oauth/device/", form | {"csrfmiddlewaretoken": token})
    assert done.status_code == 200, done.content[:600]
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZED


def test_scopes_and_team_names_are_shown_as_text(no_wrong_codes_counted: None) -> None:
    harness_hook_client()
    person = member()
    team = Team.objects.filter(memberships__user=person).get()
    team.name = "<b id=t>team</b>"
    team.save(update_fields=["name"])
    browser = Client()
    browser.force_login(person)
    just_signed_in(browser, person)
    answer = Client().post(
        "/oauth/device-authorization/",
        urlencode({"client_id": "harness-hook", "resource": HOOKS, "scope": "<svg/onload=x>"}),
        content_type="application/x-www-form-urlencoded",
    )
    if answer.status_code != 200:  # (a scope it does not know is refused: nothing shown)
        return
    code = str(answer.json()["user_code"])
    page = browser.post(
        "/oauth/device/", {"user_code": code, "action": "review", "team": str(team.pk)}
    ).content.decode()
    assert "<svg/onload" not in page and "<b id=t>" not in page

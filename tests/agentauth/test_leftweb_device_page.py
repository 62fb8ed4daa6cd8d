"""The device approval page (/oauth/device/) showed a code box, a team and a mode, and an
Approve button: not what the code was for. A device code is for one resource (the hooks
API or the MCP endpoint, agentauth.DeviceResource) of one client with some scopes, so the
person typing it approved without seeing which. The code is reviewed first: the page
then names the client, the resource, the scopes and the agent the device will act as,
escaped, and only that page approves."""

from __future__ import annotations

from html import unescape
from urllib.parse import urlencode

import pytest
from django.test import Client
from oauth2_provider.models import Application, DeviceGrant

from agentauth.models import DeviceResource
from teams.models import Team
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    harness_hook_client,
    member,
    no_wrong_codes_counted,
    signed_in,
)

pytestmark = pytest.mark.django_db
__all__ = ["no_wrong_codes_counted"]

MCP = "http://testserver/mcp/"


def _code(client_id: str = "harness-hook", resource: str = HOOKS) -> str:
    answer = Client().post(
        "/oauth/device-authorization/",
        urlencode({"client_id": client_id, "resource": resource}),
        content_type="application/x-www-form-urlencoded",
    )
    assert answer.status_code == 200, answer.content
    return str(answer.json()["user_code"])


def _review(browser: Client, code: str, team: Team) -> str:
    page = browser.post(
        "/oauth/device/", {"user_code": code, "action": "review", "team": str(team.pk)}
    )
    assert page.status_code == 200, page.content[:800]
    return page.content.decode()


def test_the_page_names_the_resource_client_and_scopes_before_approving(
    no_wrong_codes_counted: None,
) -> None:
    harness_hook_client()
    person = member()
    team = Team.objects.filter(memberships__user=person).get()
    browser = signed_in(person)
    first = browser.get("/oauth/device/").content.decode()
    assert ">Approve</button>" not in first  # nothing is approved before it is shown

    hooks_code = _code(resource=HOOKS)
    page = _review(browser, hooks_code, team)
    text = unescape(page)
    assert "the hooks API" in text and HOOKS in text, text
    assert "the MCP endpoint" not in text
    assert "harness-hook (coding agents&#x27; hooks)" in page or "harness-hook (coding" in text
    assert hooks_code in text
    assert team.name in text
    assert ">Approve</button>" in page
    assert DeviceGrant.objects.get(user_code=hooks_code).status == DeviceGrant.AUTHORIZATION_PENDING

    mcp_code = _code(resource=MCP)
    text = unescape(_review(browser, mcp_code, team))
    assert "the MCP endpoint" in text and MCP in text, text
    assert "the hooks API" not in text

    # Approving from the review page: the approved page names the resource too.
    done = browser.post(
        "/oauth/device/",
        {"user_code": mcp_code, "action": "accept", "team": str(team.pk), "mode": "standard"},
    )
    assert done.status_code == 200, done.content[:800]
    text = unescape(done.content.decode())
    assert "Approved: the device now acts as your agent" in text
    assert "the MCP endpoint" in text and MCP in text
    assert DeviceGrant.objects.get(user_code=mcp_code).status == DeviceGrant.AUTHORIZED
    # The same client in the same team again: the page names the agent made before.
    again = unescape(_review(browser, _code(resource=MCP), team))
    assert "harness-hook" in again and "already" in again, again


def test_what_the_page_shows_of_a_code_is_escaped(no_wrong_codes_counted: None) -> None:
    """The client's name and the stored resource are text from outside (a client's
    registration; a row an old version kept): shown as text, never markup."""
    harness_hook_client()
    client = Application.objects.get(client_id="harness-hook")
    client.name = '<img src=x onerror="alert(1)">Evil'
    client.save(update_fields=["name"])
    person = member()
    team = Team.objects.filter(memberships__user=person).get()
    browser = signed_in(person)
    code = _code()
    DeviceResource.objects.filter(device_grant__user_code=code).update(
        resource="http://testserver/api/v1/hooks/<script>alert(2)</script>"
    )
    page = _review(browser, code, team)
    assert "<img src=x" not in page and "<script>alert(2)" not in page
    assert "&lt;img src=x onerror=" in page and "&lt;script&gt;alert(2)" in page


def test_a_wrong_code_reviewed_shows_nothing_of_any_code(no_wrong_codes_counted: None) -> None:
    harness_hook_client()
    person = member()
    team = Team.objects.filter(memberships__user=person).get()
    browser = signed_in(person)
    _code()
    page = browser.post(
        "/oauth/device/", {"user_code": unique("WRONG"), "action": "review", "team": str(team.pk)}
    )
    assert page.status_code == 400
    text = page.content.decode()
    assert HOOKS not in text and "<dt>Client</dt>" not in text and ">Approve</button>" not in text

"""Red team (rtstep2): django-oauth-toolkit's admins of tokens and codes were editable.

An access token is found by its checksum (agentauth.tokens: SHA-256 of the token); the
admin's change page of an access token let a staff session set that checksum to one of a
string of its choice, which then worked as the agent's credential: an agent's token in a
person's hands without the consent flow, and no audit row. agentauth/admin.py now shows the token admins read-only, with no token,
code or checksum on their pages.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from oauth2_provider.models import AccessToken, Grant, IDToken, RefreshToken

from agentauth.models import AgentClient
from dispatcher.models import AgentSession
from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    DocumentServer,
    authorization_code,
    documents,
    member,
    sign_in_agent,
    token,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _hook(access_token: str, session: str) -> Any:
    body = pre_tool_use(session, "Read", {"file_path": "/home/dev/project/a.txt"})
    return Client().post(
        f"{HOOK_URL}?wait=0",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Bearer {access_token}"},
    )


def _admin() -> Client:
    """A superuser's browser, CSRF checks enforced."""
    root = User.objects.create_superuser(unique("root"), password="pw-root")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(root)
    return browser


def _form(browser: Client, url: str) -> dict[str, Any]:
    """The change page's form as a browser would send it back (its initial values)."""
    page = browser.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    values: dict[str, Any] = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, field.initial)
        if hasattr(value, "pk"):
            value = value.pk
        if isinstance(value, datetime):  # (the admin's split date and time inputs)
            values[f"{name}_0"], values[f"{name}_1"] = value.date(), value.time()
            continue
        if isinstance(value, list | dict):
            value = json.dumps(value)
        values[name] = "" if value is None else value
    values["csrfmiddlewaretoken"] = browser.cookies["csrftoken"].value
    return values


def test_an_admin_cannot_give_an_agents_access_token_a_value_of_its_choice(
    documents: DocumentServer,
) -> None:
    client_id, answer = sign_in_agent(documents, member(), resource=HOOKS)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    victim = AccessToken.objects.get(harness__agent=agent)
    browser = _admin()
    url = f"/admin/oauth2_provider/accesstoken/{victim.pk}/change/"
    page = browser.get(url)
    assert page.status_code == 200  # seen...
    assert answer["access_token"] not in page.content.decode()
    assert victim.token_checksum not in page.content.decode()  # ...without its checksum
    chosen = "hro_" + secrets.token_urlsafe(32)
    form = _form(browser, url) | {"token_checksum": hashlib.sha256(chosen.encode()).hexdigest()}
    changed = browser.post(url, form)
    assert changed.status_code == 403
    session = unique("cc")
    assert _hook(chosen, session).status_code == 401  # no agent answers to the chosen string
    assert not AgentSession.objects.filter(external_id=session).exists()
    assert _hook(answer["access_token"], unique("cc")).status_code == 200  # untouched


@pytest.mark.parametrize("model", ["accesstoken", "refreshtoken", "grant", "idtoken"])
def test_the_token_admins_add_change_and_delete_nothing(
    documents: DocumentServer, model: str
) -> None:
    client_id, code, verifier = authorization_code(documents)
    assert token(client_id, code, verifier).status_code == 200
    authorization_code(documents)  # a code not exchanged: its grant row stays
    browser = _admin()
    assert browser.get(f"/admin/oauth2_provider/{model}/").status_code == 200
    assert browser.get(f"/admin/oauth2_provider/{model}/add/").status_code == 403
    row = {
        "accesstoken": AccessToken,
        "refreshtoken": RefreshToken,
        "grant": Grant,
        "idtoken": IDToken,
    }[model].objects.first()
    if row is None:
        return  # (no ID token without the openid scope)
    url = f"/admin/oauth2_provider/{model}/{row.pk}/"
    csrf = browser.cookies["csrftoken"].value
    assert browser.post(url + "change/", {"csrfmiddlewaretoken": csrf}).status_code == 403
    assert (
        browser.post(url + "delete/", {"csrfmiddlewaretoken": csrf, "post": "yes"}).status_code
        == 403
    )
    listing = browser.post(
        f"/admin/oauth2_provider/{model}/",
        {
            "csrfmiddlewaretoken": csrf,
            "action": "delete_selected",
            "_selected_action": [row.pk],
            "post": "yes",
        },
    )
    assert listing.status_code in (200, 302, 403)
    assert type(row).objects.filter(pk=row.pk).exists()
    page = browser.get(url + "change/").content.decode()
    for secret in ("token", "code"):
        value = getattr(row, secret, "")
        assert not value or value not in page
    assert not re.search(r'name="(token|code|token_checksum)"', page)

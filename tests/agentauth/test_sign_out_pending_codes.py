"""A code approved before its agent was signed out, and exchanged after, gave a token:
the owner's "Sign out" deleted every token of the agent, but an authorization code or a
device code approved for it and not yet exchanged (the sign-in of the lost device,
under way) stayed, and its exchange made a new token that acted as the agent, over real
HTTP against a live Harness. Such a code is now refused at the exchange (invalid_grant),
and a sign-in started after the sign-out works, on the same agent."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx
import pytest

from agentauth.models import AgentClient
from dispatcher.models import ToolCall
from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import unique
from tests.support.oauth import REDIRECT, harness_hook_client, pkce
from tests.support.oauth_live import OAuthStack, Person, query_of, team_member

pytestmark = [pytest.mark.live]

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
_HIDDEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def _person(stack: OAuthStack) -> tuple[Any, Person]:
    owner = team_member()
    return owner, Person(stack.url, owner.username, "pw-" + owner.username)


def _sign_out(stack: OAuthStack, person: Person, agent_id: int) -> None:
    """The owner presses "Sign out" on /account/agents/."""
    page = person.http.get("/account/agents/")
    token = html.unescape(_HIDDEN.findall(page.text)[0])
    answer = person.http.post(
        f"/account/agents/{agent_id}/sign-out",
        data={"csrfmiddlewaretoken": token},
        headers={"Referer": stack.url + "/account/agents/"},
    )
    assert answer.status_code in (200, 302), answer.text[:500]


def _hook(stack: OAuthStack, access: str) -> httpx.Response:
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/README.md"})
    return httpx.post(
        stack.url + HOOK_URL, json=body, headers={"Authorization": f"Bearer {access}"}
    )


def _code(stack: OAuthStack, person: Person, client_id: str) -> tuple[str, str]:
    """(code, verifier): `person` consents to the client for the hooks API."""
    verifier, challenge = pkce()
    query = httpx.QueryParams(
        response_type="code",
        client_id=client_id,
        redirect_uri="http://127.0.0.1:5555/callback",
        code_challenge=challenge,
        code_challenge_method="S256",
        state="st",
        resource=stack.url + "/api/v1/hooks/",
    )
    back = person.consent(f"{stack.url}/oauth/authorize/?{query}", mode="standard")
    return query_of(back)["code"], verifier


def _exchange(stack: OAuthStack, client_id: str, code: str, verifier: str) -> httpx.Response:
    return httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": "http://127.0.0.1:5555/callback",
            "resource": stack.url + "/api/v1/hooks/",
        },
    )


def test_an_authorization_code_approved_before_the_sign_out_gives_no_token(
    oauth_stack: OAuthStack, live_db: None
) -> None:
    client_id = oauth_stack.documents.client(
        f"/{unique('client')}.json", [REDIRECT], name="Claude Test"
    )
    owner, person = _person(oauth_stack)
    code, verifier = _code(oauth_stack, person, client_id)
    first = _exchange(oauth_stack, client_id, code, verifier)
    assert first.status_code == 200, first.text
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    assert _hook(oauth_stack, first.json()["access_token"]).status_code == 200
    # The lost device's client asks again; its owner approves, then signs the agent out
    # before the client exchanged the code.
    pending, pending_verifier = _code(oauth_stack, person, client_id)
    _sign_out(oauth_stack, person, agent.pk)
    assert _hook(oauth_stack, first.json()["access_token"]).status_code == 401

    late = _exchange(oauth_stack, client_id, pending, pending_verifier)
    # Was: 200, and its token's calls were admitted as the agent.
    assert late.status_code == 400, late.text
    assert late.json()["error"] == "invalid_grant", late.text
    assert "signed out" in late.json().get("error_description", ""), late.text
    calls = ToolCall.objects.filter(session__agent=agent).count()

    # Signing in again after the sign-out works, as the same agent.
    code, verifier = _code(oauth_stack, person, client_id)
    again = _exchange(oauth_stack, client_id, code, verifier)
    assert again.status_code == 200, again.text
    assert AgentClient.objects.get(application__client_id=client_id).agent_id == agent.pk
    answer = _hook(oauth_stack, again.json()["access_token"])
    assert answer.status_code == 200, answer.text
    assert answer.json()["hookSpecificOutput"]["permissionDecision"] == "allow", answer.text
    assert ToolCall.objects.filter(session__agent=agent).count() == calls + 1


def test_a_device_code_approved_before_the_sign_out_gives_no_token(
    oauth_stack: OAuthStack, live_db: None
) -> None:
    harness_hook_client()
    owner, person = _person(oauth_stack)

    def approved() -> str:
        asked = httpx.post(
            oauth_stack.url + "/oauth/device-authorization/", data={"client_id": "harness-hook"}
        )
        assert asked.status_code == 200, asked.text
        assert "Approved" in person.approve_device(asked.json()["user_code"], mode="standard")
        return str(asked.json()["device_code"])

    def exchange(device_code: str) -> httpx.Response:
        return httpx.post(
            oauth_stack.url + "/oauth/token/",
            data={
                "grant_type": DEVICE_GRANT,
                "client_id": "harness-hook",
                "device_code": device_code,
            },
        )

    first = exchange(approved())
    assert first.status_code == 200, first.text
    agent = AgentClient.objects.get(owner=owner, application__client_id="harness-hook").agent
    pending = approved()
    _sign_out(oauth_stack, person, agent.pk)

    late = exchange(pending)
    # Was: 200, a token of the agent made after every token of it was revoked.
    assert late.status_code == 400, late.text
    assert late.json()["error"] in ("invalid_grant", "access_denied"), late.text
    assert _hook(oauth_stack, first.json()["access_token"]).status_code == 401

    again = exchange(approved())
    assert again.status_code == 200, again.text
    answer = _hook(oauth_stack, again.json()["access_token"])
    assert answer.json()["hookSpecificOutput"]["permissionDecision"] == "allow", answer.text

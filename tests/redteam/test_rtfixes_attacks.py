"""Red-team rtfixes: the fixes of wt-fixes (client deletion by any path, a code's
resource, escaped tokens masked, revocation denying queued calls, the hourly bound of
new signed-in agents) attacked with real HTTP requests against a live daphne, on the
run's PostgreSQL and Redis."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from oauth2_provider.models import Application, DeviceGrant

from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import unique
from tests.support.live import LiveStack
from tests.support.oauth import document_server
from tests.support.oauth_live import OAuthStack, Person, oauth_daphne, team_member

pytestmark = [pytest.mark.live]

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')
_FIRST_TEAM = re.compile(r'<select name="team"[^>]*>\s*<option value="(\d+)"')


@pytest.fixture(scope="module")
def stack(live_stack: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthStack]:
    tmp: Path = tmp_path_factory.mktemp("rtfixes")
    with document_server(tmp) as documents, oauth_daphne(live_stack, documents, tmp) as s:
        yield s


def _device_client() -> Application:
    """A public client of the device grant, as an admin registers one (harness-hook is
    another such client)."""
    return Application.objects.create(
        client_id=unique("device-client"),
        name="Device Test",
        client_type="public",
        authorization_grant_type=DEVICE_GRANT,
        redirect_uris="",
        client_secret="",
        hash_client_secret=False,
    )


def _device_code(stack: OAuthStack, client_id: str) -> dict[str, str]:
    answer = httpx.post(
        stack.url + "/oauth/device-authorization/",
        data={"client_id": client_id, "resource": stack.url + "/api/v1/hooks/"},
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _approve(who: Person, user_code: str) -> httpx.Response:
    page = who.http.get("/oauth/device/")
    form = dict(_HIDDEN.findall(page.text))
    data = {
        "user_code": user_code,
        "action": "accept",
        "csrfmiddlewaretoken": form["csrfmiddlewaretoken"],
    }
    if team := _FIRST_TEAM.search(page.text):
        data["team"] = team.group(1)
    return who.http.post("/oauth/device/", data=data, headers={"Referer": str(page.url)})


@pytest.mark.parametrize("how", ["delete_client", "plain delete"])
def test_a_device_code_of_a_deleted_client_approves_nothing(
    stack: OAuthStack, live_db: None, how: str
) -> None:
    """A device code a client asked for, its client deleted before the person typed it:
    the code went on pending (device codes name their client by client_id, no cascade),
    and approving it answered 500 (the client looked up by client_id, gone). The client's
    device codes go with it: typing the code is told the code is unknown, no agent made."""
    from agentauth import services
    from dispatcher.models import Agent

    client = _device_client()
    code = _device_code(stack, client.client_id)
    if how == "delete_client":
        services.delete_client(application=client, actor="test")
    else:
        Application.objects.filter(pk=client.pk).delete()
    owner = team_member()
    who = Person(stack.url, owner.username, "pw-" + owner.username)
    answer = _approve(who, code["user_code"])
    assert answer.status_code == 400, (answer.status_code, answer.text[:300])
    assert not Agent.objects.filter(owner=owner).exists()
    assert not DeviceGrant.objects.filter(client_id=client.client_id).exists()
    # The device polling for its tokens is told its client is unknown (no token).
    polled = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": DEVICE_GRANT,
            "client_id": client.client_id,
            "device_code": code["device_code"],
        },
    )
    assert polled.status_code in (400, 401, 404), polled.text
    assert "access_token" not in polled.text


REDIRECT = "http://127.0.0.1:5555/callback"


def _code(stack: OAuthStack, who: Person, **extra: str) -> tuple[str, str, str]:
    """(client_id, code, verifier): `who` consents to a new client metadata document."""
    from urllib.parse import urlencode

    from tests.support.oauth import pkce
    from tests.support.oauth_live import query_of

    client_id = stack.documents.client(f"/{unique('client')}.json", [REDIRECT])
    verifier, challenge = pkce()
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": REDIRECT,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "s",
        **extra,
    }
    back = query_of(who.consent(f"{stack.url}/oauth/authorize/?{urlencode(params)}"))
    return client_id, back["code"], verifier


def _exchange(
    stack: OAuthStack, client_id: str, code: str, verifier: str, resource: object = None
) -> httpx.Response:
    data: dict[str, object] = {
        "grant_type": "authorization_code",
        "client_id": client_id,
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": REDIRECT,
    }
    if resource is not None:
        data["resource"] = resource
    return httpx.post(stack.url + "/oauth/token/", data=data)  # type: ignore[arg-type]


def _refresh(
    stack: OAuthStack, client_id: str, refresh_token: str, resource: str = ""
) -> httpx.Response:
    data = {"grant_type": "refresh_token", "client_id": client_id, "refresh_token": refresh_token}
    if resource:
        data["resource"] = resource
    return httpx.post(stack.url + "/oauth/token/", data=data)


def test_what_held(stack: OAuthStack, live_db: None) -> None:
    """The attacks on the fixes that found nothing: each answer as the fix says."""
    from django.contrib.auth.models import User
    from django.db import transaction

    from agentauth.models import AgentClient
    from audit.models import AuditEvent
    from dispatcher.models import Agent

    mcp, hooks = stack.url + "/mcp/", stack.url + "/api/v1/hooks/"
    owner = team_member()
    who = Person(stack.url, owner.username, "pw-" + owner.username)

    # A code granted without a resource: any other resource, however written, or both
    # (the parameter repeated), is invalid_target; the code stays usable for MCP.
    client_id, code, verifier = _code(stack, who)
    for other in (
        hooks,
        [mcp, hooks],
        [hooks, hooks],
        mcp.rstrip("/"),
        mcp.upper(),
        mcp.replace("http:", "https:"),
        mcp + "/",
        [mcp, mcp],
    ):
        answer = _exchange(stack, client_id, code, verifier, other)
        assert answer.status_code == 400, (other, answer.text)
        assert answer.json()["error"] == "invalid_target", (other, answer.text)
    answer = _exchange(stack, client_id, code, verifier)
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    # Its refresh token cannot ask for the hooks API either (nor for both).
    for other in (hooks, stack.url + "/api/v1/hooks"):
        refused = _refresh(stack, client_id, tokens["refresh_token"], other)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "invalid_target", refused.text
    refreshed = _refresh(stack, client_id, tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/a.txt"})
    hook = httpx.post(
        f"{stack.url}{HOOK_URL}?wait=0",
        json=body,
        headers={"Authorization": f"Bearer {refreshed.json()['access_token']}"},
    )
    assert hook.status_code == 401, hook.text  # an MCP token is no hooks token

    # A code granted for both resources: a token for both is refused, and a token for
    # one refreshes into no token for the other.
    client_id, code, verifier = _code(stack, who, resource=mcp)
    assert _exchange(stack, client_id, code, verifier, hooks).json()["error"] == "invalid_target"

    # A deletion rolled back after the receiver acted: the revocation rolls back with it
    # (no agent.revoked event, the agent active, its refresh token still working).
    application = Application.objects.get(client_id=client_id)
    agent = AgentClient.objects.get(application=application).agent
    tokens = _exchange(stack, client_id, code, verifier).json()
    with pytest.raises(RuntimeError), transaction.atomic():
        application.delete()
        assert not Agent.objects.get(pk=agent.pk).is_active  # the receiver acted
        raise RuntimeError("rolled back")
    assert Agent.objects.get(pk=agent.pk).is_active
    assert not AuditEvent.objects.filter(kind="agent.revoked", subject=f"agent:{agent.pk}")
    refreshed = _refresh(stack, client_id, tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text

    # The client's owning user deleted (a cascade): the agent another person approved for
    # it is revoked once, and its refresh token mints nothing.
    registrant = User.objects.create_user(unique("registrant"), password="pw")
    # (the rolled-back delete set the instance's pk to None: the row's pk, by client_id)
    assert Application.objects.filter(client_id=client_id).update(user=registrant) == 1
    registrant.delete()
    assert not Agent.objects.get(pk=agent.pk).is_active
    revoked = AuditEvent.objects.filter(kind="agent.revoked", subject=f"agent:{agent.pk}")
    assert [e.actor for e in revoked] == ["harness:client-deleted"]
    gone = _refresh(stack, client_id, refreshed.json()["refresh_token"])
    assert gone.status_code in (400, 401), gone.text
    assert "access_token" not in gone.text

"""A device code binds the resource (RFC 8707) it was asked for, over real HTTP against a
live Harness. A device code kept none: `harness-hook login` asks it for the hooks API, and
the token request could name the MCP endpoint instead and get an MCP token for the same
agent (the hooks/MCP separation lost). A device code is for the resource its device
authorization named (the hooks API when none, as harness-hook asks); a token request, or a
refresh, naming another is invalid_target, and leaves the code for the right request."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from oauth2_provider.models import Application, DeviceGrant

from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use
from tests.support.factories import unique
from tests.support.oauth import harness_hook_client
from tests.support.oauth_live import OAuthStack, Person, team_member

pytestmark = [pytest.mark.live]

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _device_code(stack: OAuthStack, client_id: str, **resource: str) -> dict[str, Any]:
    answer = httpx.post(
        stack.url + "/oauth/device-authorization/", data={"client_id": client_id, **resource}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _approved(stack: OAuthStack, client_id: str, **resource: str) -> str:
    """A device code of `client_id` asked (with `resource=` if given), approved by a
    person; its device_code."""
    code = _device_code(stack, client_id, **resource)
    owner = team_member()
    page = Person(stack.url, owner.username, "pw-" + owner.username).approve_device(
        code["user_code"], mode="standard"
    )
    assert "Approved" in page
    return str(code["device_code"])


def _token(stack: OAuthStack, client_id: str, device_code: str, **resource: str) -> Any:
    body = {"grant_type": DEVICE_GRANT, "client_id": client_id, "device_code": device_code}
    return httpx.post(stack.url + "/oauth/token/", data={**body, **resource})


def _refresh(stack: OAuthStack, client_id: str, refresh_token: str, **resource: str) -> Any:
    body = {"grant_type": "refresh_token", "client_id": client_id, "refresh_token": refresh_token}
    return httpx.post(stack.url + "/oauth/token/", data={**body, **resource})


def _at_hooks(stack: OAuthStack, access: str) -> httpx.Response:
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/README.md"})
    return httpx.post(
        stack.url + HOOK_URL, json=body, headers={"Authorization": f"Bearer {access}"}
    )


def _at_mcp(stack: OAuthStack, access: str) -> httpx.Response:
    return httpx.post(
        stack.url + "/mcp/",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {access}",
        },
    )


def _refused_for(answer: Any, bound: str, asked: str) -> None:
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_target", answer.text
    said = answer.json()["error_description"]
    assert f"This device code was asked for {bound}, so its token is for that" in said, said
    assert f"not '{asked}'" in said and "start a new sign-in naming it" in said, said
    assert "access_token" not in answer.text


def test_a_device_code_for_the_hooks_api_gives_no_mcp_token(
    oauth_stack: OAuthStack, live_db: None
) -> None:
    harness_hook_client()  # a live test's database was flushed by the tests before it
    hooks, mcp = oauth_stack.url + "/api/v1/hooks/", oauth_stack.url + "/mcp/"
    device_code = _approved(oauth_stack, "harness-hook", resource=hooks)

    refused = _token(oauth_stack, "harness-hook", device_code, resource=mcp)
    _refused_for(refused, hooks, mcp)
    # The refused request did not use the code up: the device asks again, rightly.
    answer = _token(oauth_stack, "harness-hook", device_code, resource=hooks)
    assert answer.status_code == 200, answer.text
    tokens = answer.json()
    assert tokens["access_token"].startswith("hro_")
    hook = _at_hooks(oauth_stack, tokens["access_token"])
    assert hook.status_code == 200, hook.text
    assert hook.json()["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert _at_mcp(oauth_stack, tokens["access_token"]).status_code == 401

    # Its refresh token stays for the hooks API too.
    again = _refresh(oauth_stack, "harness-hook", tokens["refresh_token"], resource=mcp)
    assert again.status_code == 400 and again.json()["error"] == "invalid_target", again.text
    renewed = _refresh(oauth_stack, "harness-hook", tokens["refresh_token"])
    assert renewed.status_code == 200, renewed.text
    assert _at_hooks(oauth_stack, renewed.json()["access_token"]).status_code == 200
    assert _at_mcp(oauth_stack, renewed.json()["access_token"]).status_code == 401


def test_a_device_code_asked_without_a_resource_is_for_the_hooks_api(
    oauth_stack: OAuthStack, live_db: None
) -> None:
    """As `harness-hook login` asks it: the token request naming the hooks API (as it
    does) or none gets a hooks token; naming MCP is refused."""
    harness_hook_client()
    hooks, mcp = oauth_stack.url + "/api/v1/hooks/", oauth_stack.url + "/mcp/"
    device_code = _approved(oauth_stack, "harness-hook")
    _refused_for(_token(oauth_stack, "harness-hook", device_code, resource=mcp), hooks, mcp)
    answer = _token(oauth_stack, "harness-hook", device_code)
    assert answer.status_code == 200, answer.text
    assert _at_hooks(oauth_stack, answer.json()["access_token"]).status_code == 200
    assert _at_mcp(oauth_stack, answer.json()["access_token"]).status_code == 401


def test_a_device_code_asked_for_mcp_gives_no_hooks_token(
    oauth_stack: OAuthStack, live_db: None
) -> None:
    """A device client an admin registered, asking for the MCP endpoint: MCP only."""
    client = Application.objects.create(
        client_id=unique("device-client"),
        name="Device Test",
        client_type="public",
        authorization_grant_type=DEVICE_GRANT,
        redirect_uris="",
        client_secret="",
        hash_client_secret=False,
    )
    hooks, mcp = oauth_stack.url + "/api/v1/hooks/", oauth_stack.url + "/mcp/"
    device_code = _approved(oauth_stack, client.client_id, resource=mcp)
    _refused_for(_token(oauth_stack, client.client_id, device_code, resource=hooks), mcp, hooks)
    answer = _token(oauth_stack, client.client_id, device_code)
    assert answer.status_code == 200, answer.text
    assert _at_hooks(oauth_stack, answer.json()["access_token"]).status_code == 401
    assert _at_mcp(oauth_stack, answer.json()["access_token"]).status_code != 401


@pytest.mark.parametrize(
    ("resources", "said"),
    [
        (["https://elsewhere.example/mcp/"], "is not served by this Harness"),
        (["{url}/mcp/", "{url}/api/v1/hooks/"], "for one resource only"),
    ],
    ids=["elsewhere", "both"],
)
def test_a_device_code_for_another_resource_or_two_is_not_issued(
    oauth_stack: OAuthStack, live_db: None, resources: list[str], said: str
) -> None:
    harness_hook_client()
    before = DeviceGrant.objects.count()
    answer = httpx.post(
        oauth_stack.url + "/oauth/device-authorization/",
        data={
            "client_id": "harness-hook",
            "resource": [r.format(url=oauth_stack.url) for r in resources],
        },
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_target"
    assert said in answer.json()["error_description"], answer.text
    assert DeviceGrant.objects.count() == before

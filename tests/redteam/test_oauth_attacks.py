"""Red-team attacks on Harness as the authorization server of /mcp/ (agentauth): each
test is an attack a client or a signed-in person could try, and what Harness answers."""

from __future__ import annotations

import pytest
from django.test import Client
from oauth2_provider.cimd import CIMDError
from oauth2_provider.models import DeviceGrant

from agentauth.cimd import DoorFetcher
from agentauth.models import PendingAgent
from dispatcher.gateways import mcp_http
from dispatcher.models import Agent
from floor.errors import ServiceError
from teams.services import create_team
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    MCP,
    REDIRECT,
    DocumentServer,
    authorization_code,
    authorize_params,
    documents,
    member,
    pending_device_code,
    pkce,
    signed_in,
    token,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]


def test_an_authorization_request_without_pkce_gets_no_code(documents: DocumentServer) -> None:
    client_id = documents.client(f"/{unique('client')}.json", [REDIRECT])
    params = authorize_params(client_id, "x")
    del params["code_challenge"], params["code_challenge_method"]
    page = signed_in(member()).get("/oauth/authorize/", params)
    assert page.status_code in (302, 400)
    if page.status_code == 302:
        assert "code=" not in page["Location"] and "error=" in page["Location"]


def test_a_code_with_a_wrong_verifier_or_none_gets_no_token(documents: DocumentServer) -> None:
    client_id, code, verifier = authorization_code(documents)
    assert token(client_id, code, pkce()[0]).status_code == 400
    answer = Client().post(
        "/oauth/token/",
        {
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "redirect_uri": "http://127.0.0.1:5555/callback",
        },
    )
    assert answer.status_code == 400


def test_a_code_is_used_once_and_by_its_own_client_only(documents: DocumentServer) -> None:
    client_id, code, verifier = authorization_code(documents)
    other = documents.client(f"/{unique('client')}.json", [REDIRECT])
    assert token(other, code, verifier).status_code in (400, 401)
    assert token(client_id, code, verifier).status_code == 200
    assert token(client_id, code, verifier).status_code == 400


def test_a_code_for_the_mcp_endpoint_is_not_exchanged_for_a_hooks_token(
    documents: DocumentServer,
) -> None:
    client_id, code, verifier = authorization_code(documents)
    answer = token(client_id, code, verifier, resource=HOOKS)
    assert answer.status_code == 400, answer.content
    assert b"invalid_target" in answer.content, answer.content


def test_a_refresh_token_for_the_mcp_endpoint_does_not_become_a_hooks_token(
    documents: DocumentServer,
) -> None:
    client_id, code, verifier = authorization_code(documents)
    first = token(client_id, code, verifier).json()
    answer = Client().post(
        "/oauth/token/",
        {
            "grant_type": "refresh_token",
            "client_id": client_id,
            "refresh_token": first["refresh_token"],
            "resource": HOOKS,
        },
    )
    assert answer.status_code == 400, answer.content
    assert b"invalid_target" in answer.content, answer.content


def test_a_token_for_another_server_is_refused_at_the_token_endpoint(
    documents: DocumentServer,
) -> None:
    client_id, code, verifier = authorization_code(documents)
    answer = token(client_id, code, verifier, resource="https://elsewhere.example/mcp/")
    assert answer.status_code == 400, answer.content
    assert b"invalid_target" in answer.content, answer.content


def test_an_agent_access_token_opens_no_human_page_or_agent_api(
    documents: DocumentServer,
) -> None:
    client_id, code, verifier = authorization_code(documents)
    access = token(client_id, code, verifier).json()["access_token"]
    assert mcp_http.authenticate(access, "", MCP)[0] is not None
    bearer = {"Authorization": f"Bearer {access}"}
    for path in ("/", "/approvals/", "/teams/", "/account/agents/", "/oauth/device/"):
        page = Client().get(path, headers=bearer)
        assert page.status_code == 302 and "/accounts/login/" in page["Location"], path
    assert Client().get("/api/v1/tools", headers=bearer).status_code == 401
    # An MCP token is no hooks token either.
    hook = Client().post(
        "/api/v1/hooks/claude-code",
        {
            "session_id": "s-1",
            "hook_event_name": "PreToolUse",
            "cwd": "/work/project",
            "tool_name": "Bash",
            "tool_input": {"command": "ls"},
            "tool_use_id": "t-1",
        },
        content_type="application/json",
        headers=bearer,
    )
    assert hook.status_code == 401, hook.content


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "2130706433",
        "0x7f000001",
        "127.1",
        "0177.0.0.1",
        "0.0.0.0",  # noqa: S104 - an address a client document must not name
        "[::]",
        "localhost.",
    ],
)
def test_a_client_document_at_a_loopback_address_in_any_spelling_is_not_fetched(
    host: str,
) -> None:
    with pytest.raises(CIMDError):
        DoorFetcher().fetch(f"https://{host}:9/client.json")


def test_a_client_document_that_redirects_is_not_followed(documents: DocumentServer) -> None:
    """A client_id URL on an allowed host that answers 302 (to a document of its own, or to
    an address the door would refuse) is not followed, and no client is registered."""
    real = documents.client(f"/{unique('client')}.json", [REDIRECT])
    for target in (real, "https://localhost:9/x.json"):
        path = f"/{unique('moved')}.json"
        documents.documents[path] = {"$redirect": target}
        before = len(documents.fetched)
        with pytest.raises(CIMDError, match="HTTP 302"):
            DoorFetcher().fetch(documents.url(path))
        assert documents.fetched[before:] == [path]
        verifier, challenge = pkce()
        page = signed_in(member()).get(
            "/oauth/authorize/", authorize_params(documents.url(path), challenge)
        )
        assert page.status_code in (400, 403) or "error=" in page.get("Location", "")
        assert "code=" not in page.get("Location", "")


def test_the_device_page_approves_for_no_team_the_person_is_not_in() -> None:
    theirs = create_team(name=unique("theirs"), actor="test")
    person = member()
    code = pending_device_code()
    page = signed_in(person).post(
        "/oauth/device/",
        {"user_code": code, "action": "accept", "team": str(theirs.pk)},
    )
    assert page.status_code == 403
    assert f"not a member of team '{theirs.name}'" in page.context["error"]
    grant = DeviceGrant.objects.get(user_code=code)
    assert grant.status == DeviceGrant.AUTHORIZATION_PENDING
    assert not Agent.objects.filter(team=theirs).exists()
    assert not PendingAgent.objects.filter(device_grant=grant).exists()


def test_a_device_code_approved_once_cannot_be_taken_over_by_another_person() -> None:
    first, second = member(), member()
    code = pending_device_code()
    mine = first.team_memberships.get().team_id
    ok = signed_in(first).post(
        "/oauth/device/", {"user_code": code, "action": "accept", "team": mine}
    )
    assert ok.status_code == 200 and ok.context["approved"].owner == first
    theirs = second.team_memberships.get().team_id
    for action in ("accept", "deny"):
        again = signed_in(second).post(
            "/oauth/device/", {"user_code": code, "action": action, "team": theirs}
        )
        assert again.status_code == 400, action
    grant = DeviceGrant.objects.get(user_code=code)
    assert grant.status == DeviceGrant.AUTHORIZED and grant.user == first
    assert PendingAgent.objects.get(device_grant=grant).agent.owner == first


def test_of_two_people_approving_one_device_code_at_once_the_second_changes_nothing() -> None:
    """The page reads the code as pending, then approves it: a second person whose page
    read it as pending before the first approved must not take the code over."""
    from agentauth import services

    first, second = member(), member()
    code = pending_device_code()
    read_by_both = DeviceGrant.objects.get(user_code=code)  # both read: pending
    services.approve_device(
        owner=first,
        device_grant=read_by_both,
        team=first.team_memberships.get().team,
        mode="standard",
        actor="test",
    )
    with pytest.raises(ServiceError, match="approved or denied already"):
        services.approve_device(
            owner=second,
            device_grant=read_by_both,
            team=second.team_memberships.get().team,
            mode="standard",
            actor="test",
        )
    grant = DeviceGrant.objects.get(pk=read_by_both.pk)
    assert grant.status == DeviceGrant.AUTHORIZED and grant.user == first
    assert PendingAgent.objects.get(device_grant=grant).agent.owner == first
    assert not Agent.objects.filter(owner=second).exists()


def test_another_persons_agent_is_not_signed_out_or_revoked_by_counting_ids_up(
    documents: DocumentServer,
) -> None:
    client_id, code, verifier = authorization_code(documents)
    access = token(client_id, code, verifier).json()["access_token"]
    victim = mcp_http.authenticate(access, "", MCP)[0]
    assert victim is not None
    thief = signed_in(member())
    for agent_id in range(max(1, victim.pk - 3), victim.pk + 4):
        for action in ("sign-out", "revoke"):
            answer = thief.post(f"/account/agents/{agent_id}/{action}")
            assert answer.status_code == 404, (agent_id, action)
    assert victim.name not in thief.get("/account/agents/").content.decode()
    assert mcp_http.authenticate(access, "", MCP)[0] is not None

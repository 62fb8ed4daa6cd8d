"""Harness as the authorization server of its MCP endpoint (django-oauth-toolkit), in
process: metadata, consent by a signed-in person, the code and token exchange with a
client metadata document fetched over https from another loopback port through the
outbound door, and what the MCP endpoint's authentication makes of the token."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from agentauth.models import AgentClient
from audit.models import AuditEvent
from dispatcher.gateways import mcp_http
from teams.models import Team
from teams.services import add_member, create_team
from tests.support.factories import make_agent, make_user, unique
from tests.support.oauth import (
    HOOKS,
    MCP,
    REDIRECT,
    DocumentServer,
    authorize_params,
    code_from,
    consent,
    documents,
    just_signed_in,
    member,
    no_wrong_codes_counted,
    pending_device_code,
    pkce,
    refresh,
    sign_in_agent,
    signed_in,
    token,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents", "no_wrong_codes_counted"]  # the fixtures (tests/support/oauth.py)


def test_metadata_documents_are_where_mcp_clients_look() -> None:
    server = Client().get("/.well-known/oauth-authorization-server").json()
    assert server["issuer"] == "http://testserver"
    assert server["authorization_endpoint"] == "http://testserver/oauth/authorize/"
    assert server["token_endpoint"] == "http://testserver/oauth/token/"
    assert server["code_challenge_methods_supported"] == ["S256"]
    assert server["client_id_metadata_document_supported"] is True
    assert server["authorization_response_iss_parameter_supported"] is True
    assert server["response_types_supported"] == ["code"]
    assert "registration_endpoint" not in server  # dynamic registration is off by default
    for path in (
        "/.well-known/oauth-protected-resource/mcp/",
        "/.well-known/oauth-protected-resource",
    ):
        resource = Client().get(path).json()
        assert resource["resource"] == MCP
        assert resource["authorization_servers"] == ["http://testserver"]


def test_consent_names_the_client_and_makes_an_agent_owned_by_the_person(
    documents: DocumentServer,
) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT], name="Claude <Test>")
    verifier, challenge = pkce()
    browser = signed_in(person)
    page = browser.get("/oauth/authorize/", authorize_params(client_id, challenge))
    html = page.content.decode()
    assert "Claude &lt;Test&gt;" in html and client_id in html  # named, escaped
    assert "http://127.0.0.1:5555/callback" in html
    assert "http://127.0.0.1:5555" in page["Content-Security-Policy"]  # the form may go there

    query = code_from(consent(browser, authorize_params(client_id, challenge), mode="read_only"))
    assert query["state"] == ["st-1"] and query["iss"] == ["http://testserver"]
    exchanged = token(client_id, query["code"][0], verifier)
    assert exchanged.status_code == 200, exchanged.content[:3000]
    answer = exchanged.json()
    assert answer["access_token"].startswith("hro_") and answer["refresh_token"].startswith("hrr_")
    assert answer["expires_in"] == 3600

    link = AgentClient.objects.select_related("agent").get(owner=person)
    assert (link.registered_via, link.mode, link.application.client_id) == (
        "cimd",
        "read_only",
        client_id,
    )
    agent, session = mcp_http.authenticate(answer["access_token"], "", MCP)
    assert agent is not None and agent.pk == link.agent_id and agent.owner == person
    assert agent.mode_ceiling == "read_only"  # type: ignore[attr-defined]
    event = AuditEvent.objects.get(kind="agent.authorized", subject=f"agent:{agent.pk}")
    assert event.payload["registered_via"] == "cimd" and event.payload["client_id"] == client_id

    # A second consent by the same person for the same client reuses the agent.
    _, again = sign_in_agent(documents, person, client_id=client_id)
    assert mcp_http.authenticate(again["access_token"], "", MCP)[0].pk == agent.pk  # type: ignore[union-attr]
    assert AgentClient.objects.filter(owner=person).count() == 1


def test_consent_needs_a_signed_in_person(documents: DocumentServer) -> None:
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    _, challenge = pkce()
    page = Client().get("/oauth/authorize/", authorize_params(client_id, challenge))
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/?next=")


def test_pkce_plain_is_refused(documents: DocumentServer) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    params = authorize_params(client_id, "x" * 50, code_challenge_method="plain")
    page = signed_in(person).get("/oauth/authorize/", params)
    assert page.status_code == 400 and b"S256 only" in page.content
    # Posting the consent form with plain anyway issues no code, and makes no agent.
    form = {**params, "scope": "agent", "allow": "Authorize", "mode": "standard"}
    answer = signed_in(person).post("/oauth/authorize/", form)
    assert "code=" not in answer.get("Location", "")
    assert not AgentClient.objects.filter(owner=person).exists()


def test_a_redirect_not_in_the_document_is_refused(documents: DocumentServer) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    _, challenge = pkce()
    params = authorize_params(client_id, challenge, redirect_uri="https://evil.example/cb")
    page = signed_in(person).get("/oauth/authorize/", params)
    assert page.status_code == 400 or "error" in page.context
    assert "evil.example" not in page.get("Location", "")


def test_a_document_at_loopback_is_refused_unless_allowed(documents: DocumentServer) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    _, challenge = pkce()
    with override_settings(HARNESS_OUTBOUND_ALLOW=[]):
        page = signed_in(person).get("/oauth/authorize/", authorize_params(client_id, challenge))
    assert page.status_code == 400 or "error" in (page.context or {})
    assert documents.fetched == []  # the door refused before connecting


def test_tokens_carry_the_mcp_audience_and_mcp_refuses_another(documents: DocumentServer) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    verifier, challenge = pkce()
    query = code_from(consent(signed_in(person), authorize_params(client_id, challenge)))
    elsewhere = token(
        client_id, query["code"][0], verifier, resource="https://elsewhere.example/mcp/"
    )
    assert elsewhere.status_code == 400, elsewhere.content[:2000]
    assert b"invalid_target" in elsewhere.content, elsewhere.content[:3000]

    # A token for the hooks API (another of Harness's audiences) does not open /mcp/.
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge, resource=HOOKS)
    query = code_from(consent(signed_in(person), params))
    hooks = token(client_id, query["code"][0], verifier, resource=HOOKS).json()
    assert mcp_http.authenticate(hooks["access_token"], "", MCP) == (None, None)
    assert mcp_http.authenticate(hooks["access_token"], "", HOOKS)[0] is not None


def test_refresh_tokens_rotate_and_a_reused_one_revokes_the_family(
    documents: DocumentServer,
) -> None:
    person = member()
    client_id, first = sign_in_agent(documents, person)
    second = refresh(client_id, first["refresh_token"])
    assert second.status_code == 200
    second_tokens = second.json()
    assert second_tokens["refresh_token"] != first["refresh_token"]
    agent = mcp_http.authenticate(second_tokens["access_token"], "", MCP)[0]
    assert agent is not None and agent.owner == person  # the refreshed token keeps its agent
    assert mcp_http.authenticate(first["access_token"], "", MCP) == (None, None)

    replay = refresh(client_id, first["refresh_token"])
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    # The whole family is revoked: the rotated refresh token no longer works either.
    assert refresh(client_id, second_tokens["refresh_token"]).status_code == 400


def test_revoking_the_agent_or_deactivating_its_owner_stops_every_token(
    documents: DocumentServer,
) -> None:
    from agentauth import services

    person = member()
    _, one = sign_in_agent(documents, person)
    _, two = sign_in_agent(documents, person)
    for answer in (one, two):
        assert mcp_http.authenticate(answer["access_token"], "", MCP)[0] is not None
    User.objects.filter(pk=person.pk).update(is_active=False)
    assert mcp_http.authenticate(one["access_token"], "", MCP) == (None, None)
    User.objects.filter(pk=person.pk).update(is_active=True)
    agent = mcp_http.authenticate(one["access_token"], "", MCP)[0]
    assert agent is not None
    services.revoke_agent(agent=agent, actor="test")
    assert mcp_http.authenticate(one["access_token"], "", MCP) == (None, None)
    assert mcp_http.authenticate(two["access_token"], "", MCP)[0] is not None  # another client's


def test_bearer_tokens_from_create_agent_keep_working() -> None:
    fixture = make_agent()
    agent, _ = mcp_http.authenticate(fixture.token, "", MCP)
    assert agent is not None and agent.pk == fixture.agent.pk


def test_the_printed_hook_settings_say_the_hooks_use_the_sign_in(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from django.core.management import call_command

    for command, client in (
        ("claude_code_settings", "Claude Code"),
        ("codex_settings", "Codex"),
        ("gemini_settings", "Gemini CLI"),
    ):
        call_command(command, "--url", "https://harness.example")
        err = capsys.readouterr().err
        assert f"{client} acts as the agent each developer approves with" in err
        assert "harness-hook login --url https://harness.example" in err
        assert "HARNESS_TOKEN is unset" in err


def test_a_person_sees_and_revokes_their_own_agents_only(documents: DocumentServer) -> None:
    person, other = member(), member()
    client_id, answer = sign_in_agent(documents, person)
    agent = mcp_http.authenticate(answer["access_token"], "", MCP)[0]
    assert agent is not None
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(person)
    page = browser.get("/account/agents/")
    assert agent.name in page.content.decode() and "Claude Test" in page.content.decode()
    assert browser.post(f"/account/agents/{agent.pk}/sign-out").status_code == 403  # CSRF
    stranger = signed_in(other)
    assert stranger.post(f"/account/agents/{agent.pk}/sign-out").status_code == 404
    assert mcp_http.authenticate(answer["access_token"], "", MCP)[0] is not None
    assert signed_in(person).post(f"/account/agents/{agent.pk}/sign-out").status_code == 302
    assert mcp_http.authenticate(answer["access_token"], "", MCP) == (None, None)
    assert refresh(client_id, answer["refresh_token"]).status_code == 400
    event = AuditEvent.objects.get(kind="agent.signed_out", subject=f"agent:{agent.pk}")
    assert event.payload["tokens"] == 1


def test_an_oauth_token_costs_the_same_one_read_as_a_bearer_token(
    documents: DocumentServer, django_assert_num_queries: Any
) -> None:
    from dispatcher import agents

    person = member()
    _, answer = sign_in_agent(documents, person)
    oauth_agent = mcp_http.authenticate(answer["access_token"], "", MCP)[0]
    bearer = make_agent()
    assert oauth_agent is not None
    for agent, secret in ((oauth_agent, answer["access_token"]), (bearer.agent, bearer.token)):
        session = agents.start_session(agent=agent, client="mcp", external_id=unique("mcp"))
        with django_assert_num_queries(1):
            found, known = mcp_http.authenticate(secret, session.external_id, MCP)
        assert known is not None and known.pk == session.pk and found is not None
        with django_assert_num_queries(0):  # what admission needs came with it
            assert found.owner.permission_profile is not None
        with django_assert_num_queries(1):
            assert mcp_http.authenticate(secret, "", MCP)[0] is not None


def test_iss_names_the_issuer_the_request_reached(documents: DocumentServer) -> None:
    """RFC 9207: the `iss` of an authorization response is the issuer of the metadata at
    the same origin; a client that started its sign-in at another issuer sees the
    difference (a mix-up) and drops the code."""
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    _, challenge = pkce()
    browser = Client(HTTP_HOST="localhost")
    browser.force_login(person)
    just_signed_in(browser, person)
    params = authorize_params(client_id, challenge, resource="http://localhost/mcp/")
    query = code_from(consent(browser, params))
    assert query["iss"] == ["http://localhost"] != ["http://testserver"]
    metadata = Client(HTTP_HOST="localhost").get("/.well-known/oauth-authorization-server")
    assert metadata.json()["issuer"] == "http://localhost"


def test_consent_for_a_team_the_person_is_not_in_is_refused(documents: DocumentServer) -> None:
    person, outsider = member(), member()
    their_team = Team.objects.get(memberships__user=outsider)
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    _, challenge = pkce()
    answer = consent(signed_in(person), authorize_params(client_id, challenge), team=their_team)
    assert answer.status_code == 403 and b"not a member of team" in answer.content
    assert "code=" not in answer.get("Location", "")
    assert not AgentClient.objects.filter(owner=person).exists()

    nobody = make_user(unique("dev"))  # in no team at all
    page = signed_in(nobody).get("/oauth/authorize/", authorize_params(client_id, challenge))
    assert b"you are in no team" in page.content
    form = {**authorize_params(client_id, challenge), "scope": "agent", "allow": "Authorize"}
    refused = signed_in(nobody).post("/oauth/authorize/", form)
    assert refused.status_code == 403 and b"not a member of any team" in refused.content


def test_the_agent_works_for_the_team_chosen_and_is_reused_per_team(
    documents: DocumentServer,
) -> None:
    first = create_team(name=unique("team"), actor="test")
    second = create_team(name=unique("team"), actor="test")
    person = member(first)
    add_member(team=second, user=person, role="auditor", actor="test")
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    agents_seen = []
    for team in (first, second, first):
        verifier, challenge = pkce()
        query = code_from(
            consent(signed_in(person), authorize_params(client_id, challenge), team=team)
        )
        answer = token(client_id, query["code"][0], verifier).json()
        agent = mcp_http.authenticate(answer["access_token"], "", MCP)[0]
        assert agent is not None and agent.team_id == team.pk
        agents_seen.append(agent.pk)
    assert agents_seen[0] == agents_seen[2] != agents_seen[1]


def test_a_hooks_token_reaches_the_hooks_in_the_profile_chosen(documents: DocumentServer) -> None:
    """A token for the hooks API (harness-hook login's audience) answers a hook, in a
    session narrowed to the mode the person chose; an MCP token does not reach the hooks."""
    from dispatcher.models import AgentSession
    from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use

    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    issued = {}
    for resource in (HOOKS, MCP):
        verifier, challenge = pkce()
        params = authorize_params(client_id, challenge, resource=resource)
        query = code_from(consent(signed_in(person), params, mode="read_only"))
        issued[resource] = token(client_id, query["code"][0], verifier, resource=resource).json()
    session_id = unique("cc")
    body = pre_tool_use(
        session_id, "Write", {"file_path": "/home/dev/project/a.txt", "content": "x"}
    )

    def hook(access_token: str) -> Any:
        return Client().post(
            f"{HOOK_URL}?wait=0",
            data=body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {access_token}"},
        )

    assert hook(issued[MCP]["access_token"]).status_code == 401
    answer = hook(issued[HOOKS]["access_token"])
    assert answer.status_code == 200, answer.content
    assert answer.json()["hookSpecificOutput"]["permissionDecision"] == "deny"  # read_only
    assert AgentSession.objects.get(external_id=session_id).mode == "read_only"


def test_a_signed_in_agent_stops_when_its_owner_leaves_its_team(documents: DocumentServer) -> None:
    """The agents a person signed in for a team (consent, harness-hook login) act for them
    in that team: their last role there removed, every such token is refused on /mcp/ and
    the hooks, audited; an admin's bearer agent and their agents of other teams go on."""
    from dispatcher import agents
    from teams.services import remove_member
    from tests.support.claude_code_hooks import HOOK_URL, pre_tool_use

    payments, other = (create_team(name=unique("team"), actor="test") for _ in range(2))
    person = member(payments)
    add_member(team=payments, user=person, role="auditor", actor="test")
    add_member(team=other, user=person, role="reviewer", actor="test")
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    issued = {}
    for resource, team in ((HOOKS, payments), (MCP, payments), ("other", other)):
        verifier, challenge = pkce()
        params = authorize_params(client_id, challenge, resource=MCP if team == other else resource)
        query = code_from(consent(signed_in(person), params, team=team))
        answer = token(client_id, query["code"][0], verifier, resource=params["resource"])
        issued[resource] = answer.json()["access_token"]
    bearer, bearer_token = agents.create_agent(
        owner=person, name=unique("ci"), team=payments, actor="admin"
    )

    def hook() -> Any:
        body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/a.txt"})
        return Client().post(
            f"{HOOK_URL}?wait=0",
            data=body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {issued[HOOKS]}"},
        )

    assert hook().status_code == 200
    assert mcp_http.authenticate(issued[MCP], "", MCP)[0] is not None
    # One of two roles in the team gone: still a member, the agents go on.
    remove_member(team=payments, user=person, role="auditor", actor="test")
    assert hook().status_code == 200
    assert mcp_http.authenticate(issued[MCP], "", MCP)[0] is not None

    remove_member(team=payments, user=person, role="reviewer", actor="admin:ops")
    refused = hook()
    assert refused.status_code == 401, refused.content
    assert mcp_http.authenticate(issued[MCP], "", MCP) == (None, None)
    assert mcp_http.authenticate(issued["other"], "", MCP)[0] is not None  # another team's
    assert mcp_http.authenticate(bearer_token, "", MCP)[0] == bearer  # the sponsor's to stop
    left = AuditEvent.objects.filter(kind="team.member_removed", payload__role="reviewer")
    links = AgentClient.objects.filter(owner=person, team=payments).select_related("agent")
    names = sorted(link.agent.name for link in links)
    assert len(names) == 1  # one agent per person, client and team, whatever the audience
    assert left.get(subject=f"team:{payments.pk}").payload["agents_revoked"] == names
    revoked = AuditEvent.objects.filter(kind="agent.revoked", actor="admin:ops")
    assert [event.payload["name"] for event in revoked] == names


def test_an_org_admins_signed_in_agent_stops_with_the_role(documents: DocumentServer) -> None:
    """An organization admin approves agents for any team without joining it: the role
    taken away, their signed-in agent in a team they never joined is revoked (audited in
    the role's event); one in a team they are a member of goes on."""
    from audit.roles import ADMIN, grant_role, remove_role

    joined, unjoined = (create_team(name=unique("team"), actor="test") for _ in range(2))
    person = member(joined)
    grant_role(user=person, role=ADMIN, actor="test")
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    issued = {}
    for team in (joined, unjoined):
        verifier, challenge = pkce()
        params = authorize_params(client_id, challenge)
        query = code_from(consent(signed_in(person), params, team=team))
        answer = token(client_id, query["code"][0], verifier, resource=params["resource"])
        issued[team.pk] = answer.json()["access_token"]
    assert mcp_http.authenticate(issued[unjoined.pk], "", MCP)[0] is not None

    remove_role(user=person, role=ADMIN, actor="admin:ops")
    assert mcp_http.authenticate(issued[unjoined.pk], "", MCP) == (None, None)
    assert mcp_http.authenticate(issued[joined.pk], "", MCP)[0] is not None
    gone = AgentClient.objects.get(owner=person, team=unjoined).agent
    event = AuditEvent.objects.get(kind="role.removed", payload__user=person.username)
    assert event.payload["agents_revoked"] == [gone.name]


def test_a_signed_in_agent_never_changes_owner_or_team(documents: DocumentServer) -> None:
    """A signed-in agent is its person's in its team: moved to a team its owner is not in,
    leaving that team would never stop it; refused, its sponsor may still change."""
    from dispatcher import agents
    from floor.errors import ServiceError

    person, elsewhere = member(), create_team(name=unique("team"), actor="test")
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge)
    code_from(consent(signed_in(person), params))
    agent = AgentClient.objects.get(owner=person).agent
    with pytest.raises(ServiceError, match="cannot change owner or team"):
        agents.transfer_agent(agent=agent, team=elsewhere, actor="admin")
    with pytest.raises(ServiceError, match="cannot change owner or team"):
        agents.transfer_agent(agent=agent, owner=make_user(unique("other")), actor="admin")
    agent.refresh_from_db()
    assert (agent.owner, agent.team) == (person, AgentClient.objects.get(owner=person).team)
    assert agents.transfer_agent(agent=agent, sponsor=make_user(unique("sp")), actor="admin")


def test_guessing_device_codes_is_stopped_after_ten_wrong_ones(
    no_wrong_codes_counted: None,
) -> None:
    """Another developer's pending code, guessed, would make their machine act as the
    guesser's agent: ten wrong codes in fifteen minutes, and the guesser is refused even
    the right one (audited once); the developer approves their own code as before."""
    from oauth2_provider.models import DeviceGrant

    team = create_team(name=unique("team"), actor="test")
    guesser, developer = member(team), member(team)
    code = pending_device_code()
    browser = signed_in(guesser)
    form = {"action": "accept", "team": str(team.pk), "mode": "standard"}
    for n in range(9):
        wrong = browser.post("/oauth/device/", {**form, "user_code": f"WRONG{n:03}"})
        assert wrong.status_code == 400 and "Incorrect user code" in wrong.content.decode()
    assert not AuditEvent.objects.filter(kind="agent.device_codes_locked").exists()
    tenth = browser.post("/oauth/device/", {**form, "user_code": "WRONG999"})
    assert tenth.status_code == 429
    assert "Too many wrong codes: 10 in 15 minutes" in tenth.content.decode()
    right = browser.post("/oauth/device/", {**form, "user_code": code})
    assert right.status_code == 429 and "even with the right code" in right.content.decode()
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZATION_PENDING
    assert not AgentClient.objects.filter(owner=guesser).exists()
    locked = AuditEvent.objects.filter(kind="agent.device_codes_locked").get()
    assert locked.subject == f"user:{guesser.username}"
    assert locked.payload == {"user": guesser.username, "attempts": 10, "window": 900}
    assert browser.get("/oauth/device/").status_code == 200  # the page still opens
    own = signed_in(developer).post("/oauth/device/", {**form, "user_code": code})
    assert own.status_code == 200 and "Approved" in own.content.decode()
    assert AgentClient.objects.get(owner=developer).registered_via == "device"


def test_a_revoked_agent_or_an_inactive_owner_gets_no_new_tokens_by_refresh(
    documents: DocumentServer,
) -> None:
    """(rtoauth's report: the refresh grant minted new tokens for a deactivated person's
    agent; they did not authenticate, but would have once the person was reactivated.)"""
    from agentauth import services

    person = member()
    client_id, first = sign_in_agent(documents, person)
    User.objects.filter(pk=person.pk).update(is_active=False)
    refused = refresh(client_id, first["refresh_token"])
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"
    User.objects.filter(pk=person.pk).update(is_active=True)

    client_id, second = sign_in_agent(documents, person)
    agent = mcp_http.authenticate(second["access_token"], "", MCP)[0]
    assert agent is not None
    services.revoke_agent(agent=agent, actor="test")
    refused = refresh(client_id, second["refresh_token"])
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant"

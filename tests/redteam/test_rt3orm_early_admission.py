"""Red-team of the fast path's early admission (dispatcher.gateways.mcp.EarlyAdmission,
mcp_http.early_read; docs/mcp.md "Admitted on the authentication's trip"): a small
fast-path tools/call is parsed before its token and admitted on the trip that reads the
token, the session and the rate. Each test is an attack; it passes when the attack
fails: a request that should be refused gets the same answer early (a small body) as the
old way (the same call in a body past 16 KiB, padded in its `_meta`, which is parsed
after the token) and leaves nothing behind either way (no call, no audit event, no wait
slot held); concurrent and abandoned requests leave no slot taken."""

# ruff: noqa: F811  (the `gateway` fixture, imported, is each test's argument)
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from agentauth.models import AgentClient
from audit.models import AuditEvent
from dispatcher import agents, limits
from dispatcher.gateways import mcp_http
from dispatcher.models import AgentSession, ToolCall
from teams.models import Team
from tests.mcp.conftest import http_upstream, trusted_upstream  # noqa: F401
from tests.mcp.test_fast_path import (  # noqa: F401
    Gateway,
    call,
    comparable,
    gateway,
    upstream,
)
from tests.support.factories import AgentFixture, make_agent, unique
from tests.support.mcp_requests import initialize
from tests.support.oauth import HOOKS, DocumentServer, documents, member, sign_in_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def padded(body: dict[str, Any]) -> dict[str, Any]:
    """`body` past EARLY_BODY_MAX (a `_meta` the handler ignores): read the old way."""
    pad = "x" * (mcp_http.EARLY_BODY_MAX + 1)
    return {**body, "params": {**body["params"], "_meta": {"pad": pad}}}


def _bad_token(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    g.fx.token = g.fx.token[:-1] + ("a" if g.fx.token[-1] != "a" else "b")
    return {}


def _revoked(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    agents.revoke_agent(agent=g.fx.agent, actor="cli")
    return {}


def _rotated(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    agents.rotate_token(agent=g.fx.agent, actor="cli")  # (the old token is the one sent)
    return {}


def _basic(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    return {"authorization": f"Basic {g.fx.token}"}


def _another_agents_token(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    return {"authorization": f"Bearer {other.fx.token}"}  # (the session is g's)


def _left(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    AgentSession.objects.filter(agent=g.fx.agent).update(left_at=timezone.now())
    return {}


def _another_teams(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    team = Team.objects.create(name=unique("rt3orm"))
    AgentSession.objects.filter(agent=g.fx.agent).update(team=team)  # (not left)
    return {}


def _over_rate(g: Gateway, other: Gateway, settings: Any) -> dict[str, str]:
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.001
    settings.HARNESS_AGENT_REQUEST_BURST = 1
    g.session()  # (another session's initialize: the bucket's one request)
    return {}


REFUSALS = {
    "bad-token": (_bad_token, 401),
    "revoked": (_revoked, 401),
    "rotated": (_rotated, 401),
    "basic-scheme": (_basic, 401),
    "another-agents-session": (_another_agents_token, 404),
    "left-session": (_left, 404),
    "another-teams-session": (_another_teams, 404),
    "over-rate": (_over_rate, 429),
}


@pytest.mark.parametrize("refusal", REFUSALS)
@pytest.mark.parametrize("small", [True, False], ids=["early", "old-way"])
def test_a_refused_request_is_refused_alike_and_leaves_nothing(
    upstream: str,
    gateway: Callable[[AgentFixture], Gateway],
    settings: Any,
    refusal: str,
    small: bool,
) -> None:
    """Bad, revoked, rotated tokens, another scheme, another agent's token on this
    session, a session that was left, the rate: refused before anything is admitted."""
    g, other = gateway(make_agent(mode="trusted")), gateway(make_agent(mode="trusted"))
    session = g.session()
    other.session()
    change, status = REFUSALS[refusal]
    extra = change(g, other, settings)
    before = AuditEvent.objects.count()
    body = call(7, f"{upstream}__echo", {"text": "refused"})
    answer = g.post(body if small else padded(body), session, extra)
    assert answer.status == status, answer.body
    assert b"Traceback" not in answer.body
    assert not ToolCall.objects.filter(tool_use_id__startswith="mcp:7").exists()
    assert AuditEvent.objects.count() == before, list(
        AuditEvent.objects.order_by("-seq").values_list("kind", flat=True)[:3]
    )
    assert limits.waits_held(g.fx.agent) == limits.waits_held(other.fx.agent) == 0


def _answers_both_ways(
    g: Gateway, session_of: Callable[[], str], body: dict[str, Any]
) -> tuple[Any, Any]:
    """`body` early, then the old way, each in a new session of `g`'s."""
    early = g.post(body, session_of())
    old = g.post(padded(body), session_of())
    assert not early.via_sdk and not old.via_sdk
    return comparable(early), comparable(old)


def test_wait_slots_exhausted_refuse_alike_and_record_nothing(
    upstream: str, gateway: Callable[[AgentFixture], Gateway], settings: Any
) -> None:
    """With every wait slot held, the early call is refused as the old one is, and
    nothing of either is recorded (its slot not taken, its rate taken once)."""
    settings.HARNESS_MAX_WAITS_PER_AGENT = 1
    g = gateway(make_agent(mode="trusted"))
    held = limits.reserve_wait(g.fx.agent, 60)
    try:
        early, old = _answers_both_ways(g, g.session, call(4, f"{upstream}__echo", {"text": "w"}))
        assert early == old
        [message] = early[1]
        assert message["error"]["code"] == -32029, message
        assert not ToolCall.objects.filter(tool_use_id__startswith="mcp:4").exists()
        assert limits.waits_held(g.fx.agent) == 1
    finally:
        limits.release_wait(held)


def test_a_read_only_agents_call_is_decided_alike(
    upstream: str, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    """A narrowed mode (read_only) decides the early call as the old one: same answer,
    same audit kinds."""
    g = gateway(make_agent(mode="read_only"))
    early, old = _answers_both_ways(g, g.session, call(5, f"{upstream}__echo", {"text": "r"}))
    assert early == old
    kinds = [
        sorted(AuditEvent.objects.filter(subject=f"call:{c.pk}").values_list("kind", flat=True))
        for c in ToolCall.objects.filter(session__agent=g.fx.agent).order_by("created_at")
    ]
    assert len(kinds) == 2 and kinds[0] == kinds[1], kinds


def test_a_request_id_reused_for_other_arguments_is_refused_alike(
    upstream: str, gateway: Callable[[AgentFixture], Gateway]
) -> None:
    """The same request id with other arguments names the earlier call: refused early
    as the old way refuses it, the first call's result not handed over."""
    g = gateway(make_agent(mode="trusted"))
    session = g.session()
    first = g.post(call(9, f"{upstream}__echo", {"text": "first"}), session)
    assert "echo: first" in json.dumps(first.messages())
    again = call(9, f"{upstream}__echo", {"text": "second"})
    early, old = g.post(again, session), g.post(padded(again), session)
    assert comparable(early) == comparable(old)
    [message] = early.messages()
    assert "already used" in message["error"]["message"], message
    assert ToolCall.objects.filter(session__external_id=session).count() == 1


def test_concurrent_early_calls_leave_no_slot_and_count_the_rate_once_each(
    upstream: str, gateway: Callable[[AgentFixture], Gateway], settings: Any
) -> None:
    """Twenty early calls at once, over a burst of ten: ten are admitted, ten refused
    429 with nothing recorded, and no wait slot is left taken."""
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.001
    settings.HARNESS_AGENT_REQUEST_BURST = 11  # (the initialize takes one)
    g = gateway(make_agent(mode="trusted"))
    session = g.session()

    async def all_at_once() -> list[Any]:
        posts = [
            asyncio.to_thread(g.post, call(100 + i, f"{upstream}__echo", {"text": str(i)}), session)
            for i in range(20)
        ]
        return list(await asyncio.gather(*posts))

    answers = asyncio.run(all_at_once())
    statuses = sorted(a.status for a in answers)
    assert statuses == [200] * 10 + [429] * 10, statuses
    assert ToolCall.objects.filter(session__external_id=session).count() == 10
    assert limits.waits_held(g.fx.agent) == 0


@pytest.mark.parametrize("small", [True, False], ids=["early", "old-way"])
def test_an_oauth_token_for_another_audience_admits_nothing(
    upstream: str,
    gateway: Callable[[AgentFixture], Gateway],
    documents: DocumentServer,
    small: bool,
) -> None:
    """The same agent's access token issued for the hooks API, sent on its MCP session:
    401 both ways, nothing recorded."""
    person = member()
    client_id, answer = sign_in_agent(documents, person)
    agent = AgentClient.objects.get(owner=person, application__client_id=client_id).agent
    g = gateway(AgentFixture(agent, answer["access_token"], person))
    host = {"host": "testserver"}
    session = g.post(initialize("rt3orm", run=unique("run")), "", host).headers["mcp-session-id"]
    _, hooks = sign_in_agent(documents, person, client_id=client_id, resource=HOOKS)
    g.fx.token = hooks["access_token"]
    before = AuditEvent.objects.count()
    body = call(8, f"{upstream}__echo", {"text": "audience"})
    refused = g.post(body if small else padded(body), session, host)
    assert refused.status == 401, refused.body
    assert not ToolCall.objects.filter(tool_use_id__startswith="mcp:8").exists()
    assert AuditEvent.objects.count() == before
    assert limits.waits_held(agent) == 0

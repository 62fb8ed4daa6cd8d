"""A fast-path tools/call admitted on the trip that authenticates its request (issue 37;
dispatcher.gateways.mcp.EarlyAdmission, docs/mcp.md "The fast path"): an allowed call
takes two trips to the gateway's ORM threads, not three, and a request its token, its
session or its rate refuses admits nothing on that trip, answered as before.

The gateway's ASGI app runs in this process, driven as daphne drives it
(tests/mcp/test_fast_path.py's Gateway), against a real upstream HTTP server."""

# ruff: noqa: F811  (the `gateway` fixture, imported, is each test's argument)
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEvent
from dispatcher import agents, limits
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import split_session_id
from dispatcher.models import Status, ToolCall
from tests.mcp.test_fast_path import Gateway, call, gateway, upstream  # noqa: F401
from tests.support.factories import AgentFixture, make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def test_an_allowed_fast_call_takes_two_orm_trips_its_records_unchanged(
    upstream: str,  # noqa: F811
    gateway: Callable[[AgentFixture], Gateway],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The token, the session and the rate read, then the call admitted and claimed, on one
    trip; its result written on the second (three before: the authentication's own)."""
    g = gateway(make_agent(mode="trusted"))
    session = g.session()
    trips: list[str] = []
    close = mcp.close_old_connections  # (each trip ends by handing its connection back)
    monkeypatch.setattr(mcp, "close_old_connections", lambda: (trips.append("trip"), close()))
    answer = g.post(call(3, f"{upstream}__echo", {"text": "two trips"}), session)
    assert not answer.via_sdk
    [message] = answer.messages()
    assert message["result"]["content"] == [{"type": "text", "text": "echo: two trips"}]
    assert len(trips) == 2, trips
    stored = ToolCall.objects.get(session__external_id=split_session_id(session)[0])
    assert (stored.status, stored.attempts, stored.tool_use_id) == (Status.COMPLETED, 1, "mcp:3")
    kinds = AuditEvent.objects.filter(subject=f"call:{stored.pk}").order_by("seq")
    assert [e.kind for e in kinds] == [
        "call.received",
        "call.allowed",
        "call.started",
        "call.completed",
    ]


def _bad_token(g: Gateway, session: str, settings: Any) -> None:
    g.fx.token = g.fx.token[:-1] + ("a" if g.fx.token[-1] != "a" else "b")


def _revoked(g: Gateway, session: str, settings: Any) -> None:
    agents.revoke_agent(agent=g.fx.agent, actor="cli")


def _over_rate(g: Gateway, session: str, settings: Any) -> None:
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.001
    settings.HARNESS_AGENT_REQUEST_BURST = 1
    g.post(call(1, "readFile", {"path": "a"}), session)  # (the bucket's one request)


@pytest.mark.parametrize(
    ("refusal", "status", "session_of"),
    [
        (_bad_token, 401, None),
        (_revoked, 401, None),
        (_over_rate, 429, None),
        (None, 404, "0" * 32),  # a session id that is not the agent's
    ],
)
def test_a_refused_request_admits_nothing_on_its_authentications_trip(
    upstream: str,  # noqa: F811
    gateway: Callable[[AgentFixture], Gateway],  # noqa: F811
    settings: Any,
    refusal: Callable[[Gateway, str, Any], None] | None,
    status: int,
    session_of: str | None,
) -> None:
    """A fast-path call whose token is bad or revoked, whose agent is over its rate, or
    whose session id is not the agent's, is answered as the request is without the fast
    path, and nothing of it is stored: no call, no event, no wait slot held."""
    g = gateway(make_agent(mode="trusted"))
    session = g.session()
    if refusal is not None:
        refusal(g, session, settings)
    before = AuditEvent.objects.count()
    answer = g.post(call(2, f"{upstream}__echo", {"text": "refused"}), session_of or session)
    assert answer.status == status, answer.body
    assert not ToolCall.objects.filter(tool_use_id="mcp:2").exists()
    assert AuditEvent.objects.count() == before
    assert limits.waits_held(g.fx.agent) == 0

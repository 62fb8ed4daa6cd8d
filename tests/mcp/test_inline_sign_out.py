"""The inline lane across a sign-out (tests/agentauth/test_sign_out_claim_race.py for the
worker's claim and a hook's call): an MCP request whose token was checked just before
its agent was signed out, and whose call was written after the sign-out committed, ran
its upstream call in the request (written claimed, no check after). Its write is now
conditional on the sign-in being live (admission._insert_calls): it ends denied, with
its event, and the agent is told to sign in again."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentauth import services
from agentauth.models import AgentClient
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.gateways import mcp, mcp_http
from dispatcher.models import Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from tests.mcp.test_inline_lane import data_statements
from tests.support.factories import unique
from tests.support.oauth import MCP, DocumentServer, documents, member, sign_in_agent

__all__ = ["documents"]  # the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def _echo(tool_use_id: str, server: str, text: str) -> ProposedCall:
    arguments = {"text": text}
    return ProposedCall(tool_use_id, f"{server}__echo", canonical_json(arguments), arguments)


def _signed_in_session(documents: DocumentServer) -> tuple[Any, Any, str, str]:
    owner = member()
    client_id, answer = sign_in_agent(documents, owner)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    started = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    return owner, agent, str(answer["access_token"]), started.external_id


def test_an_inline_call_checked_before_the_sign_out_is_denied_not_run(
    trusted_upstream: str, documents: DocumentServer
) -> None:
    owner, agent, token, external_id = _signed_in_session(documents)
    _, session = mcp_http.authenticate(token, external_id, MCP)  # the request's read
    assert session is not None
    services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
    call = mcp.submit(session, _echo("mcp:1", trusted_upstream, "after"), preloaded=True)
    # Was: completed, "echo: after" (run in the request, after the sign-out).
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.content
    result = mcp.tool_result(call)
    assert result.is_error and "was signed out" in result.content[0].text  # type: ignore[union-attr]
    stored = ToolCall.objects.get(pk=call.pk)
    assert (stored.status, stored.attempts) == (Status.DENIED, 0)
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["call.received", "call.denied"], kinds


def test_an_inline_call_of_a_live_sign_in_runs_written_by_its_conditional_insert(
    trusted_upstream: str, documents: DocumentServer
) -> None:
    """(Its statements are counted by tests/mcp/test_inline_lane.py: five, as before.)"""
    _, _, token, external_id = _signed_in_session(documents)
    _, session = mcp_http.authenticate(token, external_id, MCP)
    mcp.submit(session, _echo("mcp:0", trusted_upstream, "warm"), preloaded=True)
    _, session = mcp_http.authenticate(token, external_id, MCP)
    with CaptureQueriesContext(connection) as queries:
        call = mcp.submit(session, _echo("mcp:1", trusted_upstream, "inline"), preloaded=True)
    assert call.status == Status.COMPLETED and call.content == "echo: inline"
    sql = data_statements(queries)
    [insert] = [s for s in sql if 'INSERT INTO "dispatcher_toolcall"' in s]
    assert " SELECT " in insert and "WHERE EXISTS (" in insert, insert

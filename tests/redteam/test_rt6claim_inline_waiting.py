"""The MCP inline lane writes its call already running (the request runs it), by one
INSERT ... SELECT conditional on the credential being live, which then locks the session
chain's head in the same statement (admission._insert_calls). While it waited for the
head (another event of the session being written), it had read the credential with its
snapshot: a sign-out that committed meanwhile did not wait for it, and the call was
written running and run in the request after the sign-out. The inline write now holds
the agent's row FOR KEY SHARE as the worker's claim does (live_credential_sql(hold=True)):
the sign-out waits for it, so the call starts before the sign-out, never after."""

from __future__ import annotations

from typing import Any

import pytest

from agentauth import services
from audit.models import AuditChain, AuditEvent
from dispatcher.gateways import mcp, mcp_http
from dispatcher.models import Status
from tests.mcp.conftest import http_upstream, trusted_upstream
from tests.mcp.test_inline_sign_out import _echo, _signed_in_session
from tests.support.oauth import MCP, DocumentServer, documents
from tests.support.row_locks import RowHold, blocked_or, require_postgresql

__all__ = ["documents", "http_upstream", "trusted_upstream"]  # the fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def test_an_inline_call_waiting_for_its_chain_never_runs_after_the_sign_out(
    trusted_upstream: str, documents: DocumentServer
) -> None:
    require_postgresql()
    owner, agent, token, external_id = _signed_in_session(documents)
    _, session = mcp_http.authenticate(token, external_id, MCP)  # the request's read
    assert session is not None
    chain = str(session.pk)
    assert AuditChain.objects.filter(chain=chain).exists()
    calls: list[Any] = []
    with RowHold(AuditChain.objects.select_for_update().filter(chain=chain).exists) as hold:
        hold.waits(
            lambda: calls.append(
                mcp.submit(session, _echo("mcp:1", trusted_upstream, "late"), preloaded=True)
            ),
            "the inline write (for the head)",
        )
        sign_out = hold.start(
            lambda: services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
        )
        waited = blocked_or(*sign_out)
    [call] = calls
    if call.status == Status.COMPLETED:  # (written before the sign-out: it may run)
        # Was: the sign-out committed while the write waited, then the call ran.
        assert waited, "the inline call ran after the sign-out committed"
        started = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.started").pk
        out_at = AuditEvent.objects.filter(subject=f"agent:{agent.pk}").order_by("-pk")[0].pk
        assert started < out_at
        return
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.content

"""Red team (rtvoid): a request verified with an agent's old token whose admission commits
after the token's rotation must not run its call (docs/security.md, "Two tokens").

A queued call is checked by the worker (agents.token_refusal). The MCP inline lane has no
worker: an auto-allowed call of an upstream HTTP server's tool is claimed in the
admission's own commit and run by the request. Its token was read when the request was
authenticated, before the rotation committed; nothing read it again, so the call ran
although the rotation had committed first. Now the inline lane reads the agent's token
again in the admission's transaction (locking it against a rotation under way) and
leaves a call whose token is no longer the agent's to the worker, which denies it.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import authenticate
from dispatcher.models import Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from tests.mcp.conftest import http_upstream, trusted_upstream  # noqa: F401  (fixtures)
from tests.support.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

ROTATED = "The agent token this call was sent with was rotated"


def proposed(tool_use_id: str, name: str, arguments: dict[str, Any]) -> ProposedCall:
    return ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)


def test_an_inline_call_verified_before_a_rotation_and_admitted_after_does_not_run(
    trusted_upstream: str,  # noqa: F811  (the fixture imported above)
) -> None:
    fx = make_agent(mode="trusted")
    session = agents.join_run(agent=fx.agent, client=mcp.CLIENT, title="MCP session", idle=0)[0]
    _, verified = authenticate(fx.token, session.external_id)  # the old token's request
    assert verified is not None
    new = agents.rotate_token(agent=fx.agent, actor="user:root")  # commits meanwhile
    call = mcp.submit(
        verified, proposed("mcp:1", f"{trusted_upstream}__echo", {"text": "x"}), preloaded=True
    )
    execution.execute_call(str(call.pk))  # (the worker's message, as Celery delivers it)
    stored = ToolCall.objects.get(pk=call.pk)
    assert stored.status == Status.DENIED, (stored.status, stored.content)  # before: completed
    assert ROTATED in stored.content and stored.attempts == 0
    denied = AuditEvent.objects.get(kind="call.denied", subject=f"call:{call.pk}")
    assert denied.payload["by"] == "guard:token"
    assert not AuditEvent.objects.filter(kind="call.started", subject=f"call:{call.pk}")
    # the new token's call still runs inline (no false denial)
    _, fresh = authenticate(new, session.external_id)
    assert fresh is not None
    ran = mcp.submit(
        fresh, proposed("mcp:2", f"{trusted_upstream}__echo", {"text": "y"}), preloaded=True
    )
    assert ran.status == Status.COMPLETED and ran.content == "echo: y"

"""Revoking one OAuth access token (RFC 7009, /oauth/revoke/) ends the calls sent with it
that have not run: queued for a worker, they are denied at the claim; waiting for a
reviewer and then approved, they are denied at the release. Before, only a sign-out (every
token of the agent) ended them: the worker ran a call of the revoked token, and an
approval queued it. The agent's other sign-ins keep their calls, and a refresh (which
replaces the access token) ends none: a call names its sign-in, the refresh-token family,
not the access token (transitions.live_credential_sql, provenance "sign_in")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agentauth.models import AgentClient
from approvals import services as approval_services
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.gateways import mcp, mcp_http
from dispatcher.models import AgentSession, Status, ToolCall
from tests.agentauth.test_sign_out_race import _hook_in_thread
from tests.identity.test_leaver_queued_calls import wait_until
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_user, submit_one, unique
from tests.support.oauth import MCP, DocumentServer, documents, member, refresh, sign_in_agent

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _session(access_token: str, agent: Any) -> AgentSession:
    started = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    _, session = mcp_http.authenticate(access_token, started.external_id, MCP)  # the request's read
    assert session is not None
    (Path(session.workspace) / "a.txt").write_text("secret")
    return session


def _two_sign_ins(documents: DocumentServer) -> tuple[str, Any, dict[str, Any], dict[str, Any]]:
    """One person signs the same client in twice (two devices): one agent, two sign-ins."""
    owner = member()
    client_id, first = sign_in_agent(documents, owner)
    _, second = sign_in_agent(documents, owner, client_id=client_id)
    [link] = AgentClient.objects.filter(application__client_id=client_id)
    return client_id, link.agent, first, second


def _revoke(client_id: str, token: str) -> None:
    answer = Client().post("/oauth/revoke/", {"token": token, "client_id": client_id})
    assert answer.status_code == 200, answer.content


def _kinds(call: ToolCall) -> list[str]:
    return list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("id")
        .values_list("kind", flat=True)
    )


def test_a_queued_call_of_a_revoked_token_is_denied_at_its_claim(documents: DocumentServer) -> None:
    client_id, agent, first, second = _two_sign_ins(documents)
    lost = _session(first["access_token"], agent)
    kept = _session(second["access_token"], agent)
    gone = submit_one(lost, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
    fine = submit_one(kept, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
    assert gone.status == fine.status == Status.QUEUED
    # The kept sign-in refreshes (its access token replaced): its call is still its own.
    refreshed = refresh(client_id, second["refresh_token"])
    assert refreshed.status_code == 200, refreshed.content
    _revoke(client_id, first["access_token"])
    execution.execute_call(str(gone.pk))
    execution.execute_call(str(fine.pk))
    gone.refresh_from_db()
    fine.refresh_from_db()
    # Was: completed, the file's text its result.
    assert (gone.status, gone.decided_by) == (Status.DENIED, "guard:token"), gone.content
    assert "was revoked" in gone.content and "secret" not in gone.content, gone.content
    assert _kinds(gone)[-1] == "call.denied" and "call.started" not in _kinds(gone)
    denied = AuditEvent.objects.get(subject=f"call:{gone.pk}", kind="call.denied")
    assert denied.payload["stage"] == "execute", denied.payload
    assert fine.status == Status.COMPLETED and "secret" in fine.content, fine.content
    assert gone.provenance["sign_in"] != fine.provenance["sign_in"]  # (a sign-in each)


def test_an_approved_call_of_a_revoked_token_is_denied_at_its_release(
    documents: DocumentServer,
) -> None:
    client_id, agent, first, second = _two_sign_ins(documents)
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    calls = []
    for answer in (first, second):
        session = _session(answer["access_token"], agent)
        call = submit_one(session, "write_file", {"path": "b.txt", "content": "x"})
        assert call.status == Status.PENDING_APPROVAL, call.status
        calls.append((session, call))
    _revoke(client_id, first["refresh_token"])  # (a refresh token ends its sign-in too)
    for _, call in calls:
        approval = ApprovalRequest.objects.get(call=call)
        approval_services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
        )
    (lost, gone), (kept, fine) = calls
    gone.refresh_from_db()
    # Was: queued, then run by the worker.
    assert (gone.status, gone.decided_by) == (Status.DENIED, "guard:token"), gone.status
    execution.execute_call(str(gone.pk))
    gone.refresh_from_db()
    assert gone.status == Status.DENIED and gone.started_at is None
    assert not (Path(lost.workspace) / "b.txt").exists()
    fine.refresh_from_db()
    assert fine.status == Status.QUEUED, fine.status
    execution.execute_call(str(fine.pk))
    fine.refresh_from_db()
    assert fine.status == Status.COMPLETED, fine.content
    assert (Path(kept.workspace) / "b.txt").read_text() == "x"


def test_a_hook_call_of_a_revoked_token_is_denied_when_approved(
    documents: DocumentServer,
) -> None:
    """`harness-hook`'s path (a token for the hooks API; the client runs the call): the
    hook waits for a reviewer, the token is revoked, the approval denies the call at its
    release, and the waiting hook is answered "deny", never "allow"."""
    owner = member()
    hooks = "http://testserver/api/v1/hooks/"
    client_id, answer = sign_in_agent(documents, owner, resource=hooks)
    body = pre_tool_use(
        unique("cc"), "Write", {"file_path": "/home/dev/project/x.txt", "content": "x"}
    )
    thread, answers = _hook_in_thread(str(answer["access_token"]), body)
    try:
        agent = AgentClient.objects.get(application__client_id=client_id).agent
        call = wait_until(
            lambda: ToolCall.objects.filter(
                session__agent=agent, status=Status.PENDING_APPROVAL
            ).first(),
            "the hook's call to wait for a reviewer",
        )
        _revoke(client_id, answer["access_token"])
        reviewer = make_user(unique("rita"), groups=("reviewer",))
        approval = ApprovalRequest.objects.get(call=call)
        approval_services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
        )
    finally:
        thread.join(60)
    call.refresh_from_db()
    # Was: released, and the hook answered "allow" (the client ran the tool).
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.status
    output = answers[0].json()["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny", output
    assert call.provenance.get("sign_in"), call.provenance  # the sign-in it was sent under

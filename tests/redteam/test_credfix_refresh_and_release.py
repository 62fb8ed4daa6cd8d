"""A sign-in's refresh, racing the writes that let a call run with no check after them,
and a revocation racing an approval's release (transitions.live_credential_sql).

The MCP inline lane's write (the call written running) and a hook's call allowed at once
(released to its client) hold the sign-in's live refresh token FOR KEY SHARE. A refresh
that held that row (its rotation under way) when the write reached it revokes it and
writes its successor after the write's snapshot: the write found the sign-in ended and
denied the call, "the OAuth token ... was revoked", to an agent that had only refreshed
as every client does. The write is now tried once more when a fresh read finds the
sign-in live, as the worker's claim is (execution._sign_in_renewed); a revocation in the
same place still denies it.

The approval's release read the credential without holding it, then waited (for its
session chain's head): a one-token revocation (RFC 7009) committing meanwhile did not
wait for it, and a hook's call was released to its client, "allow", after the revocation.
The release now holds the agent's row (taken first, with the approval's: approvals.
services._agent_held) and the sign-in's refresh token as the claim does."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from oauth2_provider.models import AccessToken, RefreshToken

from agentauth import services
from agentauth.models import AgentClient
from approvals import services as approval_services
from approvals.models import ApprovalRequest
from audit.models import AuditChain
from dispatcher import agents, execution
from dispatcher.gateways import mcp, mcp_http
from dispatcher.models import Agent, Status, ToolCall
from tests.agentauth.test_sign_out_race import _hook_in_thread
from tests.identity.test_leaver_queued_calls import wait_until
from tests.mcp.conftest import http_upstream, trusted_upstream
from tests.mcp.test_inline_sign_out import _echo
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_agent, make_user, submit_one, unique
from tests.support.oauth import MCP, DocumentServer, documents, member, refresh, sign_in_agent
from tests.support.row_locks import RowHold, require_postgresql, wait_blocked_by

__all__ = ["documents", "http_upstream", "trusted_upstream"]  # the fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

HOOKS = "http://testserver/api/v1/hooks/"


class _Race:
    """A refresh (or a revocation) of a sign-in under way: it holds the sign-in's refresh
    token FOR UPDATE (agentauth.validators, oauth2_provider's RefreshToken.revoke) and is
    held before its commit by this test's share lock of the access token it deletes. What
    `write` does meanwhile reaches the refresh token's row and waits for it; then the
    refresh commits (`let_go`)."""

    def __init__(self, client_id: str, answer: dict[str, Any], kill: str) -> None:
        self.client_id, self.answer, self.kill = client_id, answer, kill
        live = RefreshToken.objects.filter(application__client_id=client_id, revoked__isnull=True)
        self.access_id = live.get().access_token_id  # (the client's one sign-in)
        assert self.access_id is not None

    def _hold_access_token(self) -> None:
        with connection.cursor() as cursor:
            table = connection.ops.quote_name(AccessToken._meta.db_table)
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR SHARE", [self.access_id])  # noqa: S608
            assert cursor.fetchone() is not None

    def _end(self) -> None:
        if self.kill == "refresh":
            answer = refresh(self.client_id, self.answer["refresh_token"])
        else:
            answer = Client().post(
                "/oauth/revoke/",
                {"token": self.answer["refresh_token"], "client_id": self.client_id},
            )
        assert answer.status_code == 200, answer.content

    def run(self, write: Callable[[], Any], *, by_request: bool = False) -> None:
        with RowHold(self._hold_access_token) as hold:
            _, ended = hold.start(self._end)
            ender = wait_blocked_by(hold.pid[0], ended)  # its token row locked, held
            if by_request:  # (a request's connection: found by whom it waits for)
                _, written = hold.start(write)
                wait_blocked_by(ender, written)
            else:
                hold.waits(write, "the write (for the token's row)")


def _signed_in(documents: DocumentServer, **extra: str) -> tuple[str, dict[str, Any], Any]:
    client_id, answer = sign_in_agent(documents, member(), **extra)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    return client_id, answer, agent


def _hook(token: str, body: dict[str, Any], answers: list[Any], wait: int = 0) -> None:
    answers.append(
        Client().post(
            f"/api/v1/hooks/claude-code?wait={wait}",
            data=json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
    )


@pytest.mark.parametrize("kill", ["refresh", "revoke"])
def test_an_inline_call_written_while_its_sign_in_refreshes_runs(
    trusted_upstream: str, documents: DocumentServer, kill: str
) -> None:
    require_postgresql()
    client_id, answer, agent = _signed_in(documents)
    started = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    _, session = mcp_http.authenticate(answer["access_token"], started.external_id, MCP)
    assert session is not None  # (the request's read, before the refresh)
    calls: list[Any] = []
    _Race(client_id, answer, kill).run(
        lambda: calls.append(
            mcp.submit(session, _echo("mcp:1", trusted_upstream, "renewed"), preloaded=True)
        )
    )
    [call] = calls
    if kill == "revoke":  # (fail closed: its sign-in ended)
        assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.content
        assert "was revoked" in call.content, call.content
        return
    # Was: denied, "The OAuth token this call was sent with ... was revoked".
    assert call.status == Status.COMPLETED and call.content == "echo: renewed", call.content


@pytest.mark.parametrize("kill", ["refresh", "revoke"])
def test_a_hook_call_allowed_at_once_while_its_sign_in_refreshes_is_allowed(
    documents: DocumentServer, kill: str
) -> None:
    require_postgresql()
    client_id, answer, agent = _signed_in(documents, resource=HOOKS)
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/a.txt"})
    answers: list[Any] = []
    _Race(client_id, answer, kill).run(
        lambda: _hook(str(answer["access_token"]), body, answers), by_request=True
    )
    output = answers[0].json()["hookSpecificOutput"]
    call = ToolCall.objects.get(session__agent=agent)
    if kill == "revoke":
        assert output["permissionDecision"] == "deny", output
        assert (call.status, call.decided_by) == (Status.DENIED, "guard:token")
        return
    # Was: "deny", the token "was revoked".
    assert output["permissionDecision"] == "allow", output
    assert call.status == Status.RELEASED, call.status


def _waiting_hook_call(
    documents: DocumentServer,
) -> tuple[str, dict[str, Any], Any, Any, threading.Thread, list[Any]]:
    """A hook's Write waiting for a reviewer, its hook waiting for the answer (a thread:
    joined by the caller, its answer in the list)."""
    client_id, answer, agent = _signed_in(documents, resource=HOOKS)
    body = pre_tool_use(
        unique("cc"), "Write", {"file_path": "/home/dev/project/x.txt", "content": "x"}
    )
    thread, answers = _hook_in_thread(str(answer["access_token"]), body)
    call = wait_until(
        lambda: ToolCall.objects.filter(
            session__agent=agent, status=Status.PENDING_APPROVAL
        ).first(),
        "the hook's call to wait for a reviewer",
    )
    return client_id, answer, call, make_user(unique("rita"), groups=("reviewer",)), thread, answers


def _hook_answer(thread: threading.Thread, answers: list[Any]) -> str:
    thread.join(60)
    return str(answers[0].json()["hookSpecificOutput"]["permissionDecision"])


def _decide(call: ToolCall, reviewer: Any) -> None:
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )


@pytest.mark.parametrize("kill", ["refresh", "revoke"])
def test_an_approval_released_while_its_sign_in_refreshes_releases_the_call(
    documents: DocumentServer, kill: str
) -> None:
    require_postgresql()
    client_id, answer, call, reviewer, hook, answers = _waiting_hook_call(documents)
    try:
        _Race(client_id, answer, kill).run(lambda: _decide(call, reviewer))
    finally:
        decision = _hook_answer(hook, answers)
    call.refresh_from_db()
    if kill == "revoke":
        assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.status
        assert decision == "deny"
        return
    # Was (with the release holding the token, not tried again): denied at the release.
    assert call.status == Status.RELEASED and decision == "allow", (call.status, call.content)


def test_a_revocation_during_a_hook_calls_release_waits_for_it_or_denies_it(
    documents: DocumentServer,
) -> None:
    """The release's statement reads the credential, then waits for its session chain's
    head; the revocation commits meanwhile. Was: released, the hook's client told "allow"
    after its token was revoked."""
    require_postgresql()
    client_id, answer, call, reviewer, hook, answers = _waiting_hook_call(documents)
    head = AuditChain.objects.select_for_update().filter(chain=str(call.session_id))

    def revoke() -> None:
        answer_ = Client().post(
            "/oauth/revoke/", {"token": answer["access_token"], "client_id": client_id}
        )
        assert answer_.status_code == 200, answer_.content

    waited = False
    try:
        with RowHold(head.exists) as hold:
            pid = hold.waits(lambda: _decide(call, reviewer), "the release (for the head)")
            _, revoked = hold.start(revoke)
            try:
                wait_blocked_by(pid[0], revoked)
                waited = True
            except AssertionError:
                waited = False  # (it committed without waiting)
    finally:
        decision = _hook_answer(hook, answers)
    call.refresh_from_db()
    if call.status == Status.RELEASED:  # (released before the revocation: it waited)
        assert waited, "the hook's call was released after its token's revocation committed"
        assert decision == "allow"
        return
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.status
    assert decision == "deny"


def test_a_call_admitted_before_its_sign_in_was_recorded_is_checked_without_it(
    documents: DocumentServer,
) -> None:
    """A call admitted before Harness recorded a call's sign-in (provenance without
    "sign_in") is checked without it: one token's revocation leaves it to run (nothing
    names which sign-in sent it), a sign-out of the agent still ends it (its token prefix,
    recorded long before, names the agent's sign-in)."""
    client_id, answer, agent = _signed_in(documents)
    started = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    _, session = mcp_http.authenticate(answer["access_token"], started.external_id, MCP)
    assert session is not None
    (Path(session.workspace) / "a.txt").write_text("secret")
    calls = [
        submit_one(session, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
        for _ in range(2)
    ]
    for call in calls:
        assert call.status == Status.QUEUED and call.provenance.get("sign_in")
        call.provenance.pop("sign_in")
        ToolCall.objects.filter(pk=call.pk).update(provenance=call.provenance)
    revoked = Client().post(
        "/oauth/revoke/", {"token": answer["refresh_token"], "client_id": client_id}
    )
    assert revoked.status_code == 200, revoked.content
    execution.execute_call(str(calls[0].pk))
    calls[0].refresh_from_db()
    assert calls[0].status == Status.COMPLETED and "secret" in calls[0].content
    services.sign_out_agent(agent=agent, actor="test")
    execution.execute_call(str(calls[1].pk))
    calls[1].refresh_from_db()
    assert (calls[1].status, calls[1].decided_by) == (Status.DENIED, "guard:token")
    assert "signed out" in calls[1].content, calls[1].content


def test_a_decision_holds_the_agents_row_before_the_request_it_decides() -> None:
    """The release holds the agent's row (above), which a deactivation locks FOR UPDATE
    first and then the requests its leaver voted on (approvals.services.void_votes_of):
    the decision takes the agent's row before the request's, never after (it would wait
    for a deactivation that waits for the request it holds: a deadlock)."""
    require_postgresql()
    fx = make_agent(mode="standard")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    approval = ApprovalRequest.objects.get(call=call)
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    # The agent's row held, as a deactivation's first step holds it (or a sign-out).
    with RowHold(Agent.objects.select_for_update().filter(pk=fx.agent.pk).exists) as hold:
        hold.waits(lambda: _decide(call, reviewer), "the decision (for the agent's row)")
        with transaction.atomic():  # the request's row is free meanwhile
            ApprovalRequest.objects.select_for_update(nowait=True).filter(pk=approval.pk).exists()
    call.refresh_from_db()
    assert call.status == Status.QUEUED, call.status

"""A call whose OAuth token was checked just before its agent was signed out
(agentauth.services.sign_out_agent) and admitted just after the sign-out's sweep
(dispatcher.agents.end_calls_of_signed_out) found no call of it to end: it waited, was
approved, and its hook was answered "allow" (its client ran the tool) or its worker ran
it, though every token of the agent was revoked. The sign-out now gives the agent a new
sign-in (a token prefix no client holds): the call carries the one it was admitted under
(its provenance's "token"), and the decision and the worker refuse it (token_refusal)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agentauth import services
from agentauth.models import AgentClient
from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.gateways import hooks, mcp, mcp_http
from dispatcher.gateways.client_calls import admit_client_call
from dispatcher.models import Agent, Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from teams.services import add_member
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_user, unique
from tests.support.oauth import HOOKS, MCP, DocumentServer, documents, member, sign_in_agent

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


class Held:
    """A seam: the admission waits there, its token checked and its call not yet written,
    until the test lets it go."""

    def __init__(self, admit: Callable[..., Any]) -> None:
        self.admit = admit
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.reached.set()
        assert self.go.wait(30), "the test never let the admission go"
        return self.admit(*args, **kwargs)


@pytest.fixture
def held_hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    held = Held(admit_client_call)
    monkeypatch.setattr(hooks, "admit_client_call", held)
    yield held
    held.go.set()


def _signed_in(documents: DocumentServer) -> tuple[Any, Agent, str]:
    owner = member()
    client_id, answer = sign_in_agent(documents, owner, resource=HOOKS)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    return owner, agent, str(answer["access_token"])


def _hook_in_thread(token: str, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    answers: list[Any] = []

    def ask() -> None:
        try:
            answers.append(
                Client().post(
                    "/api/v1/hooks/claude-code?wait=30",
                    data=json.dumps(body),
                    content_type="application/json",
                    headers={"Authorization": f"Bearer {token}"},
                )
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=ask)
    thread.start()
    return thread, answers


def _waiting_ask(agent: Agent, thread: threading.Thread) -> ApprovalRequest:
    """The approval request of the held call, once its admission wrote it."""
    while thread.is_alive():
        asked = ApprovalRequest.objects.filter(call__session__agent=agent).first()
        if asked is not None:
            return asked
        thread.join(0.05)
    raise AssertionError("the hook was answered without asking")


def test_a_hook_admitted_across_the_sign_out_is_denied_when_approved(
    documents: DocumentServer, held_hook: Held
) -> None:
    owner, agent, token = _signed_in(documents)
    reviewer = make_user(unique("rev"))
    add_member(team=agent.team, user=reviewer, role="reviewer", actor="test")
    body = pre_tool_use(unique("cc"), "Bash", {"command": "curl -X POST https://example.com/up"})
    thread, answers = _hook_in_thread(token, body)
    try:
        assert held_hook.reached.wait(30), "the hook never reached its admission"
        # Its token checked, its call not yet written: the owner signs the agent out.
        services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
        held_hook.go.set()
        asked = _waiting_ask(agent, thread)
        assert asked.call.status == Status.PENDING_APPROVAL  # the sweep could not see it
        approvals.decide(
            approval_id=asked.pk, user=reviewer, approve=True, digest=asked.call.digest
        )
    finally:
        held_hook.go.set()
        thread.join(60)
    assert answers, "the hook was never answered"
    output = answers[0].json()["hookSpecificOutput"]
    # Was: "allow" (the signed-out client then ran the command).
    assert output["permissionDecision"] == "deny", output
    assert "was signed out" in output["permissionDecisionReason"], output
    call = ToolCall.objects.get(pk=asked.call_id)
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token")
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("id")
        .values_list("kind", flat=True)
    )
    assert kinds[-1] == "call.denied" and "call.released" not in kinds, kinds


def _mcp_session_read_before_sign_out(documents: DocumentServer) -> tuple[Any, Agent, Any]:
    """An MCP request's read (its token checked, its session loaded with the agent) made
    before its agent's owner signs it out; then the sign-out. The owner and agent, and
    the session as the request holds it."""
    owner = member()
    client_id, answer = sign_in_agent(documents, owner)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    started = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    found, session = mcp_http.authenticate(answer["access_token"], started.external_id, MCP)
    assert found is not None and session is not None
    services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
    assert mcp_http.authenticate(answer["access_token"], started.external_id, MCP) == (None, None)
    return owner, agent, session


def test_an_mcp_call_admitted_across_the_sign_out_is_denied_when_approved(
    documents: DocumentServer,
) -> None:
    owner, agent, session = _mcp_session_read_before_sign_out(documents)
    reviewer = make_user(unique("rev"))
    add_member(team=agent.team, user=reviewer, role="reviewer", actor="test")
    arguments = {"path": "notes.txt", "content": "x"}
    proposed = ProposedCall("mcp:1", "write_file", canonical_json(arguments), arguments)
    call = mcp.submit(session, proposed, preloaded=True)
    assert call.status == Status.PENDING_APPROVAL  # the sweep could not see it
    asked = ApprovalRequest.objects.get(call=call)
    with CaptureQueriesContext(connection) as queries:
        approvals.decide(approval_id=asked.pk, user=reviewer, approve=True, digest=call.digest)
    if connection.vendor == "postgresql":
        # A bearer agent's approval's eight (tests/dispatcher/test_statement_budget.py),
        # and two: the lock of the agent's client link, and the sign-in read again.
        assert len(queries) == 10, [q["sql"][:80] for q in queries.captured_queries]
        locks = [q["sql"] for q in queries.captured_queries if "FOR NO KEY UPDATE" in q["sql"]]
        assert len(locks) == 1 and "agentauth_agentclient" in locks[0], locks
    call.refresh_from_db()
    # Was: queued, and the worker wrote the file.
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token")
    result = mcp.tool_result(call)
    assert result.is_error and "was signed out" in result.content[0].text  # type: ignore[union-attr]
    assert not (Path(session.workspace) / "notes.txt").exists()


def test_an_mcp_call_queued_across_the_sign_out_is_denied_by_the_worker(
    documents: DocumentServer,
) -> None:
    owner, agent, session = _mcp_session_read_before_sign_out(documents)
    (Path(session.workspace) / "a.txt").write_text("secret")
    arguments = {"path": "a.txt"}
    proposed = ProposedCall("mcp:2", "read_file", canonical_json(arguments), arguments)
    call = mcp.submit(session, proposed, preloaded=True)
    assert call.status == Status.QUEUED  # the sweep could not see it
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    # Was: completed, the file's text its result.
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token")
    assert "was signed out" in call.content and "secret" not in call.content
    assert not AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.completed")


def test_an_approval_as_the_sign_out_commits_waits_for_it_then_denies(
    documents: DocumentServer, held_hook: Held
) -> None:
    """The call is written after the sign-out's sweep and before its commit, and a reviewer
    approves it then: the decision, which read the agent's sign-in as it was, waits for
    the sign-out to commit (agents.signed_in_now) and reads it again."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    owner, agent, token = _signed_in(documents)
    reviewer = make_user(unique("rev"))
    add_member(team=agent.team, user=reviewer, role="reviewer", actor="test")
    body = pre_tool_use(unique("cc"), "Bash", {"command": "curl -X POST https://example.com/up"})
    signed_out, commit = threading.Event(), threading.Event()

    def sign_out() -> None:
        try:
            with transaction.atomic():
                services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
                signed_out.set()
                assert commit.wait(60)
        finally:
            connections.close_all()

    def decide() -> None:
        try:
            approvals.decide(
                approval_id=asked.pk, user=reviewer, approve=True, digest=asked.call.digest
            )
        finally:
            connections.close_all()

    thread, answers = _hook_in_thread(token, body)
    signing_out = threading.Thread(target=sign_out)
    try:
        assert held_hook.reached.wait(30), "the hook never reached its admission"
        signing_out.start()
        assert signed_out.wait(30)  # swept, not committed
        held_hook.go.set()
        asked = _waiting_ask(agent, thread)
        deciding = threading.Thread(target=decide)
        deciding.start()
        with connection.cursor() as cursor:  # until it is decided, or waits for a lock
            while deciding.is_alive():
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                if cursor.fetchone()[0]:
                    break
                deciding.join(0.05)
        commit.set()
        signing_out.join(30)
        deciding.join(30)
    finally:
        held_hook.go.set()
        commit.set()
        thread.join(60)
    assert answers, "the hook was never answered"
    output = answers[0].json()["hookSpecificOutput"]
    # Was: "allow" (the decision read the sign-in before the sign-out committed).
    assert output["permissionDecision"] == "deny", output
    assert "was signed out" in output["permissionDecisionReason"], output

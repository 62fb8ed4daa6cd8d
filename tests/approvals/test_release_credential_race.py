"""A call its client runs (a hook's, decide-only) waits for a reviewer; the reviewer
approves it, and the agent's bearer token is rotated, or the agent revoked, after the
decision read the call and its agent and before the decision released it. A rotation or
a revocation took no row such a decision held (the call's row is read, not locked, and
a bearer agent has no client link: agents.signed_in_now waits for nothing), so the
release, a statement that began after the rotation committed, went through: the hook
waiting with the old token was answered "allow" and its client ran the tool.

The release was made conditional on the credential being live in its own UPDATE
(transitions.live_credential_sql, as the worker's claim is). The decision now holds the
agent's row FOR KEY SHARE from its first read (approvals.services._agent_held), which a
rotation and a revocation lock FOR UPDATE first: one that comes after the decision's read
waits for the decision's commit (the call released or queued before it, as a call a
moment earlier was), and can no longer commit between the read and the release. A
queued call is then denied by the rotation or revocation itself (agents._deny_queued)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from approvals import services as approval_services
from approvals.models import ApprovalRequest, Decision
from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.models import Status, ToolCall
from tests.agentauth.test_sign_out_race import _hook_in_thread, _waiting_ask
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_user, submit_one, unique
from tests.support.row_locks import blocked_or, in_thread

pytestmark = pytest.mark.django_db(transaction=True)

KILLS = ("rotate", "revoke")


def _waits_for_the_decision(work: Any) -> Any:
    """`work` in its own connection, started now: it must wait on a lock the decision in
    this thread holds (the agent's row). Returns a function that joins it (after the
    decision's commit) and checks it committed."""
    failures: list[BaseException] = []
    pid: list[int] = []
    done = threading.Event()
    thread, failures = in_thread(work, pid, done)
    assert blocked_or(pid, done), "it did not wait for the decision"

    def join() -> None:
        thread.join(60)
        assert not thread.is_alive() and not failures, failures

    return join


def _hook_waiting() -> tuple[Any, Any, tuple[threading.Thread, list[Any]]]:
    """A reviewer, a bearer agent, and its PreToolUse hook request (a command: in its
    owner's standard mode it asks a reviewer) sent in a thread, waiting for a decision."""
    owner = make_user(unique("olga"))
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t")
    body = pre_tool_use(unique("cc"), "Bash", {"command": "rm -rf build"})
    return reviewer, agent, _hook_in_thread(token, body)


@pytest.mark.parametrize("kill", KILLS)
def test_a_hook_call_whose_token_died_during_its_approval_is_not_released(
    kill: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        # (SQLite: the decision's transaction begins IMMEDIATE, holding the one write
        # lock from its first read: the rotation waits for its commit)
        pytest.skip("a commit beside an open transaction: PostgreSQL (SQLite has one writer)")
    reviewer, agent, (thread, answers) = _hook_waiting()
    try:
        approval = _waiting_ask(agent, thread)
        call = ToolCall.objects.get(pk=approval.call_id)
        assert call.status == Status.PENDING_APPROVAL
        die = {
            "rotate": lambda: agents.rotate_token(agent=agent, actor="user:root"),
            "revoke": lambda: agents.revoke_agent(agent=agent, actor="user:root"),
        }[kill]
        real = approval_services._release_denial
        joins = []

        def after_the_decisions_read(call: ToolCall) -> Any:
            # The decision has read the call and its agent (token live); the rotation
            # or the revocation starts now, before the decision's checks and release.
            joins.append(_waits_for_the_decision(die))
            return real(call)

        monkeypatch.setattr(approval_services, "_release_denial", after_the_decisions_read)
        decided = approval_services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
        )
        assert decided.decision == Decision.APPROVED  # the reviewer's
        for join in joins:
            join()
    finally:
        thread.join(60)
    assert answers, "the hook was never answered"
    output = answers[0].json()["hookSpecificOutput"]
    # Was (before the release was conditional): released after the kill committed. The
    # kill now waits: the call was released before it, as one a moment earlier was.
    assert output["permissionDecision"] == "allow", output
    call.refresh_from_db()
    assert call.status == Status.RELEASED, call.status
    approved = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.approved").pk
    kill = "agent.token_rotated" if kill == "rotate" else "agent.revoked"
    assert AuditEvent.objects.get(kind=kill, subject=f"agent:{agent.pk}").pk > approved


def test_a_hook_call_of_a_live_token_is_still_released_when_approved() -> None:
    reviewer, agent, (thread, answers) = _hook_waiting()
    try:
        approval = _waiting_ask(agent, thread)
        approval_services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=approval.call.digest
        )
    finally:
        thread.join(60)
    assert answers[0].json()["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.RELEASED


def test_a_worker_call_whose_token_died_during_its_approval_is_not_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same race for a call a worker runs: it was queued, and only the worker's claim
    then denied it; it is denied at the release now (the agent is answered at once)."""
    if connection.vendor != "postgresql":
        pytest.skip("a commit beside an open transaction: PostgreSQL (SQLite has one writer)")
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    agent, _ = agents.create_agent(owner=make_user(unique("olga")), name=unique("a"), actor="t")
    session = agents.start_session(agent=agent)
    call = submit_one(session, "write_file", {"path": "a.txt", "content": "x"})
    assert call.status == Status.PENDING_APPROVAL
    real = approval_services._release_denial

    joins = []

    def after_the_decisions_read(call: ToolCall) -> Any:
        rotate = lambda: agents.rotate_token(agent=agent, actor="user:root")  # noqa: E731
        joins.append(_waits_for_the_decision(rotate))
        return real(call)

    monkeypatch.setattr(approval_services, "_release_denial", after_the_decisions_read)
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )
    for join in joins:
        join()
    call.refresh_from_db()
    # Queued by the decision, then denied by the rotation that waited for it.
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.status
    assert "rotated" in call.content, call.content
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.DENIED and call.started_at is None
    assert not (Path(session.workspace) / "a.txt").exists()


def test_a_session_grant_asked_with_an_approval_whose_token_died_is_not_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "Allow for the rest of this session" with that approval: the call is denied at the
    release, and the rule the reviewer asked for is not granted either (it was: a grant
    for the session of a credential that no longer acts for the agent)."""
    if connection.vendor != "postgresql":
        pytest.skip("a commit beside an open transaction: PostgreSQL (SQLite has one writer)")
    from dispatcher.policy.models import SessionGrant

    reviewer = make_user(unique("rita"), groups=("reviewer",))
    agent, _ = agents.create_agent(owner=make_user(unique("olga")), name=unique("a"), actor="t")
    session = agents.start_session(agent=agent)
    call = submit_one(session, "write_file", {"path": "a.txt", "content": "x"})
    real = approval_services._release_denial

    joins = []

    def after_the_decisions_read(call: ToolCall) -> Any:
        rotate = lambda: agents.rotate_token(agent=agent, actor="user:root")  # noqa: E731
        joins.append(_waits_for_the_decision(rotate))
        return real(call)

    monkeypatch.setattr(approval_services, "_release_denial", after_the_decisions_read)
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=True,
        digest=call.digest,
        allow_session=True,
    )
    for join in joins:
        join()
    call.refresh_from_db()
    # The grant was made for a credential live at the decision; the rotation after it
    # denied the queued call. (Was, the rotation committed mid-decision: no grant made.)
    assert call.status == Status.DENIED, call.status
    assert SessionGrant.objects.filter(session=session).exists()

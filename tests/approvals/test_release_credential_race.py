"""A call its client runs (a hook's, decide-only) waits for a reviewer; the reviewer
approves it, and the agent's bearer token is rotated, or the agent revoked, after the
decision read the call and its agent and before the decision released it. A rotation or
a revocation takes no row such a decision holds (the call's row is read, not locked,
and a bearer agent has no client link: agents.signed_in_now waits for nothing), so the
release, a statement that began after the rotation committed, went through: the hook
waiting with the old token was answered "allow" and its client ran the tool.

The release is now conditional on the credential being live in its own UPDATE
(transitions.live_credential_sql, as the worker's claim is): the call ends denied at the
release (guard `token`), and the hook is answered "deny", saying why."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from approvals import services as approval_services
from approvals.models import ApprovalRequest, Decision
from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.models import Status, ToolCall
from tests.agentauth.test_sign_out_race import _hook_in_thread, _waiting_ask
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_user, submit_one, unique

pytestmark = pytest.mark.django_db(transaction=True)

KILLS = ("rotate", "revoke")


def _committed_in_another_thread(work: Any) -> None:
    """`work` in its own connection, committed before this returns."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not failures, failures


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

        def after_the_decisions_read(call: ToolCall) -> Any:
            # The decision has read the call and its agent (token live); the rotation
            # or the revocation commits now, before the decision's checks and release.
            _committed_in_another_thread(die)
            return real(call)

        monkeypatch.setattr(approval_services, "_release_denial", after_the_decisions_read)
        decided = approval_services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
        )
        assert decided.decision == Decision.APPROVED  # the reviewer's
    finally:
        thread.join(60)
    assert answers, "the hook was never answered"
    output = answers[0].json()["hookSpecificOutput"]
    # Was: "allow" (released to the client holding the token that had just died).
    assert output["permissionDecision"] == "deny", output
    assert "no longer acts for the agent" in output["permissionDecisionReason"], output
    call.refresh_from_db()
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.status
    assert call.started_at is None
    denied = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.denied")
    assert denied.payload["stage"] == "release", denied.payload
    assert not AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.approved")


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

    def after_the_decisions_read(call: ToolCall) -> Any:
        _committed_in_another_thread(lambda: agents.rotate_token(agent=agent, actor="user:root"))
        return real(call)

    monkeypatch.setattr(approval_services, "_release_denial", after_the_decisions_read)
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )
    call.refresh_from_db()
    # Was: queued (for the worker's claim to deny).
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.status
    assert "no longer acts for the agent" in call.content
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

    def after_the_decisions_read(call: ToolCall) -> Any:
        _committed_in_another_thread(lambda: agents.rotate_token(agent=agent, actor="user:root"))
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
    call.refresh_from_db()
    assert call.status == Status.DENIED, call.status
    assert not SessionGrant.objects.filter(session=session).exists()

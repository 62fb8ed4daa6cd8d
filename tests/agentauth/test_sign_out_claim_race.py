"""A call whose credential was checked just before it died (a sign-out, a revocation, a
rotation, a move to another team) and that could start with no check after that:

- a call queued for a worker, written after the killing transaction's sweep looked, and
  read by the worker (its `token_refusal` passed) before that transaction committed: its
  claim followed the commit and ran it;
- a call allowed at once (a hook's PreToolUse answered "allow"; the MCP inline lane, in
  tests/mcp/test_inline_sign_out.py), written after the commit: it was released or run.

The worker's claim is now conditional on the credential being live in its own UPDATE
(transitions.live_credential_sql), and so is the write of a call allowed at once
(admission._insert_calls): such a call ends denied (guard `token` or `team`), with its
event, and the agent is told why."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction

from agentauth import services
from agentauth.models import AgentClient
from audit.models import AuditEvent
from dispatcher import agents, execution, transitions
from dispatcher.gateways import mcp, mcp_http
from dispatcher.models import AgentSession, Status, ToolCall
from teams.services import add_member, create_team
from tests.agentauth.test_sign_out_race import Held, _hook_in_thread, held_hook
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import make_agent, submit_one, unique
from tests.support.oauth import MCP, DocumentServer, documents, member, sign_in_agent

__all__ = ["documents", "held_hook"]  # the fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def _kinds(call: ToolCall) -> list[str]:
    return list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("id")
        .values_list("kind", flat=True)
    )


# --- the worker's claim ----------------------------------------------------------------


def _signed_in_session(request: pytest.FixtureRequest) -> tuple[AgentSession, Callable[[], Any]]:
    documents = request.getfixturevalue("documents")
    owner = member()
    client_id, answer = sign_in_agent(documents, owner)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    started = agents_session(agent)
    _, session = mcp_http.authenticate(answer["access_token"], started.external_id, MCP)
    assert session is not None
    return session, lambda: services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")


def agents_session(agent: Any) -> AgentSession:
    return agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))


def _bearer_session(kill: str) -> tuple[AgentSession, Callable[[], Any]]:
    fx = make_agent()
    started = agents.start_session(agent=fx.agent)
    session = agents.session_for_token(fx.token, started.pk)  # the request's read
    assert session is not None
    if kill == "revoke":
        return session, lambda: agents.revoke_agent(agent=fx.agent, actor="test")
    if kill == "rotate":
        return session, lambda: agents.rotate_token(agent=fx.agent, actor="test")
    other = create_team(name=unique("team"), actor="test")
    add_member(team=other, user=fx.owner, role="reviewer", actor="test")
    return session, lambda: agents.transfer_agent(agent=fx.agent, team=other, actor="test")


KILLS = {
    "sign_out": ("guard:token", "was signed out"),
    "revoke": ("guard:token", "was revoked"),
    "rotate": ("guard:token", "was rotated"),
    "move": ("guard:team", "moved to another team"),
}


@pytest.mark.parametrize("kill", list(KILLS))
def test_a_call_the_worker_read_before_its_credential_died_is_not_claimed_after(
    kill: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The killing transaction sweeps the agent's queued calls and stays open; the call is
    admitted then (its token read before: the sweep could not see it), and the worker
    reads it, its token still the agent's; the transaction commits; then the claim."""
    if connection.vendor != "postgresql":
        pytest.skip("a transaction held open beside writes: PostgreSQL (SQLite has one writer)")
    session, die = _signed_in_session(request) if kill == "sign_out" else _bearer_session(kill)
    (Path(session.workspace) / "a.txt").write_text("secret")
    swept, commit = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def killing() -> None:
        try:
            with transaction.atomic():
                die()
                swept.set()
                assert commit.wait(60)
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)
        finally:
            swept.set()
            connections.close_all()

    killer = threading.Thread(target=killing)
    real_claim = transitions.claim

    def claim_after_the_commit(*args: Any, **kwargs: Any) -> bool:
        commit.set()
        killer.join(30)
        assert not killer.is_alive() and not failures, failures
        return real_claim(*args, **kwargs)

    killer.start()
    try:
        assert swept.wait(30)
        call = submit_one(session, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
        assert call.status == Status.QUEUED  # the sweep could not see it
        monkeypatch.setattr(transitions, "claim", claim_after_the_commit)
        execution.execute_call(str(call.pk))
    finally:
        commit.set()
        killer.join(30)
    assert not failures, failures
    call.refresh_from_db()
    guard, said = KILLS[kill]
    # Was: completed, the file's text its result (its claim followed the commit).
    assert (call.status, call.decided_by) == (Status.DENIED, guard), call.content
    assert said in call.content and "secret" not in call.content, call.content
    assert _kinds(call)[-1] == "call.denied", _kinds(call)
    assert "call.started" not in _kinds(call) and call.attempts == 0
    denied = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.denied")
    assert denied.payload["stage"] == "execute", denied.payload


def test_a_claim_whose_credential_is_live_still_runs() -> None:
    """The claim's condition lets a live credential's call through (and a call admitted
    before Harness recorded the token it was sent with)."""
    fx = make_agent()
    session = agents.start_session(agent=fx.agent)
    (Path(session.workspace) / "a.txt").write_text("fine")
    for recorded in (True, False):
        call = submit_one(session, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
        if not recorded:
            provenance = {k: v for k, v in call.provenance.items() if k != "token"}
            ToolCall.objects.filter(pk=call.pk).update(provenance=provenance)
        execution.execute_call(str(call.pk))
        call.refresh_from_db()
        assert call.status == Status.COMPLETED and "fine" in call.content, call.content


# --- a hook's call allowed at once ------------------------------------------------------


def test_an_auto_allowed_hook_call_checked_before_the_sign_out_is_denied(
    documents: DocumentServer, held_hook: Held
) -> None:
    """Its token checked, its call not yet written: the owner signs the agent out (and the
    sign-out commits); then the call is written. It was answered "allow" (released: the
    signed-out client ran the tool)."""
    owner = member()
    client_id, answer = sign_in_agent(documents, owner, resource="http://testserver/api/v1/hooks/")
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/README.md"})
    thread, answers = _hook_in_thread(str(answer["access_token"]), body)
    sent_with = agent.token_prefix
    try:
        assert held_hook.reached.wait(30), "the hook never reached its admission"
        services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
        held_hook.go.set()
    finally:
        held_hook.go.set()
        thread.join(60)
    assert answers, "the hook was never answered"
    output = answers[0].json()["hookSpecificOutput"]
    # Was: "allow".
    assert output["permissionDecision"] == "deny", output
    assert "was signed out" in output["permissionDecisionReason"], output
    call = ToolCall.objects.get(session__agent=agent)
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token")
    assert _kinds(call) == ["call.received", "call.denied"], _kinds(call)
    assert call.provenance["token"] == sent_with  # the sign-in it was sent under, recorded


def test_an_auto_allowed_hook_call_of_a_live_sign_in_is_allowed(
    documents: DocumentServer,
) -> None:
    owner = member()
    client_id, answer = sign_in_agent(documents, owner, resource="http://testserver/api/v1/hooks/")
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/README.md"})
    thread, answers = _hook_in_thread(str(answer["access_token"]), body)
    thread.join(60)
    output = answers[0].json()["hookSpecificOutput"]
    assert output["permissionDecision"] == "allow", output
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    call = ToolCall.objects.get(session__agent=agent)
    assert call.status == Status.RELEASED

"""A voided or rotated agent token's calls that were already queued never run
(docs/identity.md, "Leaving: deactivation"; docs/security.md).

A person shown an agent's bearer token leaves (deactivated, or out of the agent's team):
the token is voided and the agent's calls waiting for a reviewer are cancelled, since
Harness cannot tell which holder sent them. Before, calls already allowed (or approved)
and queued for a worker, not yet claimed, still ran as the agent: one held behind a
busy workspace ran once the workspace was free, after the void. A rotation (what an
admin does when a token may have leaked) left them running too, and, since it clears
the void's marks, so would a check of those marks alone.

Now admission records on each call the prefix of the verified token that sent it
(provenance "token"); the worker, before it claims a call, compares it with the agent
row it reads with the call (no statement more) and denies a call whose token is voided
or no longer the agent's (guard "token", the model told to resend with the new token).
The void and the rotation also deny, in their own commit, the queued calls a worker may
already have read (its claim, conditional on the call still being queued, then fails).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from audit import roles
from audit.models import AuditEvent
from dispatcher import agents, execution
from dispatcher.models import TERMINAL_STATUSES, Agent, Status, ToolCall
from dispatcher.tools import workspace_lock
from teams.services import add_member, create_team, remove_member
from tests.support.factories import make_user, submit_one, unique
from tests.support.live import LiveStack

ROTATED = "The agent token this call was sent with was rotated"
VOIDED = "The agent token this call was sent with was voided"


def people() -> tuple[User, User]:
    """An org admin who is shown the token and will leave, and the agent's owner (trusted:
    a write is allowed at once and queued for a worker)."""
    leaver = make_user(unique("ada"), groups=("admin",))
    owner = make_user(unique("olga"), groups=("admin",), mode="trusted")
    return leaver, owner


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def write(client: httpx.Client, session_id: str, path: str) -> str:
    """A write_file call sent without waiting: its id (the call allowed and queued)."""
    arguments = {"path": path, "content": "x"}
    body = {"calls": [{"id": unique("w"), "name": "write_file", "arguments": arguments}]}
    response = client.post(f"/api/v1/sessions/{session_id}/calls?wait=0", json=body)
    assert response.status_code in (200, 202), response.text
    [call] = response.json()["calls"]
    assert call["status"] == "queued", call
    return str(call["id"])


def wait_until(check: Any, what: str, seconds: float = 20) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def ended(call_id: str) -> ToolCall:
    call: ToolCall = wait_until(
        lambda: ToolCall.objects.filter(pk=call_id, status__in=TERMINAL_STATUSES).first(),
        f"call {call_id} to end",
    )
    return call


def given_back(call_id: str) -> None:
    """Wait until the worker took the call and gave it back (its workspace was held)."""
    first = ToolCall.objects.get(pk=call_id).enqueued_at
    wait_until(
        lambda: ToolCall.objects.get(pk=call_id).enqueued_at != first,
        "the worker to find the workspace held",
    )


def assert_denied_unrun(call_id: str, workspace: Path, path: str, says: str) -> None:
    call = ended(call_id)
    assert call.status == Status.DENIED, (call.status, call.content)  # before: completed
    assert says in call.content and "Resend it" in call.content  # what the model reads
    assert call.started_at is None and call.attempts == 0
    assert not (workspace / path).exists()
    denied = AuditEvent.objects.get(kind="call.denied", subject=f"call:{call_id}")
    assert denied.payload["by"] == "guard:token", denied.payload
    assert not AuditEvent.objects.filter(kind="call.started", subject=f"call:{call_id}")


def runs_with(token: str, live_stack: LiveStack, session_id: str, workspace: Path) -> None:
    """A call sent with `token` runs: its file is written (and the worker, which serves
    the agent's calls in turn, has dealt with everything queued before it)."""
    with httpx.Client(base_url=live_stack.url, headers=bearer(token), timeout=30) as client:
        call_id = write(client, session_id, "after.txt")
    assert ended(call_id).status == Status.COMPLETED
    assert (workspace / "after.txt").read_text() == "x"


# --- With a real worker (daphne, Celery) ----------------------------------------------------


@pytest.mark.live
def test_a_call_queued_behind_a_busy_workspace_never_runs_once_the_token_is_voided(
    live_stack: LiveStack, live_db: None
) -> None:
    leaver, owner = people()
    agent, token = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", shown_to=leaver
    )
    with httpx.Client(base_url=live_stack.url, headers=bearer(token), timeout=30) as client:
        session = client.post("/api/v1/sessions", json={"title": "void"}).json()
        workspace = Path(session["workspace"])
        with workspace_lock.held(workspace):  # another command of the session runs
            call_id = write(client, session["id"], "queued.txt")
            given_back(call_id)  # the worker has it; it waits for the workspace
            assert roles.deactivate(user=leaver, actor="user:root")
    assert_denied_unrun(call_id, workspace, "queued.txt", VOIDED)
    assert f"because {leaver.username}" in ToolCall.objects.get(pk=call_id).content
    new = agents.rotate_token(agent=agent, actor=f"user:{owner.username}", shown_to=owner)
    runs_with(new, live_stack, session["id"], workspace)
    assert not (workspace / "queued.txt").exists()


@pytest.mark.live
def test_a_call_queued_before_a_rotation_never_runs_and_the_new_tokens_do(
    live_stack: LiveStack, live_db: None
) -> None:
    """A plain rotation (nobody left): the old token may have leaked, so what it sent and
    has not started is denied too."""
    _, owner = people()
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t", shown_to=owner)
    with httpx.Client(base_url=live_stack.url, headers=bearer(token), timeout=30) as client:
        session = client.post("/api/v1/sessions", json={"title": "rotate"}).json()
        workspace = Path(session["workspace"])
        with workspace_lock.held(workspace):
            call_id = write(client, session["id"], "queued.txt")
            given_back(call_id)
            new = agents.rotate_token(agent=agent, actor=f"user:{owner.username}", shown_to=owner)
    assert_denied_unrun(call_id, workspace, "queued.txt", ROTATED)
    runs_with(new, live_stack, session["id"], workspace)
    assert not (workspace / "queued.txt").exists()


@pytest.mark.live
def test_the_worker_refuses_a_call_admitted_with_a_token_rotated_meanwhile(
    live_stack: LiveStack, live_db: None
) -> None:
    """The worker's own check: a request that verified the old token just before the
    rotation committed writes its call just after (nothing queued for the rotation to
    deny). The worker compares the token the call records with the agent's now."""
    _, owner = people()
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t", shown_to=owner)
    with httpx.Client(base_url=live_stack.url, headers=bearer(token), timeout=30) as client:
        session_id = client.post("/api/v1/sessions", json={"title": "race"}).json()["id"]
    verified = agents.session_for_token(token, uuid.UUID(session_id))  # the old token's read
    assert verified is not None
    new = agents.rotate_token(agent=agent, actor=f"user:{owner.username}", shown_to=owner)
    call = submit_one(verified, "write_file", {"path": "raced.txt", "content": "x"}, unique("r"))
    assert call.status == Status.QUEUED and call.provenance["token"] != agent.token_prefix
    workspace = Path(verified.workspace)
    assert_denied_unrun(str(call.pk), workspace, "raced.txt", ROTATED)
    runs_with(new, live_stack, session_id, workspace)


# --- In process: the team leaver, the void's own read, calls from before the record ------


@pytest.mark.django_db
def test_a_team_leavers_void_denies_the_agents_queued_calls() -> None:
    team = create_team(name=unique("payments"), actor="t")
    tess = make_user(unique("tess"))
    owner = make_user(unique("olga"), mode="trusted")
    add_member(team=team, user=tess, role="admin", actor="t")
    add_member(team=team, user=owner, role="reviewer", actor="t")
    agent, _ = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", team=team, shown_to=tess
    )
    session = agents.start_session(agent=agent)
    call = submit_one(session, "write_file", {"path": "q.txt", "content": "x"})
    assert call.status == Status.QUEUED
    assert remove_member(team=team, user=tess, role="admin", actor="user:root")
    execution.execute_call(str(call.pk))  # its message arrives: nothing to run
    assert_denied_unrun(str(call.pk), Path(session.workspace), "q.txt", VOIDED)
    assert f"because {tess.username}" in ToolCall.objects.get(pk=call.pk).content


@pytest.mark.django_db
def test_the_worker_refuses_a_call_admitted_after_the_void_by_a_request_verified_before() -> None:
    leaver, owner = people()
    agent, token = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", shown_to=leaver
    )
    session = agents.start_session(agent=agent)
    verified = agents.session_for_token(token, session.pk)
    assert roles.deactivate(user=leaver, actor="user:root")
    call = submit_one(verified, "write_file", {"path": "v.txt", "content": "x"})
    assert call.status == Status.QUEUED
    execution.execute_call(str(call.pk))
    assert_denied_unrun(str(call.pk), Path(session.workspace), "v.txt", VOIDED)


@pytest.mark.django_db
def test_a_call_queued_before_harness_kept_the_record_runs_while_its_token_is_valid() -> None:
    _, owner = people()
    agent, _ = agents.create_agent(owner=owner, name=unique("agent"), actor="t", shown_to=owner)
    session = agents.start_session(agent=agent)
    call = submit_one(session, "write_file", {"path": "old.txt", "content": "x"})
    provenance = {k: v for k, v in call.provenance.items() if k != "token"}
    ToolCall.objects.filter(pk=call.pk).update(provenance=provenance)
    execution.execute_call(str(call.pk))
    assert ToolCall.objects.get(pk=call.pk).status == Status.COMPLETED
    assert Path(session.workspace, "old.txt").read_text() == "x"


@pytest.mark.django_db
def test_a_rotation_gives_the_agent_a_prefix_other_than_its_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The prefix tells a call's token from the agent's current one: a rotation never
    draws the old prefix again."""
    _, owner = people()
    agent, _ = agents.create_agent(owner=owner, name=unique("agent"), actor="t", shown_to=owner)
    fresh = iter([agent.token_prefix, "0123abcd"])
    real = agents._new_token

    def drawn() -> tuple[str, str]:
        prefix = next(fresh)
        token = real()[0]
        return f"hrn_{prefix}_{token.split('_', 2)[2]}", prefix

    monkeypatch.setattr(agents, "_new_token", drawn)
    agents.rotate_token(agent=agent, actor="t", shown_to=owner)
    assert Agent.objects.get(pk=agent.pk).token_prefix == "0123abcd"

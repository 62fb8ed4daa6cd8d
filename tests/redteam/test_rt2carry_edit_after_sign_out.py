"""Red team of eb8ee14 (an edit locks the approval's row, then the agent's row and its
client link): a sign-out that commits while an edit waits for the agent's row. The edit
read the call and its agent with the approval, before it waited; what it does next must
follow what the sign-out committed, not that read."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

import pytest
from django.db import connection, connections, transaction

from agentauth import services
from agentauth.models import AgentClient
from approvals import services as approvals
from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.gateways import mcp
from dispatcher.models import Agent, AgentSession, Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from teams.services import add_member
from tests.support.factories import make_user, unique
from tests.support.oauth import DocumentServer, documents, member, sign_in_agent

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _ask(documents: DocumentServer) -> tuple[Any, Any, Any]:
    """A signed-in agent with one call waiting for a reviewer, and the reviewer."""
    owner = member()
    client_id, _ = sign_in_agent(documents, owner)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    reviewer = make_user(unique("rev"))
    add_member(team=agent.team, user=reviewer, role="reviewer", actor="test")
    session = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    arguments = {"path": "n.txt", "content": "x"}
    proposed = ProposedCall("mcp:1", "write_file", canonical_json(arguments), arguments)
    ask = ApprovalRequest.objects.get(call=mcp.submit(session, proposed))
    return agent, reviewer, ask


def _edit_in_thread(ask: Any, reviewer: Any, outcome: dict[str, Any]) -> threading.Thread:
    def edit() -> None:
        try:
            outcome["edit"] = approvals.edit(
                approval_id=ask.pk,
                user=reviewer,
                digest=ask.call.digest,
                arguments={**ask.call.arguments, "content": "edited"},
            )
        except approvals.DecisionRefused as refused:
            outcome["refused"] = refused
        except Exception:  # noqa: BLE001 (what a request would answer 500 with)
            outcome["error"] = traceback.format_exc()[-1500:]
        finally:
            connections.close_all()

    return threading.Thread(target=edit, daemon=True)


def _wait_for_a_lock_wait() -> None:
    watcher = connections.create_connection("default")
    try:
        with watcher.cursor() as cursor:
            for _ in range(400):  # an event: the edit's backend waiting on a lock
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND pid <> pg_backend_pid()"
                )
                if cursor.fetchone()[0]:
                    return
                time.sleep(0.05)
    finally:
        watcher.close()
    pytest.fail("the edit never waited for the agent's row")


def test_an_edit_whose_call_a_sign_out_cancelled_while_it_waited_is_409_and_admits_nothing(
    documents: DocumentServer,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    agent, reviewer, ask = _ask(documents)
    outcome: dict[str, Any] = {}
    editing = _edit_in_thread(ask, reviewer, outcome)
    with transaction.atomic():
        # The sign-out's first lock, held while the edit reads the approval and waits.
        Agent.objects.select_for_update(of=("self",)).filter(pk=agent.pk).exists()
        editing.start()
        _wait_for_a_lock_wait()
        services.sign_out_agent(agent=agent, actor="user:owner")
    editing.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert "edit" not in outcome
    assert outcome["refused"].status == 409
    ask.call.refresh_from_db()
    assert ask.call.status == Status.CANCELLED
    assert not ToolCall.objects.filter(edited_from=ask.call).exists()


def test_an_edit_of_a_call_written_after_a_sign_outs_sweep_is_refused_once_it_commits(
    documents: DocumentServer,
) -> None:
    """The call was admitted with the sign-in the sign-out ends, and written after the
    sign-out's sweep looked (so it is still pending: `end_calls_of_signed_out`). The edit
    read the agent's old sign-in with the approval, then waited for the agent's row while
    the sign-out committed: its token check must read the sign-in the sign-out left."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    agent, reviewer, _ = _ask(documents)
    # (another session: the sweep locked the first one's audit chain)
    session = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    late: dict[str, Any] = {}

    def submit_late() -> None:
        try:
            arguments = {"path": "late.txt", "content": "x"}
            proposed = ProposedCall("mcp:2", "write_file", canonical_json(arguments), arguments)
            # (read here, as a request would: the sign-out is not committed yet)
            read = AgentSession.objects.select_related("agent__owner").get(pk=session.pk)
            late["call"] = mcp.submit(read, proposed)
        finally:
            connections.close_all()

    outcome: dict[str, Any] = {}
    with transaction.atomic():
        services.sign_out_agent(agent=agent, actor="user:owner")  # (its sweep: done)
        writer = threading.Thread(target=submit_late, daemon=True)
        writer.start()
        writer.join(20)
        ask = ApprovalRequest.objects.get(call=late["call"])
        editing = _edit_in_thread(ask, reviewer, outcome)
        editing.start()
        _wait_for_a_lock_wait()
    editing.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert "edit" not in outcome, "edited a signed-out agent's call"
    assert outcome["refused"].status == 409
    assert "signed out" in str(outcome["refused"]), str(outcome["refused"])
    ask.call.refresh_from_db()
    assert ask.call.status == Status.PENDING_APPROVAL
    assert not ToolCall.objects.filter(edited_from=ask.call).exists()

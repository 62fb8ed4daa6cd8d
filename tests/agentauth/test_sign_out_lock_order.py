"""Owners' sign-outs (two each), reviewers' approvals and edits, the owners' leaving their team and
their deactivation (each revokes the agent, which signs it out), all at once on the same
signed-in agents on PostgreSQL: none waits for another that waits for it. The sign-out
locked the agent's client link last, after the audit chain of the session whose waiting
calls it cancelled, while an approval locks the link (agents.signed_in_now) before that
chain; and a revocation locked the agent's row before the link, the owner's sign-out
after it. Deadlocks ended one of them (a 500) in about every run of this test."""

from __future__ import annotations

import random
import threading
import time
import traceback
from typing import Any

import pytest
from django.db import connection, connections

from agentauth import services
from agentauth.models import AgentClient
from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit.roles import deactivate
from dispatcher import agents
from dispatcher.gateways import mcp
from dispatcher.models import Status
from dispatcher.proposals import ProposedCall, canonical_json
from teams.services import add_member, remove_member
from tests.support.factories import make_user, unique
from tests.support.oauth import DocumentServer, documents, member, sign_in_agent

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _signed_in_with_asks(documents: DocumentServer) -> tuple[Any, Any, Any, list[Any]]:
    """A person's signed-in agent with four calls of one session waiting for a reviewer."""
    owner = member()
    client_id, _ = sign_in_agent(documents, owner)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    reviewer = make_user(unique("rev"))
    add_member(team=agent.team, user=reviewer, role="reviewer", actor="test")
    session = agents.start_session(agent=agent, client=mcp.CLIENT, external_id=unique("mcp"))
    asks = []
    for i in range(4):
        arguments = {"path": f"n{i}.txt", "content": "x"}
        proposed = ProposedCall(f"mcp:{i}", "write_file", canonical_json(arguments), arguments)
        asks.append(ApprovalRequest.objects.get(call=mcp.submit(session, proposed)))
    return owner, agent, reviewer, asks


def test_sign_outs_approvals_and_revocations_at_once_wait_for_each_other_in_one_order(
    documents: DocumentServer,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    rounds = [_signed_in_with_asks(documents) for _ in range(6)]
    failures: list[str] = []

    def run(job: Any) -> None:
        try:
            job()
        except approvals.DecisionRefused:
            pass  # (decided already: cancelled by the sign-out, or denied at release)
        except Exception:  # noqa: BLE001 (what a request would answer 500 with)
            failures.append(traceback.format_exc()[-1500:])
        finally:
            connections.close_all()

    jobs: list[Any] = []
    for owner, agent, reviewer, asks in rounds:
        for _ in range(2):
            jobs.append(lambda a=agent, o=owner: services.sign_out_agent(agent=a, actor="user:o"))
        for ask in asks:
            jobs.append(
                lambda r=reviewer, k=ask: approvals.decide(
                    approval_id=k.pk, user=r, approve=True, digest=k.call.digest
                )
            )
        for ask in asks[:2]:  # (an edit too: it admits the replacement, then releases it)
            jobs.append(
                lambda r=reviewer, k=ask: approvals.edit(
                    approval_id=k.pk,
                    user=r,
                    digest=k.call.digest,
                    arguments={**k.call.arguments, "content": "edited"},
                )
            )
        jobs.append(
            lambda a=agent, o=owner: remove_member(
                team=a.team, user=o, role="reviewer", actor="test"
            )
        )
        jobs.append(lambda o=owner: deactivate(user=o, actor="test"))
    random.shuffle(jobs)
    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    # Was: "deadlock detected" (between a sign-out and an approval, or a revocation).
    assert not failures, "\n=====\n".join(failures)
    for _, agent, _, asks in rounds:
        agent.refresh_from_db()
        assert not agent.is_active
        for ask in asks:
            ask.call.refresh_from_db()
            assert ask.call.status != Status.PENDING_APPROVAL


def test_an_edit_waiting_for_the_approvals_row_holds_no_lock_an_approval_of_it_waits_for(
    documents: DocumentServer,
) -> None:
    """An edit and an approval of the same call at once: the approval locks the approval's
    row, then the agent's client link (agents.signed_in_now). The edit took the agent's
    row and the link first, then the approval's row: each held what the other waited for
    (PostgreSQL ended one, a 500; seen in the test above). Now the edit takes the
    approval's row first: while it waits for it, the link is free."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    _, agent, reviewer, asks = _signed_in_with_asks(documents)
    ask = asks[0]
    link = AgentClient.objects.get(agent=agent)
    errors: list[str] = []

    def edit() -> None:
        try:
            approvals.edit(
                approval_id=ask.pk,
                user=reviewer,
                digest=ask.call.digest,
                arguments={**ask.call.arguments, "content": "edited"},
            )
        except Exception:  # noqa: BLE001 (the test reads it)
            errors.append(traceback.format_exc()[-1500:])
        finally:
            connections.close_all()

    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    editing = threading.Thread(target=edit, daemon=True)
    try:
        with holder.cursor() as cursor:
            # What an approval of the same call holds first: the approval's row.
            cursor.execute(
                "SELECT 1 FROM approvals_approvalrequest WHERE id = %s FOR UPDATE", [ask.pk]
            )
            editing.start()
            for _ in range(400):  # an event: the edit's backend waiting on a lock
                # (read anew: in a transaction, pg_stat_activity is what its first read saw)
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND pid <> pg_backend_pid()"
                )
                if cursor.fetchone()[0]:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the edit never waited for the approval's row")
            # What the approval takes next: the client link (agents.signed_in_now). It
            # was: "could not obtain lock on row" (the edit held it while it waited).
            cursor.execute(
                "SELECT 1 FROM agentauth_agentclient WHERE id = %s FOR NO KEY UPDATE NOWAIT",
                [link.pk],
            )
    finally:
        holder.rollback()  # (the edit goes on either way)
    editing.join(60)
    holder.close()
    assert not errors, errors
    ask.call.refresh_from_db()
    assert ask.call.status == Status.EDITED

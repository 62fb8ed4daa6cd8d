"""rt3people: a consent narrowing an OAuth agent's mode (approving its client again with a
narrower profile: agentauth.services.authorize_agent) narrows the agent's open sessions
(_narrow_sessions). A session the agent's client started at that moment, with the mode it
read with its token before the consent committed, was written after the narrowing's
UPDATE had read the sessions: it kept the wider mode for good, every later call of that
client session under it, while /account/agents/ showed the narrower. A client that opens
sessions in a loop (one Claude Code session id each) keeps one wider session from every
narrowing. Now the session start locks the agent's client link and reads its mode there
(dispatcher.agents._lock_for_a_session): it waits for the consent's commit and starts
narrowed.

PostgreSQL, two real transactions: the consent holds its commit until the session start
has either finished or is waiting on a lock (pg_stat_activity)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from agentauth import services, tokens
from agentauth.models import AgentClient
from dispatcher.models import AgentSession
from tests.redteam.test_rtagent_consent_mode import _signed_in_token
from tests.support.factories import unique
from tests.support.oauth import HOOKS, REDIRECT, DocumentServer, documents, member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _waiting_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("select wait_event_type from pg_stat_activity where pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row and row[0] == "Lock")


def test_a_session_started_during_a_narrowing_consent_starts_narrowed(
    documents: DocumentServer,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks across two connections: PostgreSQL")
    person = member()
    client_id = documents.client(f"/{unique('client')}.json", [REDIRECT], name="Claude Test")
    access = _signed_in_token(documents, client_id, person, "standard")
    link = AgentClient.objects.select_related("application", "team").get(owner=person)
    narrowed, release = threading.Event(), threading.Event()
    started: dict[str, Any] = {}

    def consent_again() -> None:
        try:
            with transaction.atomic():
                services.authorize_agent(
                    owner=person,
                    application=link.application,
                    team=link.team,
                    mode="read_only",
                    actor="test",
                )
                narrowed.set()
                assert release.wait(60)
        finally:
            connection.close()

    def start() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("select pg_backend_pid()")
                started["pid"] = cursor.fetchone()[0]
            assert narrowed.wait(60)
            started["session"] = tokens.client_session_for_token(
                token=access,
                audience=HOOKS,
                client="claude-code",
                external_id=unique("cc-session"),
                project_dir="/work/project",
            )
        except BaseException as error:  # (reported below)
            started["error"] = error
        finally:
            connection.close()

    consenting = threading.Thread(target=consent_again)
    starting = threading.Thread(target=start)
    consenting.start()
    starting.start()
    assert narrowed.wait(60)
    # The session start has read the wider mode with its token: it either finishes (before
    # the fix) or waits for the consent's lock of the link (after it).
    deadline = time.monotonic() + 60
    while starting.is_alive() and time.monotonic() < deadline:
        if "pid" in started and _waiting_on_a_lock(started["pid"]):
            break
        starting.join(0.05)
    release.set()
    consenting.join(60)
    starting.join(60)
    assert "error" not in started, started.get("error")
    session = AgentSession.objects.get(pk=started["session"].pk)
    assert AgentClient.objects.get(pk=link.pk).mode == "read_only"
    # Before: "standard", while the person had just chosen read_only for the agent.
    assert session.mode == "read_only"

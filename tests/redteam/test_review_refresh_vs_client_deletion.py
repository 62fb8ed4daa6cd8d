"""A refresh or a code's exchange (/oauth/token/) and the deletion of its client at once
(the admin's delete, RFC 7592's DELETE: agentauth.services.delete_client).

The deletion locks the client's row FOR UPDATE, then each of its agents' rows FOR
UPDATE (revoke_agents_of_client), then their tokens. A refresh locks its agent's row
(FOR NO KEY UPDATE, agentauth.validators._save_bearer_token), then its refresh token,
then writes the new access and refresh tokens, whose foreign key to the client takes the
client's row FOR KEY SHARE: the client after the agent, the reverse order. A refresh
holding its agent's row and a deletion holding the client's each waited for what the
other held; PostgreSQL ended one of them ("deadlock detected"): a 500."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from oauth2_provider.models import AccessToken, RefreshToken, get_application_model

from agentauth import services
from agentauth.models import AgentClient
from tests.redteam.test_credfix_refresh_and_release import _signed_in
from tests.support.oauth import DocumentServer, authorization_code, documents, refresh, token
from tests.support.row_locks import blocked_or, in_thread, wait_blocked_by

__all__ = ["documents"]  # the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def test_a_refresh_during_its_client_s_deletion_waits_and_neither_fails(
    documents: DocumentServer,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks across connections: PostgreSQL (SQLite has one writer)")
    client_id, answer, agent = _signed_in(documents)
    application = get_application_model().objects.get(client_id=client_id)
    token = RefreshToken.objects.get(application=application, revoked__isnull=True)
    held, release = threading.Event(), threading.Event()

    def hold_token() -> None:  # the refresh, past its agent's row, waits for its token
        with transaction.atomic():
            list(RefreshToken.objects.filter(pk=token.pk).select_for_update())
            held.set()
            assert release.wait(60)

    answers: dict[str, Any] = {}

    def refresh_it() -> None:
        answers["refresh"] = refresh(client_id, answer["refresh_token"])

    def delete_it() -> None:
        answers["deleted"] = services.delete_client(application=application, actor="test")

    holder_pid: list[int] = []
    holder, holder_failed = in_thread(hold_token, holder_pid, threading.Event())
    threads: list[threading.Thread] = [holder]
    failures: list[list[BaseException]] = [holder_failed]
    try:
        assert held.wait(30)
        refreshed = threading.Event()
        thread, failed = in_thread(refresh_it, [], refreshed)
        threads.append(thread)
        failures.append(failed)
        wait_blocked_by(holder_pid[0], refreshed)
        deleted, pid = threading.Event(), []
        thread, failed = in_thread(delete_it, pid, deleted)
        threads.append(thread)
        failures.append(failed)
        blocked_or(pid, deleted)  # (waits for the refresh's agent row, or got it first)
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    # Was: "deadlock detected" in one of them.
    assert not any(failures), failures
    assert answers["deleted"] == [agent.name]
    assert answers["refresh"].status_code in (200, 400), answers["refresh"].content
    # The client gone: no token of the agent works, whichever went first.
    assert not get_application_model().objects.filter(pk=application.pk).exists()
    assert not AccessToken.objects.filter(harness__agent=agent).exists()


def test_a_code_exchange_during_its_client_s_deletion_waits_and_neither_fails(
    documents: DocumentServer,
) -> None:
    """The same of a code's exchange, which locks its agent's row (`_still_bound`) before
    it writes the tokens: it waits for a share lock of the agent's row here, the deletion
    comes behind it, and the exchange, first to get the row, then wrote its access token
    (the client's row FOR KEY SHARE) while the deletion held the client's and waited for
    the agent's (was: "deadlock detected")."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks across connections: PostgreSQL (SQLite has one writer)")
    client_id, code, verifier = authorization_code(documents)
    application = get_application_model().objects.get(client_id=client_id)
    agent = AgentClient.objects.get(application=application).agent
    held, release = threading.Event(), threading.Event()

    def hold_agent() -> None:  # the exchange waits for the agent's row before it locks it
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM dispatcher_agent WHERE id = %s FOR SHARE", [agent.pk])
            held.set()
            assert release.wait(60)

    answers: dict[str, Any] = {}

    def exchange() -> None:
        answers["token"] = token(client_id, code, verifier)

    def delete_it() -> None:
        answers["deleted"] = services.delete_client(application=application, actor="test")

    holder_pid: list[int] = []
    holder, holder_failed = in_thread(hold_agent, holder_pid, threading.Event())
    threads: list[threading.Thread] = [holder]
    failures: list[list[BaseException]] = [holder_failed]
    try:
        assert held.wait(30)
        exchanged = threading.Event()
        thread, failed = in_thread(exchange, [], exchanged)
        threads.append(thread)
        failures.append(failed)
        wait_blocked_by(holder_pid[0], exchanged)
        deleted, pid = threading.Event(), []
        thread, failed = in_thread(delete_it, pid, deleted)
        threads.append(thread)
        failures.append(failed)
        blocked_or(pid, deleted)
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    assert not any(failures), failures
    assert answers["deleted"] == [agent.name]
    assert answers["token"].status_code in (200, 400), answers["token"].content
    assert not get_application_model().objects.filter(pk=application.pk).exists()
    assert not AccessToken.objects.filter(harness__agent=agent).exists()

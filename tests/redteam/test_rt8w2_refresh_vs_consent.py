"""Red team rt8w2 (cbb5c9f0): a refresh (/oauth/token/) now locks its client's row FOR KEY
SHARE first, then its agent's, its refresh token, and at the new tokens' writes the
person's row (their foreign key to the owner: FOR KEY SHARE). A consent for the same
client by the same person (agentauth.services.authorize_agent) locks the person's row FOR
UPDATE, then the client's FOR UPDATE; a deactivation locks the person's row, then their
agents'. Each probe holds the refresh at its refresh token (past the client and the agent)
while the other comes behind it, then lets it go: neither may fail."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, transaction
from oauth2_provider.models import RefreshToken, get_application_model

from agentauth import services
from agentauth.models import AgentClient
from audit import roles
from tests.redteam.test_credfix_refresh_and_release import _signed_in
from tests.support.oauth import DocumentServer, authorization_code, documents, refresh, token
from tests.support.row_locks import blocked_or, in_thread, require_postgresql, wait_blocked_by

__all__ = ["documents"]  # the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


@pytest.mark.parametrize("other", ["consent", "deactivation"])
def test_a_refresh_and_a_consent_or_deactivation_of_its_person_wait_and_neither_fails(
    documents: DocumentServer, other: str
) -> None:
    require_postgresql()
    client_id, answer, agent = _signed_in(documents)
    application = get_application_model().objects.get(client_id=client_id)
    link = AgentClient.objects.get(application=application)
    owner, team, mode = link.owner, link.team, link.mode
    token = RefreshToken.objects.get(application=application, revoked__isnull=True)
    held, release = threading.Event(), threading.Event()

    def hold_token() -> None:  # the refresh, past its client's and agent's rows, waits here
        with transaction.atomic():
            list(RefreshToken.objects.filter(pk=token.pk).select_for_update())
            held.set()
            assert release.wait(60)

    answers: dict[str, Any] = {}

    def refresh_it() -> None:
        answers["refresh"] = refresh(client_id, answer["refresh_token"])

    def other_it() -> None:
        if other == "consent":
            answers["other"] = services.authorize_agent(
                owner=owner, application=application, team=team, mode=mode, actor="test"
            )
        else:
            answers["other"] = roles.deactivate(user=owner, actor="test")

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
        done, pid = threading.Event(), list[int]()
        thread, failed = in_thread(other_it, pid, done)
        threads.append(thread)
        failures.append(failed)
        assert blocked_or(pid, done), "the other did not wait for the refresh"
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    assert not any(failures), failures
    assert answers["refresh"].status_code in (200, 400), answers["refresh"].content


def test_a_code_exchange_and_a_consent_of_its_person_for_its_client_wait_and_neither_fails(
    documents: DocumentServer,
) -> None:
    """The same of a code's exchange (agentauth.validators._still_bound), held at its
    agent's row (past the person's and the client's), a consent of the same person for the
    same client behind it (was: "deadlock detected" in the consent, a 500)."""
    require_postgresql()
    client_id, code, verifier = authorization_code(documents)
    application = get_application_model().objects.get(client_id=client_id)
    link = AgentClient.objects.get(application=application)
    held, release = threading.Event(), threading.Event()

    def hold_agent() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM dispatcher_agent WHERE id = %s FOR SHARE", [link.agent_id]
            )
            held.set()
            assert release.wait(60)

    answers: dict[str, Any] = {}

    def exchange() -> None:
        answers["token"] = token(client_id, code, verifier)

    def consent() -> None:
        answers["agent"] = services.authorize_agent(
            owner=link.owner, application=application, team=link.team, mode=link.mode, actor="t"
        )

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
        done, pid = threading.Event(), list[int]()
        thread, failed = in_thread(consent, pid, done)
        threads.append(thread)
        failures.append(failed)
        assert blocked_or(pid, done), "the consent did not wait for the exchange"
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    assert not any(failures), failures
    assert answers["token"].status_code == 200, answers["token"].content
    assert answers["agent"].pk == link.agent_id

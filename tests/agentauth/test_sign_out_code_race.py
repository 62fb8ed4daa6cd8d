"""A code's exchange racing its agent's sign-out (agentauth.services.sign_out_agent): the
exchange checked its code before the sign-out committed, and writes its token just as
(or after) the sign-out commits. Either way no token of the agent outlives the sign-out:
one written after is refused (the code unbound), one written before is deleted by it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from oauth2_provider.models import AccessToken

from agentauth import services, validators
from agentauth.models import AgentClient
from tests.support.claude_code_hooks import pre_tool_use
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    DocumentServer,
    authorization_code,
    documents,
    member,
    sign_in_agent,
    token,
)

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _hook(access: str) -> Any:
    body = pre_tool_use(unique("cc"), "Read", {"file_path": "/home/dev/project/README.md"})
    return Client().post(
        "/api/v1/hooks/claude-code",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {access}"},
    )


def _exchange_held(
    monkeypatch: pytest.MonkeyPatch, client_id: str, code: str, verifier: str, *, after: bool
) -> tuple[threading.Thread, threading.Event, list[Any]]:
    """The exchange in a thread, held just before (or, with `after`, just after) the
    check of its code under the lock of the agent's client link."""
    reached, go, answers = threading.Event(), threading.Event(), []
    bound: Callable[..., bool] = validators._still_bound

    def held(request: Any, agent_id: Any) -> bool:
        if not after:
            reached.set()
            assert go.wait(30)
        still = bound(request, agent_id)
        if after:
            reached.set()
            assert go.wait(30)
        return still

    monkeypatch.setattr(validators, "_still_bound", held)

    def exchange() -> None:
        try:
            answers.append(token(client_id, code, verifier, resource=HOOKS))
        finally:
            connections.close_all()

    thread = threading.Thread(target=exchange)
    thread.start()
    assert reached.wait(30), "the exchange never reached its check"
    return thread, go, answers


def test_a_code_checked_before_the_sign_out_and_exchanged_after_gives_no_token(
    documents: DocumentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("SQLite: the held exchange holds the one writer's lock the sign-out needs")
    owner = member()
    client_id, _ = sign_in_agent(documents, owner, resource=HOOKS)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    _, code, verifier = authorization_code(
        documents, owner, client_id=client_id, team=agent.team, resource=HOOKS
    )
    thread, go, answers = _exchange_held(monkeypatch, client_id, code, verifier, after=False)
    try:
        services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
    finally:
        go.set()
        thread.join(30)
    # Was: 200, its token acting as the agent.
    assert answers[0].status_code == 400, answers[0].content
    assert "signed out" in answers[0].json()["error_description"]


def test_a_token_written_as_the_sign_out_commits_is_deleted_by_it(
    documents: DocumentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    owner = member()
    client_id, _ = sign_in_agent(documents, owner, resource=HOOKS)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    _, code, verifier = authorization_code(
        documents, owner, client_id=client_id, team=agent.team, resource=HOOKS
    )
    thread, go, answers = _exchange_held(monkeypatch, client_id, code, verifier, after=True)
    done = threading.Event()

    def sign_out() -> None:
        try:
            services.sign_out_agent(agent=agent, actor=f"user:{owner.username}")
            done.set()
        finally:
            connections.close_all()

    signing_out = threading.Thread(target=sign_out)
    signing_out.start()
    try:
        # The sign-out waits for the exchange, which holds the client link's lock.
        with connection.cursor() as cursor:
            while signing_out.is_alive():
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                if cursor.fetchone()[0]:
                    break
                signing_out.join(0.05)
        assert not done.is_set()
    finally:
        go.set()
        thread.join(30)
        signing_out.join(30)
    assert done.is_set()
    # Its token was written first, then deleted by the sign-out, whether or not its
    # answer was made before (was: the token acted as the agent after the sign-out).
    assert not AccessToken.objects.filter(harness__agent=agent).exists()
    if answers[0].status_code == 200:
        assert _hook(answers[0].json()["access_token"]).status_code == 401
    else:
        assert "signed out" in answers[0].json()["error_description"], answers[0].content

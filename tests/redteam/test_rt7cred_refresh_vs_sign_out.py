"""A refresh (/oauth/token/) and a sign-out of the same agent at once (the owner's "Sign
out" page, a lost device's thief refreshing the stolen refresh token meanwhile).

The sign-out locks the agent's row FOR UPDATE, then its client link, then deletes the
agent's refresh tokens (agentauth.services.sign_out_agent). A refresh locked its refresh
token FOR UPDATE first (agentauth.validators._save_bearer_token, then django-oauth-
toolkit's RefreshToken.revoke), and then, writing the new access token's agent
(AgentToken, a foreign key to the agent), took the agent's row FOR KEY SHARE: the reverse
order. Each waited for what the other held; PostgreSQL ended one of them ("deadlock
detected"): a 500 for the refresh, or for the owner's sign-out."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from oauth2_provider.models import AccessToken, RefreshToken

from agentauth.models import AgentClient
from tests.redteam.test_credfix_refresh_and_release import _signed_in
from tests.support.oauth import DocumentServer, documents, refresh
from tests.support.row_locks import RowHold, require_postgresql, wait_blocked_by

__all__ = ["documents"]  # the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def test_a_refresh_during_a_sign_out_waits_for_it_and_neither_fails(
    documents: DocumentServer,
) -> None:
    require_postgresql()
    client_id, answer, agent = _signed_in(documents)
    owner = agent.owner
    answers: dict[str, Any] = {}

    def sign_out() -> None:
        browser = Client()
        browser.force_login(owner)
        answers["sign_out"] = browser.post(f"/account/agents/{agent.pk}/sign-out")

    def refresh_it() -> None:
        answers["refresh"] = refresh(client_id, answer["refresh_token"])

    # The sign-out, past the agent's row, waits for its link held meanwhile.
    # Was: "deadlock detected" in one of them (the refresh's 500, a failure of a thread).
    with RowHold(lambda: list(AgentClient.objects.filter(agent=agent).select_for_update())) as hold:
        pid = hold.waits(sign_out, "the sign-out")
        _, refreshed = hold.start(refresh_it)
        # The refresh holds its refresh token and waits for the sign-out's agent row (was)
        # or waits before it holds anything: either way it waits for the sign-out.
        wait_blocked_by(pid[0], refreshed)
    assert answers["sign_out"].status_code == 302, answers["sign_out"].status_code
    assert answers["refresh"].status_code == 400, answers["refresh"].content
    assert answers["refresh"].json()["error"] == "invalid_grant"
    # Signed out: no token of the agent works, none came of the refresh.
    assert not AccessToken.objects.filter(harness__agent=agent).exists()
    assert not RefreshToken.objects.filter(
        application__client_id=client_id, revoked__isnull=True
    ).exists()

"""Red-team attacks on step-up approvals (approvals/stepup.py, audit/assertions.py): real
assertions of a software passkey registered through allauth.mfa."""

from __future__ import annotations

import json

import pytest

from approvals.models import SignedVerdict
from dispatcher.models import Agent, Status
from teams.services import add_member, create_team
from tests.approvals.conftest import ask
from tests.approvals.test_step_up import (
    WRITE,
    challenge,
    decide,
    reviewer_with_key,
    status_of,
    step_up_agent,
)
from tests.support.factories import unique

pytestmark = pytest.mark.django_db


def test_a_signed_deny_does_not_approve() -> None:
    approval = ask(step_up_agent(["approve", "deny"]), WRITE)
    _, client, key = reviewer_with_key()
    denied = key.assertion(challenge(client, approval, "deny"))
    # The approve's nonce is waiting too, so only the signed verdict differs.
    challenge(client, approval, "approve")
    answer = decide(client, approval, denied, "approve")
    assert answer.status_code == 403
    assert status_of(approval) == Status.PENDING_APPROVAL
    assert not SignedVerdict.objects.filter(approval=approval).exists()


def test_a_reviewer_of_another_team_gets_no_challenge_and_their_passkey_decides_nothing() -> None:
    fx = step_up_agent()
    home = create_team(name=unique("home"), actor="test")
    Agent.objects.filter(pk=fx.agent.pk).update(team=home)
    approval = ask(fx, WRITE)
    stranger, client, key = reviewer_with_key()
    stranger.groups.clear()  # a reviewer of another team only
    add_member(
        team=create_team(name=unique("other"), actor="test"),
        user=stranger,
        role="reviewer",
        actor="test",
    )
    asked = client.post(f"/approvals/{approval.pk}/step-up", {"verdict": "approve"})
    assert asked.status_code == 404
    assert approval.call.digest not in asked.content.decode()
    # An assertion over the right challenge, made without asking the page, decides nothing.
    member, member_client, _ = reviewer_with_key()
    signed = key.assertion(challenge(member_client, approval))
    answer = client.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest, "assertion": json.dumps(signed)},
    )
    assert answer.status_code == 403 and "another team" in answer.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL

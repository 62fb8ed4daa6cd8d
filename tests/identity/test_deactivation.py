"""Deactivating a person, by an admin or because the identity provider says they are
gone: in one transaction, audited, their votes on pending calls are void, their one-tap
links never decide again, their agents' tokens are revoked or handed to a sponsor, and
their open sockets close (tests/audit/test_socket_access.py; the live test below)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from approvals import links
from approvals.models import ApprovalRequest
from audit import roles
from audit.models import AuditEvent
from dispatcher import agents
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, quorum_agent, reviewer, vote
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db


def failing_step(**kwargs: Any) -> dict[str, Any]:
    raise RuntimeError("a step that fails")


def pending_with_one_vote() -> tuple[ApprovalRequest, User]:
    approval = ask(quorum_agent(approvals=2), WRITE)
    user, client = reviewer()
    assert vote(client, approval).status_code == 200
    assert approval.approvers() == [user.username]
    return approval, user


def test_a_pending_vote_is_void_and_the_call_waits_for_another(
    django_capture_on_commit_callbacks: Any,
) -> None:
    approval, user = pending_with_one_vote()
    assert roles.deactivate(user=user, actor="user:admin")
    assert approval.approvers() == []
    approval.call.refresh_from_db()
    assert approval.call.status == "pending_approval"
    discarded = AuditEvent.objects.get(
        kind="approval.vote_discarded", session_id=approval.call.session_id
    )
    assert discarded.payload["reviewer"] == user.username
    assert discarded.payload["reason"] == "their account was deactivated"
    event = AuditEvent.objects.get(kind="user.deactivated", subject=f"user:{user.username}")
    assert event.payload["votes_voided"] == [str(approval.call_id)]


def test_an_unused_link_never_decides_again_even_when_the_account_returns() -> None:
    approval = ask(make_agent(mode="standard"), {"path": "a.txt", "content": "x"})
    person = make_user(unique("rev"), groups=("reviewer",))
    token = links.make_token(approval, person, "approve")
    assert links.read(token).recipient == person  # good before
    assert roles.deactivate(user=person, actor="user:admin")
    with pytest.raises(links.LinkRefused) as refused:
        links.read(token)
    assert refused.value.status == 403
    person.is_active = True
    person.save()
    roles.grant_role(user=person, role="reviewer", actor="test")
    with pytest.raises(links.LinkRefused, match="deactivated after this link was sent"):
        links.read(token)
    client = Client()
    client.force_login(person)
    page = client.get(reverse("approvals:link", args=[token]))
    assert page.status_code == 403
    assert "deactivated after this link was sent" in page.content.decode()
    assert links.read(links.make_token(approval, person, "approve")).recipient == person


def test_the_agents_tokens_are_revoked() -> None:
    fx = make_agent(mode="standard")
    assert agents.authenticate_token(fx.token) is not None
    assert roles.deactivate(user=fx.owner, actor="user:admin")
    assert agents.authenticate_token(fx.token) is None
    revoked = AuditEvent.objects.get(kind="agent.revoked", subject=f"agent:{fx.agent.pk}")
    assert revoked.actor == "user:admin"
    response = Client().post(
        "/api/v1/sessions", {}, content_type="application/json", headers=fx.headers
    )
    assert response.status_code == 401
    event = AuditEvent.objects.get(kind="user.deactivated", subject=f"user:{fx.owner.username}")
    assert event.payload["agents_revoked"] == [fx.agent.name]


def test_the_agents_are_handed_to_a_sponsor_and_keep_working() -> None:
    fx = make_agent(mode="standard")
    sponsor = make_user(unique("sponsor"))
    make_agent(owner=sponsor)  # another agent: no clash
    clash = agents.create_agent(owner=sponsor, name=fx.agent.name, actor="test")[0]
    assert roles.deactivate(user=fx.owner, actor="user:admin", sponsor=sponsor)
    agent = agents.authenticate_token(fx.token)
    assert agent is not None and agent.owner == sponsor
    assert agent.name != clash.name and agent.name.startswith(fx.agent.name)
    handed = AuditEvent.objects.get(kind="agent.handed_over", subject=f"agent:{fx.agent.pk}")
    assert handed.payload == {"name": agent.name, "from": fx.owner.username, "to": sponsor.username}
    response = Client().post(
        "/api/v1/sessions", {}, content_type="application/json", headers=fx.headers
    )
    assert response.status_code == 201


def test_it_is_one_transaction_a_failing_step_changes_nothing(settings: Any) -> None:
    approval, user = pending_with_one_vote()
    fx = make_agent(owner=user)
    settings.HARNESS_DEACTIVATION_STEPS = [
        *settings.HARNESS_DEACTIVATION_STEPS,
        f"{__name__}.failing_step",
    ]
    with pytest.raises(RuntimeError):
        roles.deactivate(user=user, actor="user:admin")
    user.refresh_from_db()
    assert user.is_active and approval.approvers() == [user.username]
    assert agents.authenticate_token(fx.token) is not None
    assert not AuditEvent.objects.filter(
        kind="user.deactivated", subject=f"user:{user.username}"
    ).exists()


def test_the_command_deactivates_with_a_sponsor() -> None:
    fx = make_agent(mode="standard")
    sponsor = make_user(unique("sponsor"))
    out = io.StringIO()
    call_command("deactivate_user", fx.owner.username, "--sponsor", sponsor.username, stdout=out)
    assert "deactivated" in out.getvalue()
    assert not User.objects.get(pk=fx.owner.pk).is_active
    assert agents.authenticate_token(fx.token).owner == sponsor  # type: ignore[union-attr]


def test_an_agent_with_a_sponsor_of_its_own_goes_to_that_sponsor() -> None:
    fx = make_agent(mode="standard")
    sponsor = make_user(unique("sponsor"))
    type(fx.agent).objects.filter(pk=fx.agent.pk).update(sponsor=sponsor)
    other = make_agent(owner=fx.owner)  # no sponsor: revoked
    assert roles.deactivate(user=fx.owner, actor="user:admin")
    assert agents.authenticate_token(fx.token).owner == sponsor  # type: ignore[union-attr]
    assert agents.authenticate_token(other.token) is None
    event = AuditEvent.objects.get(kind="user.deactivated", subject=f"user:{fx.owner.username}")
    assert event.payload["agents_revoked"] == [other.agent.name]
    assert len(event.payload["agents_handed_over"]) == 1

"""Quorum: an ask rule that needs N approvals from distinct reviewers (optionally a group)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from approvals.models import ApprovalRequest, Vote
from audit import roles
from audit.models import AuditEvent
from dispatcher.models import Status
from dispatcher.policy import profiles
from tests.approvals.conftest import ask
from tests.support.factories import AgentFixture, make_agent, make_user, unique

pytestmark = pytest.mark.django_db

WRITE = {"path": "prod.tf", "content": "apply"}


def quorum_agent(approvals: int = 2, group: str = "", rule: str = "write_file") -> AgentFixture:
    fx = make_agent(mode="standard")
    entry: dict[str, Any] = {"rule": rule, "approvals": approvals}
    if group:
        Group.objects.get_or_create(name=group)
        entry["group"] = group
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=[], ask=[entry], deny=[], actor="test"
    )
    return fx


def reviewer(*groups: str) -> tuple[User, Client]:
    user = make_user(unique("rev"), groups=("reviewer",))
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    client = Client()
    client.force_login(user)
    return user, client


def vote(client: Client, approval: ApprovalRequest, action: str = "approve", **extra: Any) -> Any:
    data = {"action": action, "digest": approval.call.digest, **extra}
    return client.post(f"/approvals/{approval.pk}/decide", data, headers={"HX-Request": "true"})


def status_of(approval: ApprovalRequest) -> str:
    approval.call.refresh_from_db()
    return str(approval.call.status)


def test_a_quorum_rule_records_its_requirement_on_the_request() -> None:
    approval = ask(quorum_agent(approvals=3), WRITE)
    assert (approval.approvals_required, approval.group) == (3, "")
    assert "It needs 3 approvals from distinct reviewers." in approval.reason
    requested = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="call.approval_requested"
    )
    assert requested.payload["approvals"] == 3


def test_two_distinct_reviewers_approve_and_only_then_the_call_is_queued() -> None:
    approval = ask(quorum_agent(approvals=2), WRITE)
    alice, alice_client = reviewer()
    _, bob_client = reviewer()
    first = vote(alice_client, approval)
    assert first.status_code == 200
    assert f"counts: 1 of 2: {alice.username}" in first.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL
    assert f"1 of 2: {alice.username}" in alice_client.get("/approvals/").content.decode()
    assert vote(bob_client, approval).status_code == 200
    assert status_of(approval) == Status.QUEUED
    events = list(
        AuditEvent.objects.filter(subject=f"call:{approval.call_id}")
        .filter(kind__in=["approval.vote", "call.approved"])
        .order_by("seq")
    )
    assert [e.kind for e in events] == ["approval.vote", "call.approved"]
    assert events[0].payload["digest_seen"] == approval.call.digest
    assert len(events[1].payload["approvals"]) == 2


def test_the_same_reviewer_never_counts_twice() -> None:
    approval = ask(quorum_agent(approvals=2), WRITE)
    _, client = reviewer()
    assert vote(client, approval).status_code == 200
    again = vote(client, approval)
    assert again.status_code == 409 and "You already approved" in again.content.decode()
    assert Vote.objects.filter(approval=approval).count() == 1
    assert status_of(approval) == Status.PENDING_APPROVAL


def test_one_deny_ends_the_call_whatever_the_votes() -> None:
    approval = ask(quorum_agent(approvals=3), WRITE)
    _, a = reviewer()
    _, b = reviewer()
    vote(a, approval)
    assert vote(b, approval, "deny", feedback="not on a Friday").status_code == 200
    assert status_of(approval) == Status.DENIED
    approval.call.refresh_from_db()
    assert "not on a Friday" in approval.call.content


def test_a_group_quorum_counts_only_members_of_the_group() -> None:
    group = unique("sre")
    approval = ask(quorum_agent(approvals=2, group=group), WRITE)
    _, outsider = reviewer()
    _, member_one = reviewer(group)
    _, member_two = reviewer(group)
    refused = vote(outsider, approval)
    assert refused.status_code == 403 and f"group &#x27;{group}&#x27;" in refused.content.decode()
    vote(member_one, approval)
    assert status_of(approval) == Status.PENDING_APPROVAL
    vote(member_two, approval)
    assert status_of(approval) == Status.QUEUED


@override_settings(HARNESS_FORBID_SELF_APPROVAL=True)
def test_the_agents_owner_never_counts_when_self_approval_is_forbidden() -> None:
    fx = quorum_agent(approvals=2)
    approval = ask(fx, WRITE)
    fx.owner.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    owner = Client()
    owner.force_login(fx.owner)
    assert vote(owner, approval).status_code == 403
    assert Vote.objects.filter(approval=approval).count() == 0


def test_a_quorum_call_cannot_be_allowed_for_the_session_by_one_reviewer() -> None:
    approval = ask(quorum_agent(approvals=2), WRITE)
    _, client = reviewer()
    refused = vote(client, approval, "approve_session")
    assert refused.status_code == 400 and "several approvals" in refused.content.decode()
    assert Vote.objects.filter(approval=approval).count() == 0


def test_a_vote_for_other_bytes_is_refused_and_audited() -> None:
    approval = ask(quorum_agent(approvals=2), WRITE)
    _, client = reviewer()
    response = client.post(
        f"/approvals/{approval.pk}/decide", {"action": "approve", "digest": "0" * 64}
    )
    assert response.status_code == 409
    assert Vote.objects.filter(approval=approval).count() == 0
    assert AuditEvent.objects.filter(
        subject=f"call:{approval.call_id}", kind="approval.digest_mismatch"
    ).exists()


def test_a_plain_ask_rule_first_in_the_list_does_not_hide_a_quorum_rule() -> None:
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=["write_file(**/*.md)", {"rule": "write_file(prod/**)", "approvals": 2}],
        deny=[],
        actor="test",
    )
    approval = ask(fx, {"path": "prod/notes.md", "content": "x"})
    assert approval.approvals_required == 2


def test_expiry_ends_the_whole_request_with_votes_in_it() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from approvals import services

    approval = ask(quorum_agent(approvals=2), WRITE)
    _, client = reviewer()
    vote(client, approval)
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert services.expire_due() == 1
    assert status_of(approval) == Status.EXPIRED


def leave_role(user: User, group: str) -> None:
    roles.remove_role(user=user, role="reviewer", actor="user:admin")


def leave_group(user: User, group: str) -> None:
    user.groups.remove(Group.objects.get(name=group))


def deactivated(user: User, group: str) -> None:
    roles.deactivate(user=user, actor="user:admin")


@pytest.mark.parametrize(
    ("leaves", "reason"),
    [
        (leave_role, "they are no longer a reviewer"),
        (leave_group, "they are no longer in the group"),
        (deactivated, "their account was deactivated"),
    ],
    ids=["role", "group", "deactivated"],
)
def test_a_vote_of_someone_who_left_is_discarded_and_audited(
    leaves: Callable[[User, str], None], reason: str
) -> None:
    group = unique("sre")
    approval = ask(quorum_agent(approvals=2, group=group), WRITE)
    first, first_client = reviewer(group)
    _, second_client = reviewer(group)
    _, third_client = reviewer(group)
    assert vote(first_client, approval).status_code == 200
    leaves(first, group)
    second = vote(second_client, approval)
    assert second.status_code == 200
    assert status_of(approval) == Status.PENDING_APPROVAL  # 1 of 2: the first vote is gone
    assert "counts: 1 of 2" in second.content.decode()
    discarded = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.vote_discarded"
    )
    # Deactivating voids the vote at once, in the deactivation's name (audit.roles).
    assert discarded.actor == ("user:admin" if leaves is deactivated else "harness")
    assert discarded.payload["reviewer"] == first.username
    assert discarded.payload["reason"].startswith(reason)
    assert discarded.payload["digest_seen"] == approval.call.digest
    assert [v.voter_id for v in Vote.objects.filter(approval=approval)] != [first.pk]
    assert vote(third_client, approval).status_code == 200
    assert status_of(approval) == Status.QUEUED
    approved = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    assert first.username not in approved.payload["approvals"]
    auditor = Client()
    auditor.force_login(make_user(unique("auditor"), groups=("auditor",)))
    timeline = auditor.get(f"/audit/sessions/{approval.call.session_id}/").content.decode()
    assert "vote discarded: its reviewer left before the quorum completed" in timeline

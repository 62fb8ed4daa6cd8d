"""Several groups as several counts: "1 of payments-oncall and 1 of security". Every count
must be met by distinct people; one person's vote counts towards one group only; the queue
and the live push show the progress per group."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group

from approvals.models import ApprovalRequest, Vote
from approvals.services import assign
from audit.models import AuditEvent
from dispatcher.models import Status
from dispatcher.policy import profiles
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, reviewer, status_of, vote
from tests.support.factories import AgentFixture, make_agent, make_user, unique

pytestmark = pytest.mark.django_db


def groups_agent(*counts: tuple[str, int], step_up: Any = None) -> AgentFixture:
    fx = make_agent(mode="standard")
    for name, _ in counts:
        Group.objects.get_or_create(name=name)
    entry: dict[str, Any] = {
        "rule": "write_file",
        "approvals": [{"group": g, "count": n} for g, n in counts],
    }
    if step_up is not None:
        entry["step_up"] = step_up
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=[], ask=[entry], deny=[], actor="test"
    )
    return fx


def test_the_rule_is_recorded_and_said_and_round_trips() -> None:
    fx = groups_agent(("oncall", 1), ("security", 1))
    approval = ask(fx, WRITE)
    assert approval.groups == [{"group": "oncall", "count": 1}, {"group": "security", "count": 1}]
    assert approval.approvals_required == 2 and approval.group == "" and approval.is_quorum
    assert "1 of the group 'oncall' and 1 of the group 'security'" in approval.reason
    assert profiles.rules_document(fx.owner)["ask"] == [
        {
            "rule": "write_file",
            "approvals": [{"group": "oncall", "count": 1}, {"group": "security", "count": 1}],
        }
    ]


@pytest.mark.parametrize(
    ("approvals", "problem"),
    [
        ([], "each item of"),
        ([{"group": "oncall", "count": 0}], "each item of"),
        ([{"group": "oncall", "size": 1}], "each item of"),
        ([{"group": "oncall"}, {"group": "oncall"}], "named twice"),
        ([{"group": "nobody-here", "count": 1}], "the group 'nobody-here' does not exist"),
        ([{"group": "oncall", "count": 11}], "more than 10"),
    ],
)
def test_a_bad_list_is_named_and_nothing_is_saved(approvals: Any, problem: str) -> None:
    Group.objects.get_or_create(name="oncall")
    user = make_user(unique("dev"))
    with pytest.raises(profiles.InvalidProfile, match=problem):
        profiles.update_profile(
            user=user,
            mode="standard",
            allow=[],
            ask=[{"rule": "write_file", "approvals": approvals}],
            deny=[],
            actor="t",
        )


def test_every_count_must_be_met_by_distinct_people() -> None:
    approval = ask(groups_agent(("oncall", 1), ("security", 1)), WRITE)
    one, one_client = reviewer("oncall")
    another, another_client = reviewer("oncall")
    outsider, outsider_client = reviewer()
    refused = vote(outsider_client, approval)
    assert refused.status_code == 403 and "in none of these groups" in refused.content.decode()
    assert vote(one_client, approval).status_code == 200
    # A second on-call approval meets no count that is still short.
    second = vote(another_client, approval)
    assert second.status_code == 409 and "already have the approvals" in second.content.decode()
    assert status_of(approval) == Status.PENDING_APPROVAL
    page = one_client.get("/approvals/").content.decode()
    assert f"oncall 1 of 1: {one.username}; security 0 of 1" in page
    sec, sec_client = reviewer("security")
    assert vote(sec_client, approval).status_code == 200
    assert status_of(approval) == Status.QUEUED
    approved = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    assert approved.payload["groups"] == [
        {"group": "oncall", "count": 1, "approvals": [one.username]},
        {"group": "security", "count": 1, "approvals": [sec.username]},
    ]
    assert {another.username, outsider.username}.isdisjoint(approved.payload["approvals"])


def test_a_person_in_both_groups_counts_towards_one_only() -> None:
    approval = ask(groups_agent(("oncall", 1), ("security", 1)), WRITE)
    both, both_client = reviewer("oncall", "security")
    assert vote(both_client, approval).status_code == 200
    assert status_of(approval) == Status.PENDING_APPROVAL
    again = vote(both_client, approval)
    assert again.status_code == 409 and "already approved" in again.content.decode()
    # An on-call member arrives: the first vote moves to security, the call is approved.
    oncall, oncall_client = reviewer("oncall")
    assert vote(oncall_client, approval).status_code == 200
    assert status_of(approval) == Status.QUEUED
    assert dict(Vote.objects.filter(approval=approval).values_list("voter_id", "group")) == {
        both.pk: "security",
        oncall.pk: "oncall",
    }


def test_the_vote_event_and_the_live_push_carry_the_progress_per_group() -> None:
    from approvals import live

    approval = ask(groups_agent(("oncall", 2), ("security", 1)), WRITE)
    one, one_client = reviewer("oncall")
    assert vote(one_client, approval).status_code == 200
    event = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="approval.vote")
    assert event.payload["groups"] == [
        {"group": "oncall", "count": 2, "approvals": [one.username]},
        {"group": "security", "count": 1, "approvals": []},
    ]
    rendered = live.render_progress(approval.pk)
    assert rendered is not None
    assert f"oncall 1 of 2: {one.username}; security 0 of 1" in rendered[0]


def test_a_deny_from_anyone_in_reach_still_ends_it() -> None:
    approval = ask(groups_agent(("oncall", 1), ("security", 1)), WRITE)
    _, client = reviewer()
    assert vote(client, approval, "deny").status_code == 200
    assert status_of(approval) == Status.DENIED


def test_the_single_group_form_still_works_beside_it() -> None:
    from tests.approvals.test_quorum import quorum_agent

    approval = ask(quorum_agent(approvals=1, group="oncall"), WRITE)
    assert approval.groups == [] and approval.group == "oncall"
    _, client = reviewer("oncall")
    assert vote(client, approval).status_code == 200
    assert status_of(approval) == Status.QUEUED


def test_step_up_is_kept_with_several_groups() -> None:
    approval = ask(groups_agent(("oncall", 1), ("security", 1), step_up=True), WRITE)
    assert approval.step_up == ["approve"] and approval.approvals_required == 2
    _, client = reviewer("oncall")
    unsigned = vote(client, approval)
    assert unsigned.status_code == 400 and "passkey" in unsigned.content.decode()


def test_the_assignment_is_a_maximum_matching() -> None:
    counts = {"a": 1, "b": 1}
    # x can serve a or b, y only a: both count, x moves to b.
    assert assign(counts, ["x", "y"], {"x": {"a", "b"}, "y": {"a"}}) == {"x": "b", "y": "a"}
    assert assign(counts, ["x", "y"], {"x": {"a"}, "y": {"a"}}) == {"x": "a"}
    assert assign({"a": 2}, ["x", "y", "z"], {"x": {"a"}, "y": {"a"}, "z": {"a"}}) == {
        "x": "a",
        "y": "a",
    }


def test_an_old_request_without_groups_reads_as_before() -> None:
    approval = ask(make_agent(mode="standard"), WRITE)
    assert ApprovalRequest.objects.get(pk=approval.pk).groups == []
    assert not approval.is_quorum and approval.progress() == ""

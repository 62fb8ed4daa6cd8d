"""Quorum rules of several layers combined: "1 of sre" (the organization's) beside "2
approvals" (the owner's or a team's) needs 1 of sre and 1 more from anyone, 2 in all.

Before, the extra approval was asked of sre too (2 of sre): stricter than either rule.
The attacks here check the places anyone may fill never make the requirement looser than
either rule: two outsiders never complete it, one person never fills two places, an sre
vote is never stuck in the anyone place (the assignment is a maximum matching), and
separation of duties and the teams' reach hold for the anyone place as for any other.
Every request is real: asked through the agent API, decided through the queue's POST.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client, override_settings

from approvals import live
from approvals.models import ANYONE, ApprovalRequest, Vote
from approvals.services import assign
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.policy import managed, profiles
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, reviewer, status_of, vote
from tests.support.factories import AgentFixture, make_agent

pytestmark = pytest.mark.django_db


def _org_asks(*entries: dict[str, Any]) -> None:
    for entry in entries:
        if entry.get("group"):
            Group.objects.get_or_create(name=entry["group"])
    managed.set_layer(team=None, document={"ask": list(entries)}, actor="org-admin", reason="x")


def _owner_asks(fx: AgentFixture, *entries: dict[str, Any]) -> None:
    for entry in entries:
        if entry.get("group"):
            Group.objects.get_or_create(name=entry["group"])
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=[], ask=list(entries), deny=[], actor="owner"
    )


def sre_and_two(who: str = "owner") -> ApprovalRequest:
    """The organization's "1 of sre" beside the owner's (or the team's) "2 approvals"."""
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    fx = make_agent(mode="standard")
    looser = {"rule": "write_file", "approvals": 2}
    if who == "owner":
        _owner_asks(fx, looser)
    else:
        managed.set_layer(team=fx.agent.team, document={"ask": [looser]}, actor="team-admin")
    return ask(fx, WRITE)


def queue_text(client: Client) -> str:
    return client.get("/approvals/").content.decode()


@pytest.mark.parametrize("who", ["owner", "team admin"])
def test_one_of_sre_beside_two_approvals_needs_one_of_sre_and_one_more_from_anyone(
    who: str,
) -> None:
    approval = sre_and_two(who)
    assert approval.approvals_required == 2 and approval.group == ""
    assert approval.groups == [{"group": "sre", "count": 1}] and approval.anyone == 1
    assert "1 of the group 'sre' and 1 more from any reviewer (2 approvals in all)" in (
        approval.reason
    )
    outsider, outsider_client = reviewer()
    first = vote(outsider_client, approval)
    assert first.status_code == 200
    said = f"1 of 2 approvals: {outsider.username}; 1 from sre still needed"
    assert said in first.content.decode()
    assert said in queue_text(outsider_client)
    pushed = live.render_progress(approval.pk)  # what every open queue gets live
    assert pushed is not None and said in pushed[0]
    assert status_of(approval) == "pending_approval"
    sre, sre_client = reviewer("sre")
    assert vote(sre_client, approval).status_code == 200
    assert status_of(approval) == "queued"
    # Each vote records the place it fills; the decision's event says who filled which.
    places = dict(Vote.objects.filter(approval=approval).values_list("voter_id", "group"))
    assert places == {outsider.pk: ANYONE, sre.pk: "sre"}
    approved = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.approved")
    assert approved.payload["groups"] == [{"group": "sre", "count": 1, "approvals": [sre.username]}]
    assert approved.payload["anyone"] == {"count": 1, "approvals": [outsider.username]}
    assert sorted(approved.payload["approvals"]) == sorted([outsider.username, sre.username])


def test_two_reviewers_outside_sre_never_complete_it() -> None:
    approval = sre_and_two()
    _, first = reviewer()
    _, second = reviewer()
    _, third = reviewer("security")  # in a group, but not one the quorum names
    assert vote(first, approval).status_code == 200
    for client in (second, third):
        refused = vote(client, approval)
        assert refused.status_code == 403, refused.content
        assert "you are in none of them" in refused.content.decode()
    assert status_of(approval) == "pending_approval"
    assert Vote.objects.filter(approval=approval).count() == 1


def test_one_sre_reviewer_voting_twice_counts_once() -> None:
    approval = sre_and_two()
    sre, client = reviewer("sre")
    assert vote(client, approval).status_code == 200
    again = vote(client, approval)
    assert again.status_code == 409 and "You already approved" in again.content.decode()
    assert status_of(approval) == "pending_approval"
    assert list(Vote.objects.filter(approval=approval).values_list("voter_id", "group")) == [
        (sre.pk, "sre")
    ]
    assert f"1 of 2 approvals: {sre.username} (sre); 1 more from any reviewer still needed" in (
        queue_text(client)
    )


@pytest.mark.parametrize("sre_first", [True, False], ids=["sre-first", "outsider-first"])
def test_an_sre_member_and_anyone_complete_it_in_either_order(sre_first: bool) -> None:
    approval = sre_and_two()
    sre, sre_client = reviewer("sre")
    outsider, outsider_client = reviewer()
    order = [sre_client, outsider_client] if sre_first else [outsider_client, sre_client]
    assert vote(order[0], approval).status_code == 200
    assert status_of(approval) == "pending_approval"
    assert vote(order[1], approval).status_code == 200
    assert status_of(approval) == "queued"
    places = dict(Vote.objects.filter(approval=approval).values_list("voter_id", "group"))
    assert places == {sre.pk: "sre", outsider.pk: ANYONE}


def test_two_sre_members_complete_it() -> None:
    """An sre member may fill the anyone place too: 2 approvals, at least 1 of sre."""
    approval = sre_and_two()
    _, one = reviewer("sre")
    _, two = reviewer("sre")
    assert vote(one, approval).status_code == 200
    assert vote(two, approval).status_code == 200
    assert status_of(approval) == "queued"


def test_the_assignment_moves_an_sre_vote_out_of_the_anyone_place_when_it_must() -> None:
    # x (sre) came first and sat in the anyone place: y, outside sre, still counts, as x
    # moves to sre's place (a maximum matching, whatever the order the places are tried).
    assert assign({"sre": 1}, ["x", "y"], {"x": {"sre"}}, anyone=1) == {"x": "sre", "y": ANYONE}
    assert assign({"sre": 1}, ["y", "x"], {"x": {"sre"}}, anyone=1) == {"y": ANYONE, "x": "sre"}
    # Two outsiders fill one anyone place, never sre's; one voter named twice counts once.
    assert assign({"sre": 1}, ["y", "z"], {}, anyone=1) == {"y": ANYONE}
    assert assign({"sre": 1}, ["x", "x"], {"x": {"sre"}}, anyone=1) == {"x": "sre"}


@pytest.mark.parametrize(
    ("org", "owner", "required", "groups"),
    [
        # The total is at least every rule's; each group's count at least every rule's.
        ({"approvals": 2, "group": "sre"}, {"approvals": 3}, 3, [{"group": "sre", "count": 2}]),
        ({"approvals": 3}, {"approvals": 1, "group": "sre"}, 3, [{"group": "sre", "count": 1}]),
        ({"approvals": 2, "group": "sre"}, {"approvals": 1}, 2, []),  # 2 of sre as before
        (
            {"approvals": 1, "group": "sre"},
            {"approvals": 1, "group": "security"},
            2,
            [{"group": "sre", "count": 1}, {"group": "security", "count": 1}],
        ),
    ],
    ids=["sre2-total3", "total3-sre1", "sre2-total1", "sre1-security1"],
)
def test_the_combination_is_never_looser_than_any_rule(
    org: dict[str, Any], owner: dict[str, Any], required: int, groups: list[Any]
) -> None:
    _org_asks({"rule": "write_file", **org})
    fx = make_agent(mode="standard")
    _owner_asks(fx, {"rule": "write_file", **owner})
    approval = ask(fx, WRITE)
    assert (approval.approvals_required, approval.groups) == (required, groups)
    if not groups:
        assert approval.group == "sre"


def test_sre_two_and_three_in_all_needs_both_sre_places_filled() -> None:
    _org_asks({"rule": "write_file", "approvals": 2, "group": "sre"})
    fx = make_agent(mode="standard")
    _owner_asks(fx, {"rule": "write_file", "approvals": 3})
    approval = ask(fx, WRITE)
    _, outsider = reviewer()
    _, sre_one = reviewer("sre")
    _, sre_two = reviewer("sre")
    _, sre_three = reviewer("sre")
    assert vote(sre_one, approval).status_code == 200
    assert vote(sre_two, approval).status_code == 200
    assert status_of(approval) == "pending_approval"  # 2 of 3: sre's places are filled
    assert vote(sre_three, approval).status_code == 200  # a third sre fills the anyone one
    assert status_of(approval) == "queued"
    # An outsider could have filled only the one anyone place (checked on a fresh ask).
    fresh = ask(fx, WRITE)
    assert vote(outsider, fresh).status_code == 200
    _, another_outsider = reviewer()
    assert vote(another_outsider, fresh).status_code == 403


@override_settings(HARNESS_FORBID_SELF_APPROVAL=True)
def test_the_agents_owner_never_fills_the_anyone_place() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    fx = make_agent(mode="standard")
    _owner_asks(fx, {"rule": "write_file", "approvals": 2})
    approval = ask(fx, WRITE)
    fx.owner.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    owner = Client()
    owner.force_login(fx.owner)
    refused = vote(owner, approval)
    assert refused.status_code == 403 and "this agent&#x27;s owner" in refused.content.decode()
    assert not Vote.objects.filter(approval=approval).exists()


@override_settings(HARNESS_FORBID_SELF_APPROVAL=True)
def test_an_anyone_vote_of_someone_the_agent_was_handed_to_is_discarded() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    fx = make_agent(mode="standard")
    _owner_asks(fx, {"rule": "write_file", "approvals": 2})
    approval = ask(fx, WRITE)
    outsider, outsider_client = reviewer()
    assert vote(outsider_client, approval).status_code == 200
    agents.hand_over_agent(agent=fx.agent, to=outsider, actor="test")
    _, sre_client = reviewer("sre")
    answer = vote(sre_client, approval)
    assert answer.status_code == 200
    assert status_of(approval) == "pending_approval"  # the anyone place is open again
    discarded = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.vote_discarded"
    )
    assert discarded.payload["reviewer"] == outsider.username
    assert discarded.payload["reason"] == "they are now this agent's owner"
    _, another = reviewer()
    assert vote(another, approval).status_code == 200
    assert status_of(approval) == "queued"


def test_a_reviewer_of_another_team_never_fills_the_anyone_place() -> None:
    from teams.services import add_member, create_team
    from tests.support.factories import make_user, unique

    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    pay, infra = (
        create_team(name=unique("pay"), actor="t"),
        create_team(name=unique("infra"), actor="t"),
    )
    owner = make_user(unique("owner"), mode="standard")
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t", team=pay)
    fx = AgentFixture(agent, token, owner)
    _owner_asks(fx, {"rule": "write_file", "approvals": 2})
    approval = ask(fx, WRITE)
    stranger = make_user(unique("infra-rev"))
    add_member(team=infra, user=stranger, role="reviewer", actor="t")
    client = Client()
    client.force_login(stranger)
    refused = vote(client, approval)
    assert refused.status_code == 403 and "another team's agent" in refused.content.decode()
    assert not Vote.objects.filter(approval=approval).exists()
    # A reviewer of the agent's own team does fill it.
    member = make_user(unique("pay-rev"))
    add_member(team=pay, user=member, role="reviewer", actor="t")
    client.force_login(member)
    assert vote(client, approval).status_code == 200
    assert list(Vote.objects.filter(approval=approval).values_list("group", flat=True)) == [ANYONE]


def test_an_sre_voter_who_leaves_sre_still_fills_the_anyone_place() -> None:
    approval = sre_and_two()
    leaver, leaver_client = reviewer("sre")
    assert vote(leaver_client, approval).status_code == 200
    leaver.groups.remove(Group.objects.get(name="sre"))
    _, outsider = reviewer()
    refused = vote(outsider, approval)  # the anyone place is the leaver's now
    assert refused.status_code == 403
    assert status_of(approval) == "pending_approval"
    _, sre_client = reviewer("sre")
    assert vote(sre_client, approval).status_code == 200
    assert status_of(approval) == "queued"
    assert Vote.objects.get(approval=approval, voter=leaver).group == ANYONE

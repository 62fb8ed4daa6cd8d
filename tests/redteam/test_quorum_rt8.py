"""Red team (rt8) of the quorum's places anyone may fill ("1 of sre" beside "2 approvals")
and of who is told of a quorum.

Held (kept as regressions, every request real, the races on real threads): two outsiders
racing for the one anyone place never both count; one person's queue POST racing their
own one-tap link counts once; three layers with three different requirements (the
organization's 1 of sre, the team's 1 of dba, the owner's 3 in all) need all three; a
one-tap link of a reviewer outside sre fills the anyone place only, never sre's.

Fixed:
- A quorum whose groups had no member who may decide it was told to no one (the routing
  asked only people whose approval would fill an open place, and there were none), and
  its escalation to the organization's reviewers none of them either: it waited unseen
  until it expired. Now, when no one of the tier could fill a place, all of it is told
  (they may deny it, or see that the group gets members).
- An ask that no one could complete (2 of sre with one sre member who may decide it, 3
  approvals with two reviewers) said nothing of it: it waited until it expired, or for
  ever with HARNESS_EXPIRY_ACTION keep. Its reason now says so, and why.
- A reviewer who had voted on a quorum naming no group was asked again by every later
  notification (docs/notifications.md says a voter is not asked again).
- An escalation's webhook (`approval.escalated`) carried no links, only an `outcome` of
  a call still pending (docs/teams.md says it carries the next tier's links).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client, override_settings

from approvals import links
from approvals import services as approvals
from approvals.models import ApprovalRequest, Delivery, Vote
from approvals.notifications import services as notifications
from dispatcher import agents
from dispatcher.policy import managed
from teams.services import add_member, create_team, set_escalation
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, reviewer, status_of, vote
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, channel
from tests.redteam.test_quorum_anyone import _org_asks, _owner_asks, sre_and_two
from tests.support.factories import AgentFixture, make_agent, make_user, unique


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]


def race(*actions: Callable[[], Any]) -> list[Any]:
    """Run `actions` at once, each in its own thread (its own database connection)."""
    barrier = threading.Barrier(len(actions))
    results: list[Any] = [None] * len(actions)

    def run(i: int, action: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = action()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def told(approval: ApprovalRequest, event: str = Delivery.Event.ASKED) -> list[str]:
    """Who a real webhook channel's message asks (its links' reviewers), as sent."""
    with receivers.webhook_receiver(SECRET) as server:
        hook = channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        ids = notifications.plan_ask(approval.pk, event=event)
        for delivery_id in ids:
            notifications.deliver(delivery_id)
        body = server.wait_for(1)[0].json()
    hook.enabled = False  # (its receiver is gone: a later call of this sends on a new one)
    hook.save()
    assert body["event"] == f"approval.{event}"
    return sorted(link["reviewer"] for link in body["links"])


def team_agent(team: Any) -> AgentFixture:
    owner = make_user(unique("owner"), mode="standard")
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t", team=team)
    return AgentFixture(agent, token, owner)


def team_reviewer(team: Any, *groups: str) -> User:
    user = make_user(unique("team-rev"))
    add_member(team=team, user=user, role="reviewer", actor="t")
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


# --- Held: races on PostgreSQL, three layers ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_outsiders_racing_for_the_one_anyone_place_never_both_count() -> None:
    approval = sre_and_two()
    _, one = reviewer()
    _, two = reviewer()
    answers = race(lambda: vote(one, approval).status_code, lambda: vote(two, approval).status_code)
    assert sorted(answers) == [200, 403]
    assert Vote.objects.filter(approval=approval).count() == 1
    assert status_of(approval) == "pending_approval"


@pytest.mark.django_db(transaction=True)
def test_a_queue_vote_racing_the_same_persons_link_counts_once() -> None:
    approval = sre_and_two()
    person, queue = reviewer("sre")
    token = links.make_url(approval, person, "approve").rstrip("/").rsplit("/", 1)[-1]

    def by_link() -> int:
        client = Client()
        client.force_login(person)
        path = f"/approvals/links/{token}/"
        return int(client.post(path, {"digest": approval.call.digest}).status_code)

    answers = race(lambda: vote(queue, approval).status_code, by_link)
    assert 200 in answers and set(answers) <= {200, 409}, answers
    assert Vote.objects.filter(approval=approval).count() == 1
    assert status_of(approval) == "pending_approval"


@pytest.mark.django_db
def test_three_layers_three_requirements_all_hold() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    fx = make_agent(mode="standard")
    Group.objects.get_or_create(name="dba")
    dba = {"rule": "write_file", "approvals": 1, "group": "dba"}
    managed.set_layer(team=fx.agent.team, document={"ask": [dba]}, actor="t")
    _owner_asks(fx, {"rule": "write_file", "approvals": 3})
    approval = ask(fx, WRITE)
    assert approval.groups == [{"group": "sre", "count": 1}, {"group": "dba", "count": 1}]
    assert (approval.approvals_required, approval.anyone) == (3, 1)
    _, both = reviewer("sre", "dba")  # one person, one place
    _, outsider = reviewer()
    _, another = reviewer()
    assert vote(both, approval).status_code == 200
    assert vote(outsider, approval).status_code == 200
    assert vote(another, approval).status_code == 403
    assert status_of(approval) == "pending_approval"
    _, dba_member = reviewer("dba")
    assert vote(dba_member, approval).status_code == 200
    assert status_of(approval) == "queued"


@pytest.mark.django_db
def test_a_link_never_lets_a_non_member_fill_the_groups_place() -> None:
    approval = sre_and_two()
    first, second, member = reviewer()[0], reviewer()[0], reviewer("sre")[0]

    def use(person: User) -> Any:
        token = links.make_url(approval, person, "approve").rstrip("/").rsplit("/", 1)[-1]
        client = Client()
        client.force_login(person)
        return client.post(f"/approvals/links/{token}/", {"digest": approval.call.digest})

    assert use(first).status_code == 200  # the anyone place
    refused = use(second)
    assert refused.status_code == 403 and "you are in none of them" in refused.content.decode()
    assert status_of(approval) == "pending_approval"
    assert use(member).status_code == 200
    assert status_of(approval) == "queued"
    places = dict(Vote.objects.filter(approval=approval).values_list("voter_id", "group"))
    assert places == {first.pk: "*", member.pk: "sre"}


# --- Fixed: who is told ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_group_quorum_no_member_of_which_may_decide_is_still_told_to_the_reviewers() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    pay, infra = (
        create_team(name=unique("pay"), actor="t"),
        create_team(name=unique("in"), actor="t"),
    )
    fx = team_agent(pay)
    team_reviewer(infra, "sre")  # sre's only member reviews another team
    mine = team_reviewer(pay)
    approval = ask(fx, WRITE)
    assert approval.group == "sre"
    assert told(approval) == [mine.username]  # before: [] (told to no one)
    # Once sre has a member who may decide it, only they are asked.
    member = team_reviewer(pay, "sre")
    assert told(approval) == [member.username]


@pytest.mark.django_db
def test_its_escalation_to_the_organizations_reviewers_is_told_to_them() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    pay = create_team(name=unique("pay"), actor="t")
    fx = team_agent(pay)
    team_reviewer(pay, "sre")  # may approve it, but did not in time
    org, _ = reviewer()  # the organization's reviewer, in no group
    approval = ask(fx, WRITE)
    set_escalation(team=pay, after=30, to=None, actor="t")
    assert approvals.escalate_due(approval.created_at + timedelta(seconds=31)) == [approval.pk]
    approval.refresh_from_db()
    assert told(approval, Delivery.Event.ESCALATED) == [org.username]  # before: []


@pytest.mark.django_db
def test_an_escalations_webhook_carries_the_next_tiers_links_and_they_decide() -> None:
    """docs/teams.md: "a webhook receives approval.escalated with those links". It had
    none (an `outcome` of a call still pending instead): the next tier's people got no
    link through a webhook."""
    pay, sec = (
        create_team(name=unique("pay"), actor="t"),
        create_team(name=unique("sec"), actor="t"),
    )
    fx = team_agent(pay)
    team_reviewer(pay)
    next_tier = team_reviewer(sec)
    approval = ask(fx, WRITE)  # one approval, from anyone who may decide it
    set_escalation(team=pay, after=30, to=sec, actor="t")
    assert approvals.escalate_due(approval.created_at + timedelta(seconds=31)) == [approval.pk]
    with receivers.webhook_receiver(SECRET) as server:
        channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        for delivery_id in notifications.plan_ask(approval.pk, event=Delivery.Event.ESCALATED):
            notifications.deliver(delivery_id)
        body = server.wait_for(1)[0].json()
    assert body["event"] == "approval.escalated" and "outcome" not in body
    [link] = body["links"]
    assert link["reviewer"] == next_tier.username
    path = link["approve"][link["approve"].index("/approvals/links/") :]
    client = Client()
    client.force_login(next_tier)
    done = client.post(path, {"digest": approval.call.digest})
    assert done.status_code == 200 and "Approved" in done.content.decode()
    assert status_of(approval) == "queued"


@pytest.mark.django_db
def test_a_voter_of_a_quorum_naming_no_group_is_not_asked_again() -> None:
    fx = make_agent(mode="standard")
    _owner_asks(fx, {"rule": "write_file", "approvals": 2})
    approval = ask(fx, WRITE)
    voter, client = reviewer()
    other, _ = reviewer()
    assert vote(client, approval).status_code == 200
    assert told(approval) == [other.username]  # before: both, the voter again


# --- Fixed: an ask no one can complete says so -----------------------------------------


@pytest.mark.django_db
def test_two_of_sre_with_one_sre_member_says_no_one_can_approve_it() -> None:
    _org_asks({"rule": "write_file", "approvals": 2, "group": "sre"})
    reviewer("sre")
    _, outsider = reviewer()
    approval = ask(make_agent(mode="standard"), WRITE)
    assert "No one can approve it as things stand" in approval.reason
    assert "the group 'sre' has 1 (it needs 2)" in approval.reason
    page = outsider.get(f"/approvals/{approval.pk}/").content.decode()
    assert "No one can approve it as things stand" in page
    # With a second member it can complete: nothing is said.
    reviewer("sre")
    fresh = ask(make_agent(mode="standard"), WRITE)
    assert "No one can approve" not in fresh.reason


@override_settings(HARNESS_FORBID_SELF_APPROVAL=True)
@pytest.mark.django_db
def test_more_approvals_than_people_who_may_decide_says_so() -> None:
    pay = create_team(name=unique("pay"), actor="t")
    fx = team_agent(pay)
    _owner_asks(fx, {"rule": "write_file", "approvals": 3})
    team_reviewer(pay)
    team_reviewer(pay)
    fx.owner.groups.add(Group.objects.get_or_create(name="reviewer")[0])  # behind the agent
    approval = ask(fx, WRITE)
    assert "No one can approve it as things stand: 2 reviewers may decide it" in approval.reason
    assert "the 3 distinct approvals it needs" in approval.reason
    # The combined "1 of sre" and "2 approvals" with no sre member who may decide it.
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    mixed = ask(fx, WRITE, call_id="w2")
    assert mixed.anyone == 2
    assert "the group 'sre' has 0 (it needs 1)" in mixed.reason

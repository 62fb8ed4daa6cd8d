"""A quorum told to everyone because no member of its group may decide it (the fallback
of approvals.notifications.services.recipients) sends no one-tap link to people whose
approval cannot count (red team finding; docs/notifications.md).

Before, every reviewer of the tier got an Approve link that was refused (403, "you are
not in it") when used, and a Deny link beside it. Now such a person's message (email,
push, webhook, Slack) carries the call's page and why they cannot approve it; a member of
the group whose approval counts still gets their links. Every message goes through a real
channel: an SMTP server, a webhook receiver and a fake Slack API on loopback.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals import links
from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.policy import managed
from teams.services import add_member, create_team
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, channel, send_all
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

WRITE = {"path": "prod.tf", "content": "apply"}
LINK = "/approvals/links/"
CANNOT = "You cannot approve this call"


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]  # (as tests/notifications/conftest.py)


def team_reviewer(team: Any, *groups: str) -> User:
    user = make_user(unique("rev"))
    user.email = f"{user.username}@example.test"
    user.save()
    add_member(team=team, user=user, role="reviewer", actor="t")
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user


def one_of_sre() -> tuple[Any, AgentFixture]:
    """The organization's "1 of sre", and an agent of a team none of whose reviewers is in
    sre (sre's only member reviews another team): no one of the tier may approve it."""
    Group.objects.get_or_create(name="sre")
    rule = {"rule": "write_file", "approvals": 1, "group": "sre"}
    managed.set_layer(team=None, document={"ask": [rule]}, actor="org-admin", reason="x")
    pay, infra = (
        create_team(name=unique("pay"), actor="t"),
        create_team(name=unique("in"), actor="t"),
    )
    team_reviewer(infra, "sre")
    owner = make_user(unique("owner"), mode="standard")
    agent, token = agents.create_agent(owner=owner, name=unique("agent"), actor="t", team=pay)
    return pay, AgentFixture(agent, token, owner)


def body_of(mailbox: Any, address: str) -> str:
    [message] = [m for m in mailbox.messages if m["To"] == address]
    payload: Any = message.get_payload(decode=True)
    return str(payload.decode())


def emails(approval: ApprovalRequest, *people: User) -> dict[str, str]:
    with receivers.smtp_server() as mailbox, receivers.mailers_for(mailbox):
        email = channel("email", {"addresses": []})
        email.users.add(*people)
        send_all(approval)
    email.enabled = False
    email.save()
    return {p.username: body_of(mailbox, p.email) for p in people}


def test_a_non_member_told_by_the_fallback_gets_no_one_tap_link() -> None:
    pay, fx = one_of_sre()
    outsider = team_reviewer(pay)
    approval = ask(fx, WRITE)
    assert approval.group == "sre" and "No one can approve it" in approval.reason
    theirs = emails(approval, outsider)[outsider.username]
    assert LINK not in theirs and "Approve:" not in theirs and "Deny:" not in theirs  # before: both
    assert f"Open the call: http://localhost:8000/approvals/{approval.pk}/" in theirs
    assert CANNOT in theirs and "1 from the group 'sre'" in theirs
    # What the link would have done: refused.
    token = links.make_url(approval, outsider, "approve").rstrip("/").rsplit("/", 1)[-1]
    client = Client()
    client.force_login(outsider)
    used = client.post(f"{LINK}{token}/", {"digest": approval.call.digest})
    assert used.status_code == 403 and "you are not in it" in used.content.decode()


def test_a_member_who_may_approve_still_gets_the_links() -> None:
    pay, fx = one_of_sre()
    approval = ask(fx, WRITE)
    member = team_reviewer(pay, "sre")  # sre now has a member who may decide it
    mine = emails(approval, member)[member.username]
    assert f"Approve: http://localhost:8000{LINK}" in mine and "Deny: " in mine
    assert CANNOT not in mine
    token = mine.split(f"Approve: http://localhost:8000{LINK}")[1].split("/")[0]
    client = Client()
    client.force_login(member)
    done = client.post(f"{LINK}{token}/", {"digest": approval.call.digest})
    assert done.status_code == 200 and "Approved" in done.content.decode()


def test_webhook_and_slack_carry_no_one_tap_link_for_non_members() -> None:
    pay, fx = one_of_sre()
    outsider = team_reviewer(pay)
    with receivers.webhook_receiver(SECRET) as server, receivers.fake_slack() as slack:
        channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        channel(
            "slack",
            {"bot_token": "xoxb-test-token", "channel": "C123", "api_url": slack.url + "/api/"},
        )
        approval = ask(fx, WRITE)
        send_all(approval)
        body = server.wait_for(1)[0].json()
        form = receivers.slack_form(slack.wait_for(1)[0])
    [link] = [link for link in body["links"] if link["reviewer"] == outsider.username]
    assert "approve" not in link and "deny" not in link and LINK not in json.dumps(link)
    assert link["open"].endswith(f"/approvals/{approval.pk}/")
    assert link["cannot_approve"].startswith(CANNOT)
    buttons = [b for b in form["blocks"] if b["type"] == "actions"][0]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Open"]
    assert f"{outsider.username}: {CANNOT}" in json.dumps(form["blocks"])

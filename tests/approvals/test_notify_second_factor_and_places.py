"""What the notifications send, through the real channels (receivers on loopback, a real
SMTP server, an encrypted push):

- A person whom HARNESS_MFA_REQUIRED names and who has no second factor yet gets no
  one-tap approve or deny link (it would be refused: approval.second_factor_missing);
  their message keeps the call's page and says to set up a second factor first, with the
  set-up page. A person with a factor still gets their links.
- A quorum that names groups asks the people whose approval would fill one of its open
  places: the group's members for a group's places, every eligible reviewer while a
  place anyone may fill is open ("1 of sre" beside "2 approvals").
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client, override_settings

from approvals.models import ApprovalRequest, Delivery, PushSubscription
from approvals.notifications.services import reviewers
from audit.roles import lacks_required_factor
from dispatcher.policy import managed, profiles
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, _subscription_keys, channel, send_all
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db

WRITE = {"path": "prod.tf", "content": "apply"}
LINK = "/approvals/links/"
SETUP = "/accounts/second-factor/"


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]  # (as tests/notifications/conftest.py)


def person(prefix: str, *groups: str, factor: bool = False) -> User:
    user = make_user(unique(prefix), groups=("reviewer",))
    user.email = f"{user.username}@example.test"
    user.save()
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    if factor:
        SoftPasskey().register(user)
    return user


def body_of(mailbox: Any, address: str) -> str:
    [message] = [m for m in mailbox.messages if m["To"] == address]
    return str(message.get_payload(decode=True).decode())


@override_settings(HARNESS_MFA_REQUIRED="reviewers")
def test_an_email_to_a_reviewer_without_a_required_factor_has_no_one_tap_links(
    agent: AgentFixture,
) -> None:
    ready, unready = person("ready", factor=True), person("unready")
    assert lacks_required_factor(unready) and not lacks_required_factor(ready)
    with receivers.smtp_server() as mailbox, receivers.mailers_for(mailbox):
        channel("email", {"addresses": []}).users.add(ready, unready)
        approval = ask(agent, WRITE)
        deliveries = send_all(approval)
    assert {d.state for d in deliveries} == {Delivery.State.SENT}
    page = f"/approvals/{approval.pk}/"
    theirs = body_of(mailbox, unready.email)
    assert LINK not in theirs and "Approve:" not in theirs and "Deny:" not in theirs
    assert f"Open the call: http://localhost:8000{page}" in theirs
    assert "You must set up a second factor" in theirs
    assert f"http://localhost:8000{SETUP}" in theirs
    mine = body_of(mailbox, ready.email)
    assert f"Approve: http://localhost:8000{LINK}" in mine and "Deny: " in mine
    assert "second factor" not in mine


@override_settings(HARNESS_MFA_REQUIRED="reviewers")
def test_webhook_and_slack_carry_links_only_for_reviewers_who_can_use_them(
    agent: AgentFixture,
) -> None:
    ready, unready = person("ready", factor=True), person("unready")
    with receivers.webhook_receiver(SECRET) as server, receivers.fake_slack() as slack:
        hook = channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        bot = channel(
            "slack",
            {"bot_token": "xoxb-test-token", "channel": "C123", "api_url": slack.url + "/api/"},
        )
        for configured in (hook, bot):
            configured.users.add(ready, unready)
        approval = ask(agent, WRITE)
        send_all(approval)
        body = server.wait_for(1)[0].json()
        form = receivers.slack_form(slack.wait_for(1)[0])
    by_reviewer = {link["reviewer"]: link for link in body["links"]}
    assert set(by_reviewer) == {ready.username, unready.username}
    assert LINK in by_reviewer[ready.username]["approve"]
    assert LINK in by_reviewer[ready.username]["deny"]
    theirs = by_reviewer[unready.username]
    assert "approve" not in theirs and "deny" not in theirs and LINK not in json.dumps(theirs)
    assert theirs["open"].endswith(f"/approvals/{approval.pk}/")
    assert theirs["second_factor_setup"].endswith(SETUP)
    buttons = [b for b in form["blocks"] if b["type"] == "actions"][0]["elements"]
    named = [b["text"]["text"] for b in buttons]
    assert f"Approve ({ready.username})" in named and f"Deny ({ready.username})" in named
    assert not any(unready.username in text for text in named)
    said = json.dumps(form["blocks"])
    assert f"{unready.username}: You must set up a second factor" in said and SETUP in said


@override_settings(HARNESS_MFA_REQUIRED="reviewers")
def test_a_push_to_a_reviewer_without_a_required_factor_has_no_one_tap_links(
    agent: AgentFixture,
) -> None:
    import http_ece
    from py_vapid import Vapid, b64urlencode

    vapid = Vapid()
    vapid.generate_keys()
    raw = vapid.private_key.private_numbers().private_value.to_bytes(32, "big")
    payloads: dict[str, Any] = {}
    with (
        receivers.push_service() as push,
        override_settings(HARNESS_VAPID_PRIVATE_KEY=b64urlencode(raw)),
    ):
        keys_of: dict[str, Any] = {}
        for user in (person("ready", factor=True), person("unready")):
            (private, auth), keys = _subscription_keys()
            PushSubscription.objects.create(
                user=user, endpoint=f"{push.url}/push/{user.username}", keys=keys
            )
            keys_of[user.username] = (private, auth)
        channel("webpush", {})
        approval = ask(agent, WRITE)
        send_all(approval)
        for posted in push.wait_for(2):
            name = posted.path.rsplit("/", 1)[1]
            private, auth = keys_of[name]
            plain = http_ece.decrypt(
                posted.body, private_key=private, auth_secret=auth, version="aes128gcm"
            )
            payloads[name.split("-")[0]] = json.loads(plain)
    assert LINK in payloads["ready"]["approve"] and LINK in payloads["ready"]["deny"]
    theirs = payloads["unready"]
    assert "approve" not in theirs and "deny" not in theirs and LINK not in json.dumps(theirs)
    assert theirs["url"].endswith(f"/approvals/{approval.pk}/")
    assert theirs["setup"].endswith(SETUP)
    assert theirs["body"].startswith("You must set up a second factor")


# --- Who a quorum asks ----------------------------------------------------------------


def _org_asks(entry: dict[str, Any]) -> None:
    Group.objects.get_or_create(name="sre")
    managed.set_layer(team=None, document={"ask": [entry]}, actor="org-admin", reason="x")


def _asked(approval: ApprovalRequest) -> list[str]:
    with receivers.webhook_receiver(SECRET) as server:
        channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        send_all(approval)
        body = server.wait_for(1)[0].json()
    return sorted(link["reviewer"] for link in body["links"])


def test_a_group_quorum_asks_the_groups_members_and_an_anyone_place_asks_every_reviewer() -> None:
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    sre, outsider = person("sre", "sre"), person("out")
    everyone = sorted(u.username for u in reviewers(make_agent().agent.team_id))
    assert {sre.username, outsider.username} <= set(everyone)
    # The organization's "1 of sre" alone: only sre's members can approve it.
    only_sre = ask(make_agent(mode="standard"), WRITE)
    assert only_sre.group == "sre"
    assert _asked(only_sre) == [sre.username]
    # Beside an owner's "2 approvals": the anyone place is open to every reviewer.
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="owner",
    )
    mixed = ask(fx, WRITE, call_id="w2")
    assert mixed.anyone == 1
    assert _asked(mixed) == everyone


def test_once_the_anyone_place_is_filled_only_the_groups_members_are_asked() -> None:
    """An escalation (or any later plan) asks whoever's approval would still count: with
    the anyone place filled by an outsider, only sre's members, not the voter again."""
    _org_asks({"rule": "write_file", "approvals": 1, "group": "sre"})
    sre, outsider = person("sre", "sre"), person("out")
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="owner",
    )
    approval = ask(fx, WRITE)
    client = Client()
    client.force_login(outsider)
    voted = client.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest},
        headers={"HX-Request": "true"},
    )
    assert voted.status_code == 200
    assert _asked(approval) == [sre.username]

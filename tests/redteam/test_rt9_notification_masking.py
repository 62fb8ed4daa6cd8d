"""A notification through a channel outside Harness (email, Slack, push) shows a call's
secrets masked, as the audit log does (found by the rt9 red team: the arguments went out
exactly, a password in them to a mail system or Slack's workspace). The call's page
shows the exact bytes to a signed-in reviewer, and a webhook, the operator's own
receiver, still gets them (its digest is of them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from approvals.models import Delivery
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, channel, send_all
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

PASSWORD = "Xk92-hunter2-correct-horse"  # noqa: S105
ARGUMENTS = {"path": "db.env", "content": f"DB_USER=app\nDB_PASSWORD={PASSWORD}\n"}


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]  # (as tests/notifications/conftest.py)


def test_email_and_slack_show_the_calls_secrets_masked_and_a_webhook_gets_them_exact(
    agent: AgentFixture,
) -> None:
    reviewer = make_user(unique("rev"), groups=("reviewer",))
    reviewer.email = f"{reviewer.username}@example.test"
    reviewer.save()
    with (
        receivers.smtp_server() as mailbox,
        receivers.webhook_receiver(SECRET) as server,
        receivers.fake_slack() as slack,
    ):
        with receivers.mailers_for(mailbox):
            channel("email", {"addresses": []}).users.add(reviewer)
            channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
            channel(
                "slack",
                {"bot_token": "xoxb-test-token", "channel": "C123", "api_url": slack.url + "/api/"},
            )
            approval = ask(agent, ARGUMENTS)
            deliveries = send_all(approval)
        hook = server.wait_for(1)[0].json()
        form = receivers.slack_form(slack.wait_for(1)[0])
    assert {d.state for d in deliveries} == {Delivery.State.SENT}
    [mail] = mailbox.messages
    email = str(mail.get_payload(decode=True).decode())
    assert "DB_PASSWORD=" in email and "[masked:" in email
    assert PASSWORD not in email
    said = json.dumps(form)
    assert "DB_PASSWORD=" in said and "[masked:" in said
    assert PASSWORD not in said
    assert hook["call"]["arguments"] == approval.call.raw_arguments
    assert PASSWORD in hook["call"]["arguments"]

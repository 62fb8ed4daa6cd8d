"""rt11: a command's argv in email, Slack and push is masked element by element.

The notification text of a command is its argv as JSON (`["bash", "-c", "..."]`), and
2806b4a masked that text as text: a script's line breaks are `\\n` escapes there, so
`\\nDB_PASSWORD=...` read as one word and a heredoc's password went to the mail system,
Slack's workspace and the push service exactly (the rt9 bug, in the command's
presentation instead of the raw arguments)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from approvals.models import Delivery
from approvals.notifications import messages
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.notifications.test_channels import channel, send_all
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

PASSWORD = "rt11-heredoc-horse-4417"  # noqa: S105
SCRIPT = f"cat > .env <<EOF\nDB_USER=app\nDB_PASSWORD={PASSWORD}\nEOF\n"


@pytest.fixture(autouse=True)
def loopback_receivers_allowed(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]


def test_a_commands_heredoc_password_is_masked_in_email_slack_and_push(
    agent: AgentFixture,
) -> None:
    reviewer = make_user(unique("rev"), groups=("reviewer",))
    reviewer.email = f"{reviewer.username}@example.test"
    reviewer.save()
    with receivers.smtp_server() as mailbox, receivers.fake_slack() as slack:
        with receivers.mailers_for(mailbox):
            channel("email", {"addresses": []}).users.add(reviewer)
            channel(
                "slack",
                {"bot_token": "xoxb-test-token", "channel": "C123", "api_url": slack.url + "/api/"},
            )
            approval = ask(agent, {"argv": ["bash", "-c", SCRIPT]}, name="run_command")
            deliveries = send_all(approval)
        form = receivers.slack_form(slack.wait_for(1)[0])
    assert (approval.presentation or {}).get("kind") == "command", approval.presentation
    assert {d.state for d in deliveries} == {Delivery.State.SENT}
    [mail] = mailbox.messages
    email = str(mail.get_payload(decode=True).decode())
    assert "DB_PASSWORD=" in email and "[masked:" in email
    assert PASSWORD not in email
    said = json.dumps(form)
    assert "DB_PASSWORD=" in said and PASSWORD not in said
    push = messages.push_payload(approval, {"approve": "a", "deny": "d"})
    assert PASSWORD not in push

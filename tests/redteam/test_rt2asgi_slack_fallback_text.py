"""rt2asgi: a Slack message's top-level `text` (what Slack shows in its notifications, and
in place of the blocks where they cannot be shown) was the ask's summary as it came:
"<agent> asks to run <tool>. <effect>", whose agent name a client may choose and whose
effect may hold the agent's own arguments. Slack reads that text as mrkdwn: `<!channel>`
in an OAuth client's registered name notified everyone in the reviewers' channel, and
`<https://evil.example|Approve>` showed a link of the agent's choosing. The blocks were
escaped (slack_escape); the text now is too."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from approvals.models import Channel
from approvals.notifications import senders
from approvals.notifications import services as notifications
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db

HOSTILE = "<!channel> <https://evil.example|Approve> &amp;"


def test_the_slack_fallback_text_mentions_no_one_and_links_nowhere(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]  # (the receiver listens on loopback)
    make_user(unique("reviewer"), groups=("reviewer",))
    agent = make_agent(mode="standard")
    with receivers.fake_slack() as slack:
        Channel.objects.create(
            name=unique("slack"), kind="slack", config={"webhook_url": slack.url + "/services/hook"}
        )
        # (the name an OAuth client registers: agentauth.services.client_name)
        type(agent.agent).objects.filter(pk=agent.agent.pk).update(name=HOSTILE)
        approval = ask(agent, {"path": "a.txt", "content": "x"})
        for delivery_id in notifications.plan_ask(approval.pk):
            with contextlib.suppress(senders.DeliveryFailed):
                notifications.deliver(delivery_id)
        text = slack.wait_for(1)[0].json()["text"]
    assert "asks to run write_file" in text
    assert "<" not in text and ">" not in text, text
    assert "&lt;!channel&gt;" in text and "&amp;amp;" in text

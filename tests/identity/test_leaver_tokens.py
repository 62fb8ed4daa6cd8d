"""A leaver keeps no agent token they were shown (red team finding; docs/identity.md,
"Leaving: deactivation").

`Agent.token_holders` lists the people a bearer token was shown to (who created the agent
or rotated its token in the dashboard). Before, deactivating such a person left every
such token working: whoever left with a copy could still act as the agent. Now the
deactivation voids each of those tokens (agent.token_voided, naming the leaver); the
agent answers 401 saying why on the API, MCP and the hooks; its owner is told and its
page says so; a rotation issues a working token (the leaver stays listed as a holder:
separation of duties still counts them behind the calls made with their copy).
An agent whose holders do not include the leaver keeps working.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit import roles
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Agent
from floor.errors import ServiceError
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, channel
from tests.support.claude_code_hooks import HOOK_URL, hook_input
from tests.support.factories import make_user, unique
from tests.support.live import LiveStack
from tests.support.mcp_requests import initialize

VOIDED = "This agent token was voided"


def people() -> tuple[User, User, User]:
    """An org admin who is shown tokens and will leave, another who stays, and an owner
    (an org admin too, so that they may rotate their agent's token themselves)."""
    leaver = make_user(unique("ada"), groups=("admin",))
    stays = make_user(unique("bea"), groups=("admin",))
    owner = make_user(unique("olga"), groups=("admin",), mode="standard")
    return leaver, stays, owner


def agent_shown_to(owner: User, person: User) -> tuple[Agent, str]:
    return agents.create_agent(owner=owner, name=unique("agent"), actor="t", shown_to=person)


# --- Over real HTTP: daphne, its API, MCP and hook endpoints ------------------------------


@pytest.mark.live
def test_a_token_shown_to_a_leaver_is_refused_everywhere_until_rotated(
    live_stack: LiveStack, live_db: None
) -> None:
    leaver, stays, owner = people()
    shown, token = agent_shown_to(owner, leaver)
    kept, kept_token = agent_shown_to(owner, stays)

    def api(secret: str) -> httpx.Response:
        return httpx.get(live_stack.url + "/api/v1/tools", headers=bearer(secret), timeout=30)

    def mcp(secret: str) -> httpx.Response:
        headers = {**bearer(secret), "Accept": "application/json, text/event-stream"}
        body = initialize("probe", run=unique("run"))
        return httpx.post(live_stack.url + "/mcp/", json=body, headers=headers, timeout=30)

    def hook(secret: str) -> httpx.Response:
        body = hook_input("Stop", str(uuid.uuid4()))
        url = live_stack.url + HOOK_URL + "?wait=0"
        return httpx.post(url, json=body, headers=bearer(secret), timeout=30)

    for way in (api, mcp, hook):
        assert way(token).status_code == 200, way.__name__
    assert roles.deactivate(user=leaver, actor="user:root")
    for way in (api, mcp, hook):
        refused = way(token)
        assert refused.status_code == 401, way.__name__  # before: 200
        message = refused.json()["error"]["message"]
        assert VOIDED in message and f"because {leaver.username}" in message, message
        assert "rotate" in message
        assert way(kept_token).status_code == 200, way.__name__  # not the leaver's: works
    new = agents.rotate_token(agent=shown, actor=f"user:{owner.username}", shown_to=owner)
    for way in (api, mcp, hook):
        assert way(new).status_code == 200, way.__name__
        old = way(token)
        assert old.status_code == 401 and VOIDED not in old.text  # an old token, nothing more
    shown.refresh_from_db()
    assert shown.token_holders == [leaver.pk, owner.pk] and shown.token_voided_at is None


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# --- In process: the audit, the page, the notice, the holders ------------------------------


@pytest.mark.django_db
def test_the_void_is_audited_in_the_leavers_name_and_listed_on_their_deactivation() -> None:
    leaver, stays, owner = people()
    shown, token = agent_shown_to(owner, leaver)
    kept, _ = agent_shown_to(owner, stays)
    assert roles.deactivate(user=leaver, actor="user:root")
    voided = AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{shown.pk}")
    assert voided.actor == "user:root"
    assert voided.payload["because"] == leaver.username
    assert voided.payload["owner"] == owner.username
    assert voided.payload["token_prefix"] == shown.token_prefix
    assert not AuditEvent.objects.filter(kind="agent.token_voided", subject=f"agent:{kept.pk}")
    event = AuditEvent.objects.get(kind="user.deactivated", subject=f"user:{leaver.username}")
    assert event.payload["agent_tokens_voided"] == [shown.name]
    assert agents.authenticate_token(token) is None
    shown.refresh_from_db()
    assert shown.is_active and shown.token_voided_because == leaver.username


@pytest.mark.django_db
def test_an_agent_handed_to_a_sponsor_still_loses_the_token_its_owner_was_shown() -> None:
    """The leaver owned the agent and was shown its token: handed to a sponsor, the agent
    is the sponsor's, but the token in the leaver's hands stops."""
    leaver, sponsor, _ = people()
    agent, token = agent_shown_to(leaver, leaver)
    assert roles.deactivate(user=leaver, actor="user:root", sponsor=sponsor)
    agent.refresh_from_db()
    assert agent.owner == sponsor and agent.is_active
    response = Client().get("/api/v1/tools", headers=bearer(token))
    assert response.status_code == 401 and VOIDED in response.json()["error"]["message"]


@pytest.mark.django_db
def test_the_agents_page_says_whose_leaving_voided_it_until_rotated() -> None:
    leaver, _, owner = people()
    shown, _ = agent_shown_to(owner, leaver)
    assert roles.deactivate(user=leaver, actor="user:root")
    client = Client()
    client.force_login(owner)
    page = client.get(f"/agents/{shown.pk}/").content.decode()
    assert "Token voided on" in page and f"because {leaver.username} left" in page
    assert "token voided" in client.get("/agents/").content.decode()
    rotated = client.post(f"/agents/{shown.pk}/rotate")
    assert rotated.status_code == 200
    body = rotated.content.decode()
    assert "copy it now" in body and "Token voided on" not in body
    shown.refresh_from_db()
    assert shown.token_holders == [leaver.pk, owner.pk]  # still behind their calls (rtpeople)
    assert "Token voided on" not in client.get(f"/agents/{shown.pk}/").content.decode()
    rotation = AuditEvent.objects.get(kind="agent.token_rotated", subject=f"agent:{shown.pk}")
    assert rotation.payload["voided_because"] == leaver.username


@pytest.mark.django_db
def test_the_owner_is_told_by_email_and_webhooks_hear_of_it(settings: Any) -> None:
    from identity import notify

    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]
    leaver, _, owner = people()
    owner.email = f"{owner.username}@example.test"
    owner.save()
    shown, _ = agent_shown_to(owner, leaver)
    assert roles.deactivate(user=leaver, actor="user:root")
    event = AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{shown.pk}")
    with (
        receivers.smtp_server() as mailbox,
        receivers.mailers_for(mailbox),
        receivers.webhook_receiver(SECRET) as server,
    ):
        channel("email", {"addresses": ["ops@example.test"]})
        channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        assert len(notify.notify_token_voided(event.pk)) == 2
        hook = server.wait_for(1)[0].json()
    assert hook["event"] == "agent.token_voided" and hook["because"] == leaver.username
    assert hook["name"] == shown.name and hook["owner"] == owner.username
    [message] = mailbox.messages
    assert mailbox.envelopes == [[owner.email]]  # the owner, not the channel's list
    payload: Any = message.get_payload(decode=True)
    text = payload.decode()
    assert shown.name in text and f"because {leaver.username}" in text and "rotate" in text


@pytest.mark.django_db
def test_no_token_is_shown_to_a_deactivated_person() -> None:
    """A rotation (or a new agent) for someone deactivated meanwhile is refused: the token
    would be theirs after their token was voided."""
    leaver, _, owner = people()
    shown, _ = agent_shown_to(owner, owner)
    assert roles.deactivate(user=leaver, actor="user:root")
    with pytest.raises(ServiceError, match="is deactivated"):
        agents.rotate_token(agent=shown, actor="t", shown_to=leaver)
    with pytest.raises(ServiceError, match="is deactivated"):
        agent_shown_to(owner, leaver)


@pytest.mark.django_db
def test_a_call_waiting_for_a_reviewer_when_the_token_is_voided_is_cancelled() -> None:
    """The token's holders are indistinguishable to Harness: a call asked just before the
    leaver left could be theirs, so it is not left for a reviewer to approve and run as
    the agent. The agent's model reads why; a call of an agent the leaver never held
    still waits."""
    from dispatcher.models import Status
    from tests.support.factories import submit_one

    leaver, stays, owner = people()
    shown, _ = agent_shown_to(owner, leaver)
    kept, _ = agent_shown_to(owner, stays)
    asked = submit_one(
        agents.start_session(agent=shown), "write_file", {"path": "a", "content": "x"}
    )
    other = submit_one(
        agents.start_session(agent=kept), "write_file", {"path": "a", "content": "x"}
    )
    assert asked.status == other.status == Status.PENDING_APPROVAL
    assert roles.deactivate(user=leaver, actor="user:root")
    asked.refresh_from_db()
    other.refresh_from_db()
    assert asked.status == Status.CANCELLED
    assert (
        "token was voided" in asked.content and "resend it" in asked.content
    )  # the model reads it
    assert other.status == Status.PENDING_APPROVAL
    cancelled = AuditEvent.objects.get(kind="call.cancelled", subject=f"call:{asked.pk}")
    assert leaver.username in json.dumps(cancelled.payload)


@pytest.mark.django_db
def test_the_slack_notice_escapes_the_names_it_carries(settings: Any) -> None:
    """An agent's name (any text a dashboard admin typed) reaches Slack's mrkdwn: before,
    unescaped, `<!channel>` pinged the whole channel and `<https://…|…>` made a link the
    notice never meant. Now it reads as the text it is, as every other Slack message of
    Harness reads an agent's words (messages.slack_escape)."""
    from identity import notify

    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]
    leaver, _, owner = people()
    shown, _ = agents.create_agent(
        owner=owner,
        name=f"<!channel> <https://evil.example/rotate|rotate here> {unique('a')}",
        actor="t",
        shown_to=leaver,
    )
    assert roles.deactivate(user=leaver, actor="user:root")
    event = AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{shown.pk}")
    with receivers.fake_slack() as slack:
        channel("slack", {"webhook_url": slack.url + "/services/hook"})
        assert len(notify.notify_token_voided(event.pk)) == 1
        text = slack.wait_for(1)[0].json()["text"]
    assert "<!channel>" not in text and "<https://" not in text
    assert "&lt;!channel&gt; &lt;https://evil.example/rotate|rotate here&gt;" in text
